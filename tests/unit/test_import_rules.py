"""The import rules docs/ARCHITECTURE.md states that are not about imports between modules.

The layers, the forbidden imports (the product never imports the local
environment; nothing imports the CLIs; the CNI programs and the local
environment never import the agent's runtime; components never import the
composition layer nor the environment's readers; `config/` imports no
component) and the cycles are import-linter contracts (`[tool.importlinter]`
in pyproject.toml, `make lint`, and tests/unit/test_import_graph.py). What
stays here reads the source as text.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "istio_agent"
LOCAL_SRC = ROOT / "istiod-local" / "src" / "istiod_local"


def sources(package: str = "", root: Path = SRC) -> list[Path]:
    base = root / package if package else root
    found = sorted(p for p in base.rglob("*.py") if not p.name.endswith(("_pb2.py", "_pb2_grpc.py")))
    assert found, f"no sources under {base}"
    return found


def test_the_environment_is_read_only_in_config_and_cli() -> None:
    """`os.environ` / `getenv` appear elsewhere only to build a child's environment or in the demo workloads."""
    allowed = {"node/local_node.py", "capture/procs.py", "envoy/process.py", "node/echo_app.py", "node/grpc_apps.py",
               "cni/plugin/main.py"}  # the CNI protocol is the environment: the plugin's edge reads it
    readers = []
    for path in sources():
        relative = path.relative_to(SRC).as_posix()
        if relative.split("/")[0] in ("config", "cli") or relative in allowed:
            continue
        text = path.read_text()
        if "os.environ" in text or "getenv(" in text:
            readers.append(relative)
    assert readers == []


def test_the_architecture_document_names_every_package_and_top_level_module() -> None:
    """Every package and sub-package of both packages by its path (`cni/install/`), and the product's top-level
    modules, appear in docs/ARCHITECTURE.md."""
    text = (SRC.parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    names = []
    for root in (SRC, LOCAL_SRC):
        names += [p.parent.relative_to(root).as_posix() + "/" for p in root.rglob("*/__init__.py")]
    names += [p.name for p in SRC.glob("*.py") if p.name != "__init__.py"]
    assert [name for name in sorted(names) if f"`{name}`" not in text] == []

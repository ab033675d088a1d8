"""The import rules docs/ARCHITECTURE.md states, checked on the source (statically, every import counted,
lazy ones inside functions too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "istio_agent"
LOCAL_SRC = ROOT / "istiod-local" / "src" / "istiod_local"
AGENT_RUNTIME = ("istio_agent.agent", "istio_agent.assembly", "istio_agent.security", "istio_agent.xds",
                 "istio_agent.envoy", "istio_agent.dns", "istio_agent.status", "istio_agent.grpcxds",
                 "istio_agent.health")
COMPONENTS = ("security", "xds", "envoy", "dns", "status", "grpcxds", "health")
ENVIRONMENT_READERS = ("istio_agent.config.env", "istio_agent.config.envvar", "istio_agent.config.loader",
                       "istio_agent.config.options")


def module_name(path: Path) -> str:
    base = LOCAL_SRC.parent if path.is_relative_to(LOCAL_SRC) else SRC.parent
    parts = path.relative_to(base).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.startswith(("istio_agent", "istiod_local"))}


def sources(package: str = "", root: Path = SRC) -> list[Path]:
    base = root / package if package else root
    found = sorted(p for p in base.rglob("*.py") if not p.name.endswith(("_pb2.py", "_pb2_grpc.py")))
    assert found, f"no sources under {base}"
    return found


def test_the_product_never_imports_the_local_environment() -> None:
    assert offending(sources(), ("istiod_local",)) == []


def offending(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for path in paths:
        for name in imports(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                out.append(f"{module_name(path)} imports {name}")
    return sorted(out)


def test_nothing_imports_the_clis() -> None:
    outside = [p for p in sources() if "cli" not in p.relative_to(SRC).parts]
    assert offending(outside, ("istio_agent.cli",)) == []


@pytest.mark.parametrize("package", ["capture", "cni", "kube", "pki", "protos"])
def test_separate_programs_and_plain_libraries_never_import_the_agent_runtime(package: str) -> None:
    assert offending(sources(package), AGENT_RUNTIME) == []


def test_the_local_environment_never_imports_the_agent_runtime() -> None:
    """istiod-local and the node run the agent as a program (`pilot-agent` in a pod), never in-process."""
    assert offending(sources(root=LOCAL_SRC), AGENT_RUNTIME) == []


@pytest.mark.parametrize("package", COMPONENTS)
def test_components_never_read_the_environment_nor_resolve_options(package: str) -> None:
    """Components get their options passed in; only config/ (the resolver) and cli/ read the environment."""
    assert offending(sources(package), (*ENVIRONMENT_READERS, "istio_agent.agent", "istio_agent.assembly")) == []


def test_config_imports_only_option_modules_of_the_components() -> None:
    """The resolver may import what components take (their options and the pure rules those need), no runtime."""
    runtime = ("istio_agent.security.cache", "istio_agent.security.identity", "istio_agent.security.sds",
               "istio_agent.security.ca_client", "istio_agent.xds.proxy", "istio_agent.dns.proxy",
               "istio_agent.status.server", "istio_agent.status.metrics_handler", "istio_agent.envoy.supervisor",
               "istio_agent.envoy.process", "istio_agent.health.runner", "istio_agent.health.probers",
               "istio_agent.agent", "istio_agent.assembly")
    assert offending(sources("config"), runtime) == []


def test_only_the_resolver_and_the_table_look_outside_config() -> None:
    others = [p for p in sources("config") if p.name not in ("options.py", "envtable.py")]
    inside = ("istio_agent.config", "istio_agent.version")
    out = [f"{module_name(p)} imports {n}" for p in others for n in imports(p)
           if not any(n == i or n.startswith(i + ".") for i in inside)]
    assert out == []


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
    text = (SRC.parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    packages = [p.parent.name + "/" for p in SRC.glob("*/__init__.py")]
    modules = [p.name for p in SRC.glob("*.py") if p.name != "__init__.py"]
    assert [name for name in sorted(packages + modules) if f"`{name}`" not in text] == []

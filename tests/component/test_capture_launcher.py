"""The lean `istio-iptables` launcher against pip's console script: the same tool, without site.

The launcher (`python -m istio_agent.cli.iptables_launcher DEST`) is what istio-init's
per-pod start-up is measured with (benchmarks/bench_capture.py). Both executables are run
with the same arguments and environment, and must answer byte for byte alike: dry-run
recordings (to stdout and to DRY_RUN_FILE_PATH), help, a bad flag, an invalid value, the
environment's settings; with its bundle of compiled modules, a broken one, or none. Then what
the lean path loads (not even `os`), and that the bundle serves all of it that is ours unless
a module's source changed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from istio_agent.cli.iptables_launcher import bundle_path, console_script, import_paths, main, render

DEFAULTS = ["-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*",
            "-d", "15090,15021,15020"]
PINNED = ["--enable-ipv6=false", "--dns-servers=10.96.0.10"]


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pip's console script (`make setup` replaces the installed one with the launcher)."""
    return console_script(tmp_path_factory.mktemp("iptables-console") / "istio-iptables")


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("iptables-launcher") / "istio-iptables"
    assert main([str(path)]) == 0
    assert path.stat().st_mode & 0o777 == 0o755
    return path


def run(executable: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(executable), *args], capture_output=True, timeout=60, check=False,
                          env={"PATH": os.environ.get("PATH", ""), **env})


@pytest.mark.parametrize("args, env", [
    ([*DEFAULTS, "-n", *PINNED], {}),
    ([*DEFAULTS, "--dry-run", *PINNED, "--redirect-dns", "--drop-invalid"], {"ISTIO_META_DNS_CAPTURE": "true"}),
    (["-p", "15001", "-u", "1337", "-m", "TPROXY", "-b", "80,443", "-n", "--enable-ipv6=true", "--dual-stack",
      "--dns-servers=10.96.0.10,fd00::10"], {"ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": "java"}),
    ([*DEFAULTS, "-n", *PINNED, "--native-nftables"], {}),
    ([*DEFAULTS, "-n", *PINNED, "--cleanup-only"], {}),
    (["--help"], {}),
    (["--no-such-flag"], {}),
    ([*DEFAULTS, "-n", *PINNED, "-p", "15001 -j ACCEPT"], {}),
    ([*DEFAULTS, "-n", *PINNED], {"REDIRECT_DNS": "maybe"}),
])
def test_the_launcher_answers_as_the_console_script(launcher: Path, console: Path, args: list[str],
                                                    env: dict[str, str]) -> None:
    lean, reference = run(launcher, args, env), run(console, args, env)
    assert (lean.returncode, lean.stdout, lean.stderr) == (reference.returncode, reference.stdout, reference.stderr)
    assert reference.stdout or reference.stderr  # each case says something


def test_the_launcher_writes_the_dry_run_recording_as_the_console_script(launcher: Path, console: Path,
                                                                         tmp_path: Path) -> None:
    for name, executable in (("lean", launcher), ("console", console)):
        done = run(executable, [*DEFAULTS, "-n", *PINNED], {"DRY_RUN_FILE_PATH": str(tmp_path / name)})
        assert done.returncode == 0, done.stderr
    recorded = (tmp_path / "lean").read_text()
    assert "-A ISTIO_OUTPUT" in recorded and recorded == (tmp_path / "console").read_text()


LEAN_PATH_PROBE = """
import io, sys
sys.path += PATHS
before = set(sys.modules)
from istio_agent.cli.iptables import run_cli
args = ['-p', '15001', '-u', '1337', '-i', '*', '-b', '*', '-n', '--dns-servers=1.1.1.1']
assert run_cli(args, {'ISTIO_META_DNS_CAPTURE': 'true'}, io.StringIO(), io.StringIO()) == 0
import istio_agent.capture.apply, istio_agent.capture.netns, _ctypes
print(' '.join(sorted(set(sys.modules) - before)))
"""


def test_the_lean_path_loads_only_what_it_needs() -> None:
    """Under -IS the apply path (flags, facts, rules, the restore runner, setns) loads no `os` either."""
    probe = LEAN_PATH_PROBE.replace("PATHS", repr(import_paths()))
    done = subprocess.run([sys.executable, "-IS", "-c", probe], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert "istio_agent.capture.apply" in loaded and "istio_agent.capture.procs" in loaded
    heavy = {"os", "click", "asyncio", "subprocess", "dataclasses", "typing", "enum", "re", "ipaddress", "json",
             "ctypes", "google.protobuf", "argparse", "socket"}
    assert not loaded & heavy, loaded & heavy


def test_the_launcher_writes_its_bundle_beside_it(launcher: Path) -> None:
    bundle = bundle_path(launcher)
    assert bundle.parent == launcher.parent / "__pycache__"
    assert bundle.read_bytes()[:4] == importlib.util.MAGIC_NUMBER
    assert repr(str(bundle)) in launcher.read_text()


@pytest.mark.parametrize("damage", ["missing", "garbage", "truncated", "other-python"])
def test_without_a_usable_bundle_the_launcher_answers_alike(tmp_path: Path, console: Path, damage: str) -> None:
    launcher = tmp_path / "istio-iptables"
    assert main([str(launcher)]) == 0
    bundle = bundle_path(launcher)
    data = bundle.read_bytes()
    if damage == "missing":
        bundle.unlink()
    else:
        bundle.write_bytes({"garbage": b"\x00" * 64, "truncated": data[: len(data) // 2],
                            "other-python": b"\x00\x00\r\n" + data[4:]}[damage])
    for args, env in [([*DEFAULTS, "-n", *PINNED], {}), (["--no-such-flag"], {}), ([*DEFAULTS, "-n", *PINNED],
                                                                                    {"REDIRECT_DNS": "maybe"})]:
        lean, reference = run(launcher, args, env), run(console, args, env)
        assert (lean.returncode, lean.stdout, lean.stderr) == (reference.returncode, reference.stdout,
                                                               reference.stderr)


BUNDLE_PROBE = """
import io
from istio_agent.cli.iptables import run_cli
args = ['-p', '15001', '-u', '1337', '-i', '*', '-b', '*', '-n', '--dns-servers=1.1.1.1', '--drop-invalid=true']
assert run_cli(args, {'ISTIO_META_DNS_CAPTURE': 'true'}, io.StringIO(), io.StringIO()) == 0
assert run_cli(args + ['--native-nftables'], {}, io.StringIO(), io.StringIO()) == 0
import istio_agent.capture.apply, istio_agent.capture.netns, istio_agent.capture.loopback, _socket, _ctypes
for name, module in sorted(sys.modules.items()):
    spec = getattr(module, '__spec__', None)
    if spec is not None and spec.origin and spec.origin.endswith('.py'):
        print(name, type(spec.loader).__name__)
walked = [path for path in sys.path_importer_cache if path.endswith('lib-dynload')]
print('walked-lib-dynload', bool(walked))
"""


def test_the_bundle_serves_every_module_of_ours_the_tool_imports(launcher: Path) -> None:
    """The launcher's own text, its entry point replaced by a probe: which finder loaded each module."""
    text = launcher.read_text().replace("from istio_agent.cli.iptables import main\nmain()\n", BUNDLE_PROBE)
    done = subprocess.run([sys.executable, "-IS", "-c", text], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    loaders = dict(line.split() for line in done.stdout.splitlines())
    ours = {name: loader for name, loader in loaders.items() if name.split(".")[0] in ("istio_agent", "__future__")}
    assert "istio_agent.capture.apply" in ours and "__future__" in ours
    assert set(ours.values()) == {"BundleFinder"}, ours
    assert loaders["walked-lib-dynload"] == "False"  # _socket and _ctypes: their files named by the bundle


STALE_PROBE = """
import sys
sys.path.insert(0, ROOT)
from istio_agent.cli.iptables_launcher import build_bundle
with open(BUNDLE, 'wb') as out:
    out.write(build_bundle(['pkg', 'pkg.kept', 'pkg.edited']))
"""


def test_a_module_edited_after_the_bundle_is_imported_from_its_file(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kept.py").write_text("VALUE = 'kept'\n")
    (package / "edited.py").write_text("VALUE = 'old'\n")
    bundle = tmp_path / "pkg.bundle"
    root = str(Path(__file__).resolve().parents[2] / "src")
    env = {"PYTHONPATH": str(tmp_path), "PATH": os.environ.get("PATH", "")}
    probe = STALE_PROBE.replace("ROOT", repr(root)).replace("BUNDLE", repr(str(bundle)))
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60, env=env, cwd=tmp_path)
    (package / "edited.py").write_text("VALUE = 'new!'\n")  # another size: stale whatever the clock says
    launcher = render(sys.executable, [str(tmp_path)], str(bundle)).decode()
    launcher = launcher.replace("from istio_agent.cli.iptables import main\nmain()\n", (
        "import pkg.kept, pkg.edited\n"
        "for m in (pkg.kept, pkg.edited): print(m.VALUE, type(m.__spec__.loader).__name__)\n"))
    done = subprocess.run([sys.executable, "-IS", "-c", launcher], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["kept BundleFinder", "new! SourceFileLoader"]


def test_a_launcher_whose_bundle_cannot_be_written_is_written_without_it(tmp_path: Path, console: Path) -> None:
    launcher = tmp_path / "istio-iptables"
    (tmp_path / "__pycache__").write_text("a file where the bundle's directory would be")
    assert main([str(launcher)]) == 0
    assert "__pycache__" not in launcher.read_text()
    args = [*DEFAULTS, "-n", *PINNED]
    lean, reference = run(launcher, args, {}), run(console, args, {})
    assert (lean.returncode, lean.stdout, lean.stderr) == (reference.returncode, reference.stdout, reference.stderr)


ATTRIBUTES_PROBE = """
import istio_agent.cli.iptables, istio_agent.capture.apply, istio_agent.capture.netns, _socket, __future__
for name in sorted(sys.modules):
    if name.split('.')[0] in ('istio_agent', '__future__', '_socket'):
        module = sys.modules[name]
        spec = module.__spec__
        print(name, module.__file__, getattr(module, '__cached__', None), module.__package__,
              getattr(module, '__path__', None), spec.origin, spec.cached, spec.parent, spec.has_location,
              spec.submodule_search_locations)
"""


def test_bundled_modules_carry_the_attributes_the_path_finder_gives(launcher: Path) -> None:
    text = launcher.read_text()
    plain = text[: text.index("try:  # the compiled modules")] + ATTRIBUTES_PROBE
    bundled = text.replace("from istio_agent.cli.iptables import main\nmain()\n", ATTRIBUTES_PROBE)
    answers = [subprocess.run([sys.executable, "-IS", "-c", probe], capture_output=True, text=True, timeout=60,
                              check=True).stdout for probe in (plain, bundled)]
    assert "istio_agent.capture.apply" in answers[0] and answers[0] == answers[1]


def test_a_launcher_for_another_interpreter_gets_no_bundle(tmp_path: Path) -> None:
    """The bundle holds this Python's code and extension paths: another build of 3.11 would pass its check."""
    launcher = tmp_path / "istio-iptables"
    assert main(["--interpreter", "/opt/another-python/bin/python3", str(launcher)]) == 0
    assert launcher.read_text().startswith("#!/opt/another-python/bin/python3 -IS")
    assert "__pycache__" not in launcher.read_text() and not bundle_path(launcher).exists()

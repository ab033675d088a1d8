"""The lean `istio-iptables` launcher against pip's console script: the same tool, without site.

The launcher (`python -m istio_agent.cli.iptables_launcher DEST`) is what istio-init's
per-pod start-up is measured with (benchmarks/bench_capture.py). Both executables are run
with the same arguments and environment, and must answer byte for byte alike: dry-run
recordings (to stdout and to DRY_RUN_FILE_PATH), help, a bad flag, an invalid value, the
environment's settings. Then what the lean path loads: not even `os`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from istio_agent.cli.iptables_launcher import console_script, import_paths, main

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

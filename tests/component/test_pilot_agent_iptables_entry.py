"""`pilot-agent istio-iptables` (istio-init's command in Istio's injection template) without click.

The console entry (`cli/pilot_agent_entry.py`) hands `istio-iptables` to the light CLI before click
and the agent's modules load; it must answer byte for byte as the click group's subcommand does
(`python -m istio_agent.cli.pilot_agent istio-iptables ...`), and other commands still reach the group.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

ENTRY = "import sys; from istio_agent.cli.pilot_agent_entry import main; sys.argv = ['pilot-agent', *ARGS]; main()"
DRY_RUN = ["istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-b", "*",
           "-d", "15090,15021,15020", "-n", "--enable-ipv6=false", "--dns-servers=10.96.0.10"]


def _entry(args: list[str], *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *flags, "-c", ENTRY.replace("ARGS", repr(args))],
                          capture_output=True, text=True, timeout=60, check=False)


def _group(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "istio_agent.cli.pilot_agent", *args],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("args", [
    DRY_RUN,
    [*DRY_RUN, "--redirect-dns", "--drop-invalid"],
    ["istio-iptables", "--help"],
    ["istio-iptables", "--no-such-flag"],
    [*DRY_RUN, "-p", "15001 -j ACCEPT"],
])
def test_the_entry_answers_as_the_click_subcommand(args: list[str]) -> None:
    fast, reference = _entry(args), _group(args)
    assert (fast.returncode, fast.stdout, fast.stderr) == (reference.returncode, reference.stdout, reference.stderr)
    assert reference.stdout or reference.stderr


def test_istio_iptables_loads_no_click_and_other_commands_reach_the_group() -> None:
    traced = _entry(DRY_RUN, "-X", "importtime")
    assert traced.returncode == 0, traced.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in traced.stderr.splitlines() if "import time:" in line}
    assert "istio_agent.capture.rules" in imported or "istio_agent.cli.iptables" in imported
    assert not {"click", "istio_agent.cli.pilot_agent", "asyncio", "grpc"} & imported
    version = _entry(["version", "-s"])
    assert version.returncode == 0 and version.stdout.strip() == _group(["version", "-s"]).stdout.strip()

"""`make run` (`python -m istio_agent.localmesh`) as a user runs it (root).

`--once` must prove client → echo over mTLS and exit 0; Ctrl-C must remove
everything; and after the runner is SIGKILLed (no cleanup at all) its pods'
processes must die with it and the next node must sweep its namespaces.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from needs import need_root, need_tool
from support import ROOT, LineCollector, open_workdir, poll, stop_process

from istio_agent.node.local_node import sweep_stale_runs
from istio_agent.node.processes import netns_pids, pid_alive
from istio_agent.node.runtime import RUNTIME_ROOT


@pytest.fixture
def run_dir() -> Iterator[Path]:
    need_root()
    for tool in ("ip", "setpriv", "iptables"):
        need_tool(tool)
    with open_workdir("ia-localmesh-") as base:
        yield base


def _ours(pid: int) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"ia-{pid}-")]


def _start(run_dir: Path, *args: str) -> tuple[subprocess.Popen[str], LineCollector]:
    proc = subprocess.Popen([sys.executable, "-m", "istio_agent.localmesh", "--dir", str(run_dir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    return proc, LineCollector(proc.stdout)


def _read_until(proc: subprocess.Popen[str], out: LineCollector, marker: str, timeout: float = 90.0) -> None:
    """Wait for a line containing `marker` (fails with everything read if it never comes)."""
    def seen() -> bool:
        if any(marker in line for line in list(out.lines)):
            return True
        if proc.poll() is not None:
            out.join(5)
            raise AssertionError(f"the runner exited with {proc.returncode} before {marker!r}:\n{out.text()}")
        return False

    poll(seen, f"{marker!r} in the runner's output", timeout, out.text)


def _log_tails(run_dir: Path, lines: int = 15) -> str:
    """The last lines of every node log (what was still running, and why), for a failure message."""
    parts = []
    for log in sorted((run_dir / "node" / "logs").glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {log.name}\n" + "\n".join(tail))
    return "\n".join(parts)


def _stop(proc: subprocess.Popen[str], out: LineCollector) -> None:
    stop_process(proc)
    out.join(5)
    if proc.stdout is not None:
        proc.stdout.close()


def test_once_shows_the_request_crossing_both_sidecars_and_leaves_nothing(run_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "istio_agent.localmesh", "--dir", str(run_dir), "--once"],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "served by echo-1" in out
    assert "x-forwarded-client-cert: By=spiffe://cluster.local/ns/default/sa/echo" in out
    assert "URI=spiffe://cluster.local/ns/default/sa/sleep" in out
    assert "client Envoy: TLS handshakes on outbound|80||echo.default.svc.cluster.local: 0" not in out
    assert "mTLS between the sidecars" in out
    assert not (run_dir / "node" / "pods").exists()
    pod_dirs = [Path(line.rpartition(" directory ")[2]) for line in out.splitlines() if line.startswith("pod ")]
    assert len(pod_dirs) == 2 and all(d.is_relative_to(RUNTIME_ROOT) for d in pod_dirs), out
    assert not [d for d in pod_dirs if d.parent.parent.exists()]  # the runtime directory (pods, sockets) removed
    assert (run_dir / "istiod" / "root-cert.pem").exists()  # the mesh root is kept for the next run
    assert (run_dir / "node" / "logs" / "echo-1-agent.log").exists()


def test_ctrl_c_stops_every_process_and_removes_every_namespace(run_dir: Path) -> None:
    proc, out = _start(run_dir)
    try:
        _read_until(proc, out, "Ctrl-C stops everything")
        names = _ours(proc.pid)
        assert len(names) == 3, names  # node, client-1, echo-1
        pids = [pid for name in names for pid in netns_pids(name)]
        assert pids
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the runner did not finish its cleanup within 120 s of Ctrl-C:\n{out.text()}\n"
                                 f"{_log_tails(run_dir)}") from None
        out.join(10)
        assert proc.returncode == 0, out.text()
        assert "removed the node's namespaces" in out.text()
    finally:
        _stop(proc, out)
    assert _ours(proc.pid) == []
    assert not [pid for pid in pids if pid_alive(pid)]
    assert not (RUNTIME_ROOT / f"{proc.pid}-0").exists()


def test_after_sigkill_the_pods_die_with_the_runner_and_the_next_node_sweeps_its_namespaces(run_dir: Path) -> None:
    proc, out = _start(run_dir)
    try:
        _read_until(proc, out, "Ctrl-C stops everything")
        names = _ours(proc.pid)
        pids = [pid for name in names for pid in netns_pids(name)]
        assert (RUNTIME_ROOT / f"{proc.pid}-0" / "pods" / "echo-1").is_dir()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # setpriv --pdeathsig takes them down
        poll(lambda: not [pid for pid in pids if pid_alive(pid)], "the pods' processes to die with the runner", 30,
             lambda: f"alive: {[pid for pid in pids if pid_alive(pid)]}")
        # Only the namespaces and the runtime directory are left, until a later node sweeps them
        # (a concurrent run on this machine may do it first: the end state is the same).
        assert set(_ours(proc.pid)) <= set(names)
        sweep_stale_runs()
        assert _ours(proc.pid) == []
        assert not (RUNTIME_ROOT / f"{proc.pid}-0").exists()
    finally:
        _stop(proc, out)
        for name in _ours(proc.pid):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        shutil.rmtree(RUNTIME_ROOT / f"{proc.pid}-0", ignore_errors=True)

"""Processes and namespaces of the local node: the I/O edge under `LocalNode`.

Each process runs inside a network namespace through `ip netns exec` (which
execs, so the pid we hold is the program's own), writes its output to a log
file, and is stopped with SIGTERM, then SIGKILL after a grace period. Because
everything the node starts lives in one of its namespaces, `ip netns pids`
finds every leftover, including grandchildren such as Envoy, which is what
teardown relies on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from istiod_local.node.plan import netns_delete_command, parse_netns_list, stale_namespaces


class NodeError(RuntimeError):
    """Building or running the node failed; the message says which step and why."""


def run_ip(argv: Sequence[str], timeout: float = 30.0) -> str:
    """Run one `ip` (or other setup) command; NodeError with its stderr when it fails."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NodeError(f"{' '.join(argv)}: {exc}") from None
    if done.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def list_netns() -> list[str]:
    return parse_netns_list(run_ip(["ip", "netns", "list"]))


def netns_pids(netns: str) -> list[int]:
    """Pids of every process whose network namespace is `netns` (empty when it is gone)."""
    try:
        done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(word) for word in done.stdout.split() if word.isdigit()]


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def kill_pids(pids: Iterable[int], grace: float) -> None:
    """SIGTERM, wait up to `grace` seconds, SIGKILL whatever is left, and wait until it is gone."""
    pending = [pid for pid in pids if pid != os.getpid()]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in pending:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pending and time.monotonic() < deadline:
            pending = [pid for pid in pending if pid_alive(pid)]
            if pending:
                time.sleep(0.02)
        if not pending:
            return


def remove_netns(netns: str, grace: float = 2.0) -> None:
    """Kill every process in `netns`, then delete it (its interfaces and rules go with it)."""
    kill_pids(netns_pids(netns), grace)
    with contextlib.suppress(NodeError):
        run_ip(netns_delete_command(netns))


def sweep_stale_namespaces() -> list[str]:
    """Delete namespaces (and kill their processes) left by node owners that no longer run."""
    stale = stale_namespaces(list_netns(), pid_alive, os.getpid())
    for name in stale:
        remove_netns(name)
    return stale


@dataclass
class NetnsProcess:
    """A program running in one of the node's namespaces, with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def describe_exit(self) -> str:
        return f"{self.name} exited with {self.popen.returncode}; last log lines:\n{tail(self.log_path)}"

    def signal(self, sig: int) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float) -> int:
        """SIGTERM, then SIGKILL after `grace` seconds; returns the exit code."""
        self.signal(signal.SIGTERM)
        code = self.wait(grace)
        if code is None:
            self.signal(signal.SIGKILL)
            code = self.popen.wait()
        return code


def spawn(name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
          cwd: Path | None = None, umask: int = -1) -> NetnsProcess:
    """Start `argv` (already wrapped by `in_netns`) with stdout and stderr appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        try:
            popen = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
                                     umask=umask)
        except OSError as exc:
            raise NodeError(f"starting {name}: {exc}") from None
    return NetnsProcess(name, popen, log_path)


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def wait_for(check_argv: Sequence[str], what: str, timeout: float, watch: Sequence[NetnsProcess]) -> None:
    """Run a waiting command (it polls on its own until ready or its timeout) while watching `watch`.

    One waiter process instead of one process per attempt; if a watched process dies
    first, fail at once with its log rather than waiting out the timeout.
    """
    waiter = subprocess.Popen(list(check_argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while True:
            code = waiter.poll()
            if code == 0:
                return
            for proc in watch:
                if not proc.running():
                    raise NodeError(f"while waiting for {what}: {proc.describe_exit()}")
            if code is not None or time.monotonic() > deadline:
                output = waiter.stdout.read().decode(errors="replace") if waiter.stdout else ""
                raise NodeError(f"timed out after {timeout:.0f}s waiting for {what}: {output.strip()[-500:]}")
            time.sleep(0.05)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        waiter.wait()
        if waiter.stdout:
            waiter.stdout.close()

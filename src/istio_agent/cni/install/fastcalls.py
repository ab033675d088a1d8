"""One call on install-cni's fast path (`fastpath.py`): its request read, the plugin run, its deadline, and
the answers given for it when the plugin gives none.

- `read_request` reads one whole request within `READ_TIMEOUT` (FrameError as soon as the bytes cannot be one);
- `run_call` is the plugin's own invocation (`plugin.main.handle`) with the call's `get` and `sleep`;
- `call_deadline` is how long a call may take: every retry's whole GET (`GET_TIMEOUT`, the bound
  `KeepAliveClient` puts on each) and interval, plus slack for the capture;
- `Call` is a call in flight: exactly one of its thread, the deadline watch and stop claims it and
  answers it; once another side did, `cancel` makes the thread stop at its next retry (its `sleep` and
  its next GET raise `Abandoned`), so an abandoned call never runs another GET or retry;
- `late_answer` is the error 11 the watch gives for a call past its deadline.
"""

from __future__ import annotations

import io
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from istio_agent.cni.install import fastwire

READ_TIMEOUT = 10.0  # seconds for the whole request to arrive
DEADLINE_SLACK = 60.0  # seconds beyond the retries' worst case (iptables-restore waiting for the xtables lock)
GET_TIMEOUT = 5.0  # seconds for one whole pod GET
_RECV = 1 << 18

GetPod = Callable[[str, str, str], dict[str, object]]


@dataclass(frozen=True)
class CallResult:
    """One call's answer and what to log of it."""

    code: int
    stdout: bytes
    stderr: bytes
    entries: tuple[str, ...]  # the plugin's log entries (JSON), when it would have posted them


def call_deadline(env: dict[str, str]) -> float:
    """Seconds a call may take: every retry's GET timeout and interval, plus slack (pure)."""
    from istio_agent.cni.plugin.add import retry_settings
    from istio_agent.cni.plugin.protocol import CniError

    try:
        retries, interval = retry_settings(env)
    except (CniError, ValueError):
        return DEADLINE_SLACK  # the plugin fails at once with code 4
    return retries * (interval + GET_TIMEOUT) + DEADLINE_SLACK


def run_call(env: dict[str, str], stdin: bytes, get: GetPod, sleep: Callable[[float], None] = time.sleep) -> CallResult:
    """The plugin's invocation, as the in-process plugin runs it (blocking: call it on a thread of its own)."""
    from istio_agent.cni.plugin.log import PluginLog
    from istio_agent.cni.plugin.main import handle

    stderr = io.StringIO()
    plugin_log = PluginLog(stderr=stderr)
    outcome = handle(env, stdin, plugin_log, sleep=sleep, get=get)
    if outcome.log_file:  # the file the plugin in its own process would have written (its socket is ours)
        from istio_agent.cni.plugin.main import write_log_file

        write_log_file(outcome.log_file, plugin_log.file_entries)
    entries = tuple(plugin_log.entries) if outcome.socket_path else ()
    return CallResult(outcome.code, outcome.stdout, stderr.getvalue().encode(), entries)


def peer_uid(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a unix socket."""
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))
    return pid, uid


def thread_netns() -> tuple[int, int]:
    """The calling thread's network namespace (device, inode)."""
    info = os.stat("/proc/thread-self/ns/net")
    return info.st_dev, info.st_ino


def read_request(conn: socket.socket, timeout: float = READ_TIMEOUT) -> bytes:
    """One whole request from `conn` within `timeout` seconds (FrameError, TimeoutError, ConnectionError)."""
    end = time.monotonic() + timeout
    data = b""
    while len(data) < (size := fastwire.request_size(data)):
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        conn.settimeout(left)
        chunk = conn.recv(min(_RECV, size - len(data)))
        if not chunk:
            raise ConnectionError("the caller closed the connection before its request was whole")
        data += chunk
    return data


class Abandoned(BaseException):
    """Raised in a call's thread when the deadline watch (or stop) has answered it: the thread stops there.

    A BaseException, so that the plugin's retry loop and its catch-all do not take it for an API error.
    """


class Call:
    """One call in flight: whichever of its thread, the deadline watch and stop claims it first answers it."""

    __slots__ = ("_cancelled", "_claimed", "_lock", "command", "conn", "container", "deadline", "limit", "stdin")

    def __init__(self, conn: socket.socket, env: dict[str, str], stdin: bytes, started: float, limit: float) -> None:
        self.conn = conn
        self.command = env.get("CNI_COMMAND", "")
        self.container = env.get("CNI_CONTAINERID", "")
        self.stdin = stdin
        self.limit = limit  # seconds (`call_deadline`)
        self.deadline = started + limit  # time.monotonic() after which the watch answers
        self._lock = threading.Lock()
        self._claimed = False
        self._cancelled = threading.Event()

    def claim(self) -> bool:
        with self._lock:
            if self._claimed:
                return False
            self._claimed = True
            return True

    def cancel(self) -> None:
        """Answered by another side: the call's thread stops at its next sleep or GET."""
        self._cancelled.set()

    def sleep(self, seconds: float) -> None:
        """The retry interval, cut short (with `Abandoned`) when the call was answered meanwhile."""
        if self._cancelled.wait(seconds):
            raise Abandoned

    def guard(self, get: GetPod) -> GetPod:
        """`get`, refusing to start another GET once the call was answered."""
        def guarded(kubeconfig: str, namespace: str, name: str) -> dict[str, object]:
            if self._cancelled.is_set():
                raise Abandoned
            return get(kubeconfig, namespace, name)
        return guarded


def late_answer(command: str, container: str, deadline: float, stdin: bytes, why: str = "") -> CallResult:
    """Error 11 for a call the plugin gave no answer to: past its deadline, or failed on a bug (`why`)."""
    from istio_agent.cni.plugin.protocol import ERR_TRY_AGAIN_LATER, CniError, error_result, error_version

    message = why or f"the node agent did not finish {command} for container {container} within {deadline:.0f} s"
    body = error_result(CniError(ERR_TRY_AGAIN_LATER, f"istio-cni: {message}"), error_version(stdin))
    return CallResult(1, body, b"", ())

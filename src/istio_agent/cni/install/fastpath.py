"""install-cni's fast path for the `istio-cni` launcher (not upstream): one CNI call per connection on
`<cni-agent-run-dir>/sidecar-add.sock`, answered by the plugin's own code in this warm process.

Upstream's ambient mode has the same shape (its plugin hands ADD to the node agent over
`pluginevent.sock`); here it is sidecar mode's ADD (and every other command the launcher sends).

- Trust: the socket is made 0600 (root's, as install-cni runs as root) and each caller is checked with
  SO_PEERCRED: only uid 0 is served, as only the container runtime execs CNI plugins. Another caller
  gets a refusal (`fastwire.REFUSED`) and its launcher runs the plugin in-process, with its own rights.
  So does a call whose CNI_NETNS this process cannot see (install-cni in a container without the node's
  netns directory): the plugin on the node can enter it.
- The call is `plugin.main.handle`, the function the in-process plugin runs, with the caller's forwarded
  environment (`fastwire.forwarded`: CNI_*, ISTIO_*, ENVOY_USER; so the pod-retrieval retries and their
  overrides are the caller's) and stdin, and a `KeepAliveClient` for the pod GET (no TLS handshake per pod).
- Threads, not the event loop, carry a call from accept to answer: one thread waits in accept(2); the
  connection it takes is its call, which it reads, runs and answers itself (blocking I/O), after
  starting the next waiting thread. The event loop is not on a call's path at all (its hops, a wake-up
  and a GIL hand-over each way, were ~1 ms of every ADD on a busy node). A thread serves exactly one
  call and ends: the capture code enters CNI_NETNS with setns(2), which moves only the calling thread,
  and everything it starts (iptables-restore, the netlink read of the interface addresses) runs there.
  The next waiting thread is started before the call enters any namespace, or by the event loop's
  thread, never by a thread that may be in a pod's namespace (a new thread inherits its creator's), and
  a waiting thread that finds itself elsewhere serves nothing.
- At most `MAX_CONCURRENT` calls run at once (no thread waits in accept while they do; callers wait in
  the listen backlog). Each call has a deadline (`call_deadline`, beyond the slowest the retry settings
  allow): the event loop looks every `WATCH_INTERVAL` and answers a call past it with error 11 itself;
  the late result is dropped (whichever side claims a call first answers it).
- Logs: after the answer is written and the connection closed (the pod's ADD never waits for them), the
  entries the plugin would post to the log socket are logged under the plugin's scope
  (`servers.emit_plugin_lines`); its stderr lines go back to the launcher with the answer.
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import io
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from istio_agent.cni.install import fastwire
from istio_agent.cni.install.servers import emit_plugin_lines

log = logging.getLogger("istio_agent.cni.install")

MAX_CONCURRENT = 16
READ_TIMEOUT = 10.0  # seconds for the whole request to arrive
DEADLINE_SLACK = 60.0  # seconds beyond the retries' worst case (iptables-restore waiting for the xtables lock)
GET_TIMEOUT = 5.0
WATCH_INTERVAL = 1.0  # seconds between the event loop's looks at the calls' deadlines
BACKLOG = 128
_RECV = 1 << 18


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


def run_call(env: dict[str, str], stdin: bytes, get: Callable[[str, str, str], dict[str, object]]) -> CallResult:
    """The plugin's invocation, as the in-process plugin runs it (blocking: call it on a thread of its own)."""
    from istio_agent.cni.plugin.log import PluginLog
    from istio_agent.cni.plugin.main import handle

    stderr = io.StringIO()
    plugin_log = PluginLog(stderr=stderr)
    outcome = handle(env, stdin, plugin_log, sleep=time.sleep, get=get)
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


class _Call:
    """One call in flight: whichever of its thread and the deadline watch claims it first answers it."""

    __slots__ = ("_claimed", "_lock", "command", "conn", "container", "deadline", "limit", "stdin")

    def __init__(self, conn: socket.socket, env: dict[str, str], stdin: bytes, started: float) -> None:
        self.conn = conn
        self.command = env.get("CNI_COMMAND", "")
        self.container = env.get("CNI_CONTAINERID", "")
        self.stdin = stdin
        self.limit = call_deadline(env)  # seconds
        self.deadline = started + self.limit  # time.monotonic() after which the watch answers
        self._lock = threading.Lock()
        self._claimed = False

    def claim(self) -> bool:
        with self._lock:
            if self._claimed:
                return False
            self._claimed = True
            return True


class FastPath:
    """The socket server; `start` then `stop` (both on install-cni's event loop)."""

    def __init__(self, run_dir: str, max_concurrent: int = MAX_CONCURRENT) -> None:
        from istio_agent.kube.keepalive import KeepAliveClient

        self.path = os.path.join(run_dir, fastwire.SOCKET_NAME)
        self.client = KeepAliveClient(timeout=GET_TIMEOUT)
        self.max_concurrent = max_concurrent
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._own_netns = thread_netns()
        self._lock = threading.Lock()
        self._calls: set[_Call] = set()
        self._running = 0  # calls taken and not yet finished (their threads still running)
        self._waiting = False  # a thread is in accept(2), or about to be
        self._stopping = False
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen (a stale socket removed, the directory made); the socket is 0600 from the start."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        Path(self.path).parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # bind creates the file: never readable by others, not even briefly
        try:
            sock.bind(self.path)
            os.chmod(self.path, 0o600)
            sock.listen(BACKLOG)
        except BaseException:
            sock.close()
            raise
        finally:
            os.umask(old_umask)
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._own_netns = thread_netns()
        self._watch = asyncio.create_task(self._watch_deadlines())
        with self._lock:
            self._waiting = True
        self._start_waiting_thread()

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting; let calls in flight answer for up to `grace` seconds; remove the socket."""
        with self._lock:
            self._stopping = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread in accept(2)
            self._sock.close()
        end = time.monotonic() + grace
        while (self._in_flight() or self._busy()) and time.monotonic() < end:  # taken calls, handed over or not
            await asyncio.sleep(0.01)
        for call in self._in_flight():
            if call.claim():  # never answered: the launcher reports that the agent gave no answer (error 11)
                _close(call.conn)
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.client.close()

    def _busy(self) -> bool:
        with self._lock:
            return self._running > 0

    def _in_flight(self) -> list[_Call]:
        with self._lock:
            return list(self._calls)

    def _start_waiting_thread(self) -> None:
        # `_thread` rather than `threading.Thread.start`, which waits until the new thread runs: the thread
        # that starts the next one is on its own call's path.
        try:
            _thread.start_new_thread(self._wait_for_call, ())
        except RuntimeError as exc:  # no thread to be had (a pids limit on a busy node): try again, never give up
            with self._lock:
                self._waiting = False
            log.error("fast path: cannot start a thread to wait for calls (%s); trying again in 1 s", exc)
            self._loop_call(self._wait_again_later)

    def _wait_for_call(self) -> None:
        """A waiting thread: take one connection, start the next waiting thread, serve the call, end."""
        sock = self._sock
        if thread_netns() != self._own_netns or sock is None:  # a bug elsewhere: never serve from a pod's netns
            log.error("fast path: a waiting thread is not in install-cni's network namespace; it serves nothing")
            with self._lock:
                self._waiting = False
            self._loop_call(self._wait_again)
            return
        try:
            conn, _ = sock.accept()
        except OSError as exc:
            with self._lock:
                self._waiting = False
                stopping = self._stopping
            if not stopping:
                log.error("fast path: accept failed (%s); trying again in 1 s", exc)
                self._loop_call(self._wait_again_later)
            return
        with self._lock:
            self._running += 1
            self._waiting = self._running < self.max_concurrent and not self._stopping
            start_next = self._waiting
        if start_next:
            self._start_waiting_thread()  # from here: this thread has not entered any namespace yet
        try:
            self._serve(conn)
        finally:
            with self._lock:
                self._running -= 1
                wanted = not self._waiting and not self._stopping and self._running < self.max_concurrent
                if wanted:
                    self._waiting = True
            if wanted:  # from the event loop's thread: this one may be in the pod's namespace by now
                self._loop_call(self._start_waiting_thread)

    def _wait_again(self) -> None:
        """On the event loop: a waiting thread again, unless one is waiting or the path is stopping."""
        with self._lock:
            if self._waiting:  # another path started one meanwhile (a call that ended): one waiter at a time
                return
            if self._stopping or self._running >= self.max_concurrent:
                return
            self._waiting = True
        self._start_waiting_thread()

    def _wait_again_later(self) -> None:
        if self._loop is not None:
            self._loop.call_later(1.0, self._wait_again)

    def _loop_call(self, function: Callable[[], object]) -> None:
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: install-cni stopped meanwhile
                self._loop.call_soon_threadsafe(function)

    def _serve(self, conn: socket.socket) -> None:
        """One connection, on its own thread: read, check, run, answer, close, then log."""
        handed = False  # to a `_Call`: from then on only the side that claims it uses or closes the connection
        try:
            try:
                pid, uid = peer_uid(conn)
            except (OSError, struct.error) as exc:
                log.error("fast path: cannot tell who is calling (%s); refused", exc)
                pid, uid = 0, -1
            try:
                env, stdin = fastwire.decode_request(read_request(conn))
            except fastwire.FrameError as exc:
                log.error("fast path: a malformed request from pid %d: %s", pid, exc)
                return
            except (OSError, TimeoutError):
                return  # the caller went away or never sent its request
            if uid != 0:
                log.warning("fast path: refused a call from pid %d, uid %d (only root, the container runtime, is "
                            "served); its istio-cni runs in-process", pid, uid)
                _send(conn, fastwire.encode_refusal())
                return
            netns = env.get("CNI_NETNS", "")
            if netns and not os.path.exists(netns):
                # The runtime's path is not in this process's view (a DaemonSet without the node's netns directory
                # or hostPID): the capture could not enter it, while the plugin on the node can.
                log.warning("fast path: CNI_NETNS %s is not visible to install-cni (mount the node's netns "
                            "directory at the same path); container %s's istio-cni runs in-process", netns,
                            env.get("CNI_CONTAINERID", ""))
                _send(conn, fastwire.encode_refusal())
                return
            handed = True
            self._run(conn, env, stdin)
        finally:
            if not handed:
                _close(conn)

    def _run(self, conn: socket.socket, env: dict[str, str], stdin: bytes) -> None:
        started = time.monotonic()
        call = _Call(conn, env, stdin, started)
        command, container = call.command, call.container
        with self._lock:
            self._calls.add(call)
        try:
            try:
                result = run_call(env, stdin, self.client.get_pod)
            except Exception as exc:  # a bug in the plugin's code path: the in-process plugin would crash too
                log.exception("fast path: %s for container %s failed", command, container)
                result = _late_answer(command, container, 0, stdin, f"{type(exc).__name__}: {exc}")
            except BaseException:  # SystemExit and the like: no answer (the launcher reports error 11), then on
                if call.claim():
                    _close(conn)
                raise
            if not call.claim():  # the watch or stop answered and closed it: the connection is theirs
                log.warning("fast path: %s for container %s finished after its deadline or install-cni's stop with "
                            "status %d (answer dropped)", command, container, result.code)
                return
            _send(conn, fastwire.encode_answer(result.code, result.stdout, result.stderr))
            _close(conn)  # the launcher stops reading once the answer is whole; closed before logging anyway
            elapsed = time.monotonic() - started
        finally:
            with self._lock:
                self._calls.discard(call)
        if result.entries:
            emit_plugin_lines(json.dumps(list(result.entries)).encode())
        log.info("fast path: %s for container %s answered with status %d in %.1f ms", command, container,
                 result.code, elapsed * 1000)

    async def _watch_deadlines(self) -> None:
        """Answer every call past its deadline with error 11 (its thread's late result is then dropped)."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            now = time.monotonic()
            for call in self._in_flight():
                if now > call.deadline and call.claim():
                    log.error("fast path: %s for container %s did not finish within %.0f s; answered try again later",
                              call.command, call.container, call.limit)
                    late = _late_answer(call.command, call.container, call.limit, call.stdin)
                    _send(call.conn, fastwire.encode_answer(late.code, late.stdout, late.stderr), timeout=1.0)
                    _close(call.conn)


def _send(conn: socket.socket, data: bytes, timeout: float = READ_TIMEOUT) -> None:
    with contextlib.suppress(OSError):
        conn.settimeout(timeout)
        conn.sendall(data)


def _close(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.close()


def _late_answer(command: str, container: str, deadline: float, stdin: bytes, why: str = "") -> CallResult:
    from istio_agent.cni.plugin.protocol import ERR_TRY_AGAIN_LATER, CniError, error_result, error_version

    message = why or f"the node agent did not finish {command} for container {container} within {deadline:.0f} s"
    body = error_result(CniError(ERR_TRY_AGAIN_LATER, f"istio-cni: {message}"), error_version(stdin))
    return CallResult(1, body, b"", ())

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
- A thread always waits in accept(2): reading a request holds no call slot, so connections that never
  send theirs cannot keep a real call waiting. At most `MAX_PENDING` connections are taken and not yet
  running (their request being read, `READ_TIMEOUT` at most, or waiting for a slot); one more closes the
  oldest with a refusal (its launcher, if it is one, runs the plugin in-process).
- At most `MAX_CONCURRENT` calls run at once. A whole request waits at most `SLOT_WAIT` for a slot, then is
  refused: with every slot held by calls stuck on a slow API server, a new ADD runs in-process at once
  rather than queueing behind them.
- Each call has a deadline (`call_deadline`, beyond the slowest the retry settings allow; every pod GET
  is bounded as a whole by `KeepAliveClient`'s): the event loop looks every `WATCH_INTERVAL` and answers a
  call past it with error 11 itself; the late result is dropped (whichever side claims a call first
  answers it). The claim frees the call's slot at once, and the call's thread stops at its next retry
  (its sleep and its next GET raise `fastcalls.Abandoned`).
- Logs: after the answer is written and the connection closed (the pod's ADD never waits for them), the
  entries the plugin would post to the log socket are logged under the plugin's scope
  (`servers.emit_plugin_lines`); its stderr lines go back to the launcher with the answer.

One call's own parts (reading its request, running the plugin, its deadline and cancellation, the late
answer) are in `fastcalls.py`; this module is the socket, its threads and their limits.
"""

from __future__ import annotations

import _thread
import asyncio
import collections
import contextlib
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from istio_agent.cni.install import fastwire
from istio_agent.cni.install.fastcalls import (
    GET_TIMEOUT,
    Abandoned,
    Call,
    call_deadline,
    late_answer,
    peer_uid,
    read_request,
    run_call,
    thread_netns,
)
from istio_agent.cni.install.servers import emit_plugin_lines

log = logging.getLogger("istio_agent.cni.install")

MAX_CONCURRENT = 16
MAX_PENDING = 64  # connections taken and not yet running; one more closes the oldest (with a refusal)
SLOT_WAIT = 0.5  # seconds a whole request waits for a free slot before it is refused (the plugin runs in-process)
WATCH_INTERVAL = 1.0  # seconds between the event loop's looks at the calls' deadlines
ANSWER_TIMEOUT = 10.0  # seconds for an answer to be taken by the caller
BACKLOG = 128


class _Taken:
    """A connection taken from accept(2) and not running yet: its request being read, or waiting for a slot."""

    __slots__ = ("conn", "evicted")

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.evicted = False  # closed to make room (or by stop): it is refused, never run



class FastPath:
    """The socket server; `start` then `stop` (both on install-cni's event loop)."""

    def __init__(self, run_dir: str, max_concurrent: int = MAX_CONCURRENT, max_pending: int = MAX_PENDING) -> None:
        from istio_agent.kube.keepalive import KeepAliveClient

        self.path = os.path.join(run_dir, fastwire.SOCKET_NAME)
        self.client = KeepAliveClient(timeout=GET_TIMEOUT)
        self.max_concurrent = max_concurrent
        self.max_pending = max_pending
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._own_netns = thread_netns()
        self._lock = threading.Lock()
        self._slot_free = threading.Condition(self._lock)
        self._calls: set[Call] = set()
        self._pending: collections.deque[_Taken] = collections.deque()  # oldest first
        self._active = 0  # calls holding a slot (running, and not yet answered by the watch or stop)
        self._threads = 0  # threads that took a connection and have not ended (abandoned calls' included)
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
            pending = list(self._pending)
            for taken in pending:
                taken.evicted = True
            self._slot_free.notify_all()
        for taken in pending:  # a request still arriving or waiting for a slot: refused, so run in-process
            _wake(taken.conn)
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
                call.cancel()
                self._release_slot()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.client.close()

    def _busy(self) -> bool:
        with self._lock:
            return self._threads > 0

    def _in_flight(self) -> list[Call]:
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
        taken = _Taken(conn)
        with self._lock:
            self._threads += 1
            self._pending.append(taken)
            oldest = self._pending.popleft() if len(self._pending) > self.max_pending else None
            if oldest is not None:
                oldest.evicted = True
                self._slot_free.notify_all()
            self._waiting = not self._stopping
            start_next = self._waiting
        if start_next:
            self._start_waiting_thread()  # from here: this thread has not entered any namespace yet
        if oldest is not None:
            log.warning("fast path: %d connections are waiting to be served; the oldest is refused (its istio-cni "
                        "runs in-process)", self.max_pending + 1)
            _wake(oldest.conn)
        try:
            self._serve(taken)
        finally:
            with self._lock:
                self._threads -= 1
                with contextlib.suppress(ValueError):
                    self._pending.remove(taken)

    def _wait_again(self) -> None:
        """On the event loop: a waiting thread again, unless one is waiting or the path is stopping."""
        with self._lock:
            if self._waiting:  # another path started one meanwhile (a call that ended): one waiter at a time
                return
            if self._stopping:
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

    def _serve(self, taken: _Taken) -> None:
        """One connection, on its own thread: read, check, wait for a slot, run, answer, close, then log."""
        conn = taken.conn
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
                if taken.evicted:  # its launcher may still read: nothing was done, so it runs in-process
                    _send(conn, fastwire.encode_refusal(), timeout=1.0)
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
            if not self._take_slot(taken):
                if not taken.evicted:
                    log.warning("fast path: all %d call slots stayed busy for %.1f s; container %s's istio-cni runs "
                                "in-process", self.max_concurrent, SLOT_WAIT, env.get("CNI_CONTAINERID", ""))
                _send(conn, fastwire.encode_refusal(), timeout=1.0)
                return
            handed = True
            self._run(conn, env, stdin)
        finally:
            if not handed:
                _close(conn)

    def _take_slot(self, taken: _Taken) -> bool:
        """A call slot for this request within `SLOT_WAIT` seconds; False when it was refused instead."""
        end = time.monotonic() + SLOT_WAIT
        with self._lock:
            while True:
                if taken.evicted or self._stopping:
                    return False
                if self._active < self.max_concurrent:
                    break
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._slot_free.wait(left)
            self._active += 1
            with contextlib.suppress(ValueError):
                self._pending.remove(taken)  # running: no longer one to make room from
            return True

    def _release_slot(self) -> None:
        """The side that claimed a call (its thread, the deadline watch or stop) frees its slot, once."""
        with self._lock:
            self._active -= 1
            self._slot_free.notify()

    def _run(self, conn: socket.socket, env: dict[str, str], stdin: bytes) -> None:
        started = time.monotonic()
        call = Call(conn, env, stdin, started, call_deadline(env))
        command, container = call.command, call.container
        with self._lock:
            self._calls.add(call)
        try:
            try:
                result = run_call(env, stdin, call.guard(self.client.get_pod), call.sleep)
            except Abandoned:  # answered by the watch or stop, which freed the slot; nothing more to do here
                log.warning("fast path: %s for container %s stopped after its answer was given (error 11)", command,
                            container)
                return
            except Exception as exc:  # a bug in the plugin's code path: the in-process plugin would crash too
                log.exception("fast path: %s for container %s failed", command, container)
                result = late_answer(command, container, 0, stdin, f"{type(exc).__name__}: {exc}")
            except BaseException:  # SystemExit and the like: no answer (the launcher reports error 11), then on
                if call.claim():
                    _close(conn)
                    self._release_slot()
                raise
            if not call.claim():  # the watch or stop answered and closed it: the connection is theirs
                log.warning("fast path: %s for container %s finished after its deadline or install-cni's stop with "
                            "status %d (answer dropped)", command, container, result.code)
                return
            try:
                _send(conn, fastwire.encode_answer(result.code, result.stdout, result.stderr))
                _close(conn)  # the launcher stops reading once the answer is whole; closed before logging anyway
            finally:
                self._release_slot()
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
                    late = late_answer(call.command, call.container, call.limit, call.stdin)
                    _send(call.conn, fastwire.encode_answer(late.code, late.stdout, late.stderr), timeout=1.0)
                    _close(call.conn)
                    call.cancel()  # its thread stops at its next retry
                    self._release_slot()  # at once: the thread may still be in a GET or a restore


def _send(conn: socket.socket, data: bytes, timeout: float = ANSWER_TIMEOUT) -> None:
    with contextlib.suppress(OSError):
        conn.settimeout(timeout)
        conn.sendall(data)


def _close(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.close()


def _wake(conn: socket.socket) -> None:
    """End the read another thread may be blocked in on `conn` (it sees the end of the stream); writing still works."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RD)

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
- Each call runs on a thread of its own, started for it and discarded after it: the capture code
  enters CNI_NETNS with setns(2), which moves only the calling thread, and everything it starts
  (iptables-restore, the netlink read of the interface addresses) runs there. The event loop never
  blocks; at most `MAX_CONCURRENT` calls run at once; each has a deadline (`call_deadline`, beyond
  the slowest the retry settings allow) after which the caller gets error 11 and the late result is
  dropped.
- Logs: the entries the plugin would post to the log socket are logged here under the plugin's scope
  (`servers.emit_plugin_lines`), and its stderr lines go back to the launcher.
"""

from __future__ import annotations

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
    except CniError:
        return DEADLINE_SLACK  # the plugin fails at once with code 4
    return retries * (interval + GET_TIMEOUT) + DEADLINE_SLACK


def run_call(env: dict[str, str], stdin: bytes, get: Callable[[str, str, str], dict[str, object]]) -> CallResult:
    """The plugin's invocation, as the in-process plugin runs it (blocking: call it on a fresh thread)."""
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


def _on_thread(function: Callable[[], CallResult]) -> asyncio.Future[CallResult]:
    """Run `function` on a new thread (discarded afterwards, whatever namespace it ended in)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[CallResult] = loop.create_future()

    def settle(result: CallResult | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            assert result is not None
            future.set_result(result)

    def target() -> None:
        result: CallResult | None = None
        error: BaseException | None = None
        try:
            result = function()
        except BaseException as exc:  # handed to the loop; the thread ends either way
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: install-cni stopped meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name="istio-cni-call", daemon=True).start()
    return future


class FastPath:
    """The socket server; `start` then `stop`."""

    def __init__(self, run_dir: str, max_concurrent: int = MAX_CONCURRENT) -> None:
        from istio_agent.cni.plugin.kubepool import KeepAliveClient

        self.path = os.path.join(run_dir, fastwire.SOCKET_NAME)
        self.client = KeepAliveClient(timeout=GET_TIMEOUT)
        self._slots = asyncio.Semaphore(max_concurrent)
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Listen (a stale socket removed, the directory made); the socket is 0600 from the start."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        Path(self.path).parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # bind creates the file: never readable by others, not even briefly
        try:
            sock.bind(self.path)
        except BaseException:
            sock.close()
            raise
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        self._server = await asyncio.start_unix_server(self._serve, sock=sock)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting; let calls in flight answer for up to `grace` seconds; remove the socket."""
        if self._server is not None:
            self._server.close()
        if self._connections:
            _, pending = await asyncio.wait(list(self._connections), timeout=grace)
            for task in pending:
                task.cancel()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.client.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._one_call(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readexactly(len(fastwire.MAGIC) + 4)
        if not head.startswith(fastwire.MAGIC):
            raise fastwire.FrameError("not a fast-path request (bad magic)")
        env_len = int.from_bytes(head[-4:], "big")
        if env_len > fastwire.MAX_ENV:
            raise fastwire.FrameError(f"environment block of {env_len} bytes exceeds {fastwire.MAX_ENV}")
        block_and_len = await reader.readexactly(env_len + 4)
        stdin_len = int.from_bytes(block_and_len[-4:], "big")
        if stdin_len > fastwire.MAX_STDIN:
            raise fastwire.FrameError(f"stdin of {stdin_len} bytes exceeds {fastwire.MAX_STDIN}")
        return head + block_and_len + await reader.readexactly(stdin_len)

    async def _one_call(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            pid, uid = peer_uid(sock)
        except (OSError, struct.error) as exc:
            log.error("fast path: cannot tell who is calling (%s); refused", exc)
            pid, uid = 0, -1
        try:
            data = await asyncio.wait_for(self._read_request(reader), READ_TIMEOUT)
            env, stdin = fastwire.decode_request(data)
        except fastwire.FrameError as exc:
            log.error("fast path: a malformed request from pid %d: %s", pid, exc)
            return
        if uid != 0:
            log.warning("fast path: refused a call from pid %d, uid %d (only root, the container runtime, is "
                        "served); its istio-cni runs in-process", pid, uid)
            writer.write(fastwire.encode_refusal())
            await writer.drain()
            return
        netns = env.get("CNI_NETNS", "")
        if netns and not os.path.exists(netns):
            # The runtime's path is not in this process's view (a DaemonSet without the node's netns directory
            # or hostPID): the capture could not enter it, while the plugin on the node can.
            log.warning("fast path: CNI_NETNS %s is not visible to install-cni (mount the node's netns directory "
                        "at the same path); container %s's istio-cni runs in-process", netns,
                        env.get("CNI_CONTAINERID", ""))
            writer.write(fastwire.encode_refusal())
            await writer.drain()
            return
        started = time.monotonic()
        result = await self._call(env, stdin)
        writer.write(fastwire.encode_answer(result.code, result.stdout, result.stderr))
        await writer.drain()
        # Closed, then logged: the launcher reads its answer to the end of the connection, so the pod's ADD
        # does not wait for install-cni's log.
        writer.close()
        elapsed = time.monotonic() - started
        if result.entries:
            emit_plugin_lines(json.dumps(list(result.entries)).encode())
        log.info("fast path: %s for container %s answered with status %d in %.1f ms", env.get("CNI_COMMAND", ""),
                 env.get("CNI_CONTAINERID", ""), result.code, elapsed * 1000)

    async def _call(self, env: dict[str, str], stdin: bytes) -> CallResult:
        command = env.get("CNI_COMMAND", "")
        container = env.get("CNI_CONTAINERID", "")
        deadline = call_deadline(env)
        await self._slots.acquire()
        future = _on_thread(lambda: run_call(env, stdin, self.client.get_pod))
        future.add_done_callback(lambda _: self._slots.release())  # the slot is held until the thread ends
        try:
            result = await asyncio.wait_for(asyncio.shield(future), deadline)
        except TimeoutError:
            log.error("fast path: %s for container %s did not finish within %.0f s; answered try again later",
                      command, container, deadline)
            future.add_done_callback(_log_late(command, container))
            return _late_answer(command, container, deadline, stdin)
        except Exception as exc:  # a bug in the plugin's code path: the in-process plugin would crash too
            log.exception("fast path: %s for container %s failed", command, container)
            return _late_answer(command, container, 0, stdin, f"{type(exc).__name__}: {exc}")
        return result


def _late_answer(command: str, container: str, deadline: float, stdin: bytes, why: str = "") -> CallResult:
    from istio_agent.cni.plugin.protocol import ERR_TRY_AGAIN_LATER, CniError, error_result, error_version

    message = why or f"the node agent did not finish {command} for container {container} within {deadline:.0f} s"
    body = error_result(CniError(ERR_TRY_AGAIN_LATER, f"istio-cni: {message}"), error_version(stdin))
    return CallResult(1, body, b"", ())


def _log_late(command: str, container: str) -> Callable[[asyncio.Future[CallResult]], None]:
    def done(future: asyncio.Future[CallResult]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        log.warning("fast path: %s for container %s finished after its deadline with status %d (answer dropped)",
                    command, container, future.result().code)
    return done

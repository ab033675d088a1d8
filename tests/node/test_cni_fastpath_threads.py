"""install-cni's fast path as threads (root: network namespaces): the real `FastPath` on its own event loop,
real unix-socket callers, and a stand-in for the plugin's call (`fastpath.run_call`) that enters a scratch
network namespace as the capture code does.

What the thread model must keep: a thread that entered a pod's namespace never serves another call (every
call starts in install-cni's own namespace, on a thread of its own), at most `max_concurrent` calls run at
once and the rest wait for a slot (for `SLOT_WAIT`, then they are refused and their launcher runs the plugin
in-process), a call past its deadline is answered with error 11 while its late result is dropped and its slot
freed at once, connections that never send a request never keep a real call waiting, and `stop` leaves no
call waiting for an answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from needs import need_root, need_tool

from istio_agent.capture.netns import enter_netns
from istio_agent.cni.install import fastcalls, fastpath, fastwire

CallFn = Callable[[dict[str, str], bytes, object, object], fastcalls.CallResult]
ANSWER = fastcalls.CallResult(0, b'{"cniVersion": "1.0.0"}\n', b"", ())


class Served:
    """A FastPath on an event loop of its own thread."""

    def __init__(self, run_dir: Path, max_concurrent: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.path = asyncio.run_coroutine_threadsafe(self._make(str(run_dir), max_concurrent), self.loop).result(30)

    async def _make(self, run_dir: str, max_concurrent: int) -> str:
        self.fp = fastpath.FastPath(run_dir, max_concurrent=max_concurrent)
        await self.fp.start()
        return self.fp.path

    def close(self, grace: float = 5.0) -> None:
        asyncio.run_coroutine_threadsafe(self.fp.stop(grace), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def call(path: str, container: str = "c1") -> bytes:
    """One CNI call as the launcher makes it; everything install-cni sent until it closed."""
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": container, "CNI_IFNAME": "eth0"}
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(fastwire.encode_request(env, b'{"cniVersion": "1.0.0"}'))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def call_in_parallel(path: str, containers: list[str]) -> list[bytes]:
    """One launcher-like call per container, all at once; their answers, in the order they came."""
    replies: list[bytes] = []
    callers = [threading.Thread(target=lambda c=c: replies.append(call(path, c))) for c in containers]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(30)
    return replies


@pytest.fixture
def scratch_netns() -> Iterator[str]:
    need_root()
    need_tool("ip")
    name = f"iacni-fpt-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    yield f"/run/netns/{name}"
    subprocess.run(["ip", "netns", "del", name], check=False, timeout=30)


@pytest.fixture
def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[CallFn, int], Served]]:
    started: list[Served] = []

    def make(function: CallFn, max_concurrent: int = 4) -> Served:
        monkeypatch.setattr(fastpath, "run_call", function)
        served = Served(tmp_path, max_concurrent)
        started.append(served)
        return served

    yield make
    for served in started:
        if not served.loop.is_closed():
            served.close()


def test_a_thread_that_entered_a_pods_netns_never_serves_another_call(
        serve: Callable[[CallFn, int], Served], scratch_netns: str) -> None:
    seen: list[tuple[int, tuple[int, int]]] = []
    lock = threading.Lock()

    def enter_and_answer(env: dict[str, str], stdin: bytes, get: object, sleep: object) -> fastcalls.CallResult:
        with lock:
            seen.append((threading.get_native_id(), fastpath.thread_netns()))
        enter_netns(scratch_netns)  # as the capture code does; this thread now stays there
        return ANSWER

    served = serve(enter_and_answer, 2)
    for i in range(5):
        assert fastwire.decode_reply(call(served.path, f"seq{i}")) == (0, ANSWER.stdout, b"")
    replies = call_in_parallel(served.path, [f"par{i}" for i in range(6)])
    assert [fastwire.decode_reply(r) for r in replies] == [(0, ANSWER.stdout, b"")] * 6
    own = fastpath.thread_netns()  # this test's thread, like install-cni's loop, never left the node's namespace
    assert len(seen) == 11
    assert all(netns == own for _, netns in seen), seen  # every call began in install-cni's namespace
    assert len({tid for tid, _ in seen}) == 11  # on a thread of its own
    served.close()


def test_at_most_max_concurrent_calls_run_and_the_rest_wait(serve: Callable[[CallFn, int], Served],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastpath, "SLOT_WAIT", 60.0)  # waiting for a slot as long as this test may take
    release = threading.Event()
    running, peak = [0], [0]
    lock = threading.Lock()
    two_running = threading.Event()

    def held(env: dict[str, str], stdin: bytes, get: object, sleep: object) -> fastcalls.CallResult:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            if running[0] == 2:
                two_running.set()
        release.wait(30)
        with lock:
            running[0] -= 1
        return ANSWER

    served = serve(held, 2)
    replies: list[bytes] = []
    callers = [threading.Thread(target=lambda i=i: replies.append(call(served.path, f"c{i}"))) for i in range(5)]
    for caller in callers:
        caller.start()
    assert two_running.wait(30)
    assert not replies and running[0] == 2  # the other three wait for a slot, unanswered
    release.set()
    for caller in callers:
        caller.join(30)
    assert [fastwire.decode_reply(r) for r in replies] == [(0, ANSWER.stdout, b"")] * 5
    assert peak[0] == 2
    served.close()


def test_a_call_past_its_deadline_is_try_again_later_and_its_result_dropped(
        serve: Callable[[CallFn, int], Served], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(fastpath, "call_deadline", lambda env: 0.2)
    monkeypatch.setattr(fastpath, "WATCH_INTERVAL", 0.05)
    release, finished = threading.Event(), threading.Event()

    def slow(env: dict[str, str], stdin: bytes, get: object, sleep: object) -> fastcalls.CallResult:
        release.wait(30)
        finished.set()
        return ANSWER

    served = serve(slow, 4)
    with caplog.at_level(logging.INFO, logger="istio_agent.cni.install"):
        reply = fastwire.decode_reply(call(served.path, "late"))
        assert reply is not None
        code, out, _ = reply
        body = json.loads(out)
        assert code == 1 and body["code"] == 11 and "did not finish ADD for container late" in body["msg"], body
        release.set()
        assert finished.wait(30)
        served.close()
    messages = [r.getMessage() for r in caplog.records]
    assert any("finished after its deadline" in m and "status 0" in m for m in messages), messages
    assert not any("answered with status" in m for m in messages), messages


def test_stop_closes_calls_still_running_after_the_grace(serve: Callable[[CallFn, int], Served]) -> None:
    release = threading.Event()
    started = threading.Event()

    def stuck(env: dict[str, str], stdin: bytes, get: object, sleep: object) -> fastcalls.CallResult:
        started.set()
        release.wait(30)
        return ANSWER

    served = serve(stuck, 4)
    replies: list[bytes] = []
    caller = threading.Thread(target=lambda: replies.append(call(served.path)))
    caller.start()
    assert started.wait(30)
    served.close(grace=0.1)
    caller.join(30)
    assert replies == [b""]  # no answer: the launcher reports the agent's failure (error 11), never retries
    release.set()
    assert not Path(served.path).exists()


def test_a_thread_that_cannot_be_started_is_tried_again(serve: Callable[[CallFn, int], Served],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed thread start (a pids limit) must not leave the socket with no thread in accept(2) for good."""
    served = serve(lambda env, stdin, get, sleep: ANSWER, 1)
    real = fastpath._thread.start_new_thread
    failures = [1]

    def flaky(function: Callable[..., object], args: tuple[object, ...]) -> int:
        if failures[0]:
            failures[0] -= 1
            raise RuntimeError("can't start new thread")
        return real(function, args)

    monkeypatch.setattr(fastpath._thread, "start_new_thread", flaky)
    # The first call's thread fails to start the next waiter; the loop tries again a second later.
    assert fastwire.decode_reply(call(served.path, "first")) == (0, ANSWER.stdout, b"")
    assert fastwire.decode_reply(call(served.path, "second")) == (0, ANSWER.stdout, b"")
    served.close()


def test_a_retry_never_adds_a_second_waiting_thread(serve: Callable[[CallFn, int], Served],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`_wait_again` (after a failed accept) when a waiter already exists: still one call at a time."""
    monkeypatch.setattr(fastpath, "SLOT_WAIT", 60.0)  # the calls queue for the one slot rather than being refused
    running, peak = [0], [0]
    lock = threading.Lock()

    def slow(env: dict[str, str], stdin: bytes, get: object, sleep: object) -> fastcalls.CallResult:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        threading.Event().wait(0.3)
        with lock:
            running[0] -= 1
        return ANSWER

    served = serve(slow, 1)
    served.loop.call_soon_threadsafe(served.fp._wait_again)
    replies = call_in_parallel(served.path, [f"c{i}" for i in range(3)])
    assert [fastwire.decode_reply(r) for r in replies] == [(0, ANSWER.stdout, b"")] * 3
    assert peak[0] == 1
    served.close()


def idle_connection(path: str) -> socket.socket:
    """A connection that never sends its request (a launcher that hangs, or a caller that means harm)."""
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(30)
    sock.connect(path)
    return sock


def test_connections_that_never_send_a_request_never_keep_a_call_waiting(
        serve: Callable[[CallFn, int], Served]) -> None:
    """100 idle connections (more than the slots and more than may wait to be read): a real call that comes after
    them is served at once, and the oldest idle ones are refused (a launcher would run the plugin in-process)."""
    served = serve(lambda env, stdin, get, sleep: ANSWER, 4)
    idle = [idle_connection(served.path) for _ in range(100)]
    try:
        assert fastwire.decode_reply(call(served.path, "real")) == (0, ANSWER.stdout, b"")
        oldest = b""
        while chunk := idle[0].recv(65536):  # closed to make room, with a refusal
            oldest += chunk
        assert fastwire.decode_reply(oldest) is None
    finally:
        for sock in idle:
            sock.close()
    served.close()


def test_with_every_slot_held_a_new_call_is_refused_rather_than_queued(
        serve: Callable[[CallFn, int], Served]) -> None:
    """Calls stuck (on a slow API server, say) hold every slot: a new call gets a refusal within the slot wait, so
    its launcher runs the plugin in-process instead of waiting behind them; once they end, calls are served again."""
    release = threading.Event()
    stuck = threading.Semaphore(0)

    def held(env: dict[str, str], stdin: bytes, get: object, sleep: object = None) -> fastcalls.CallResult:
        if env["CNI_CONTAINERID"].startswith("stuck"):
            stuck.release()
            release.wait(60)
        return ANSWER

    served = serve(held, 2)
    replies: list[bytes] = []
    callers = [threading.Thread(target=lambda i=i: replies.append(call(served.path, f"stuck{i}"))) for i in range(2)]
    for caller in callers:
        caller.start()
    try:
        assert stuck.acquire(timeout=30) and stuck.acquire(timeout=30)
        assert fastwire.decode_reply(call(served.path, "new")) is None  # refused: nothing was done
    finally:
        release.set()
        for caller in callers:
            caller.join(30)
    assert [fastwire.decode_reply(r) for r in replies] == [(0, ANSWER.stdout, b"")] * 2
    assert fastwire.decode_reply(call(served.path, "after")) == (0, ANSWER.stdout, b"")
    served.close()


def test_a_call_past_its_deadline_frees_its_slot_at_once_and_its_thread_stops_retrying(
        serve: Callable[[CallFn, int], Served], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """One slot; a call that keeps retrying is answered with error 11 at its deadline, the next call is served on
    that slot while the first call's thread is still alive, and that thread stops at its next retry."""
    monkeypatch.setattr(fastpath, "call_deadline", lambda env: 0.3)
    monkeypatch.setattr(fastpath, "WATCH_INTERVAL", 0.05)
    monkeypatch.setattr(fastpath, "SLOT_WAIT", 60.0)  # the next call waits for the one slot: it must come free
    next_served, ended = threading.Event(), threading.Event()

    def retrying(env: dict[str, str], stdin: bytes, get: object,
                 sleep: Callable[[float], None]) -> fastcalls.CallResult:
        if env["CNI_CONTAINERID"] != "retrying":
            next_served.set()
            return ANSWER
        try:
            next_served.wait(60)  # stuck where nothing can stop it (a GET, a restore) until the next call was served
            while True:
                sleep(0.05)  # its next retry: the call's own sleep raises, the watch having answered
        finally:
            ended.set()

    served = serve(retrying, 1)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="istio_agent.cni.install"):
        reply = fastwire.decode_reply(call(served.path, "retrying"))
        assert reply is not None and json.loads(reply[1])["code"] == 11
        assert fastwire.decode_reply(call(served.path, "next")) == (0, ANSWER.stdout, b"")
        assert ended.wait(30)
        served.close()
    messages = [r.getMessage() for r in caplog.records]
    assert any("retrying stopped after its answer was given" in m for m in messages), messages

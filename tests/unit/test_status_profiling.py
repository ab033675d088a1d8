"""`/debug/pprof/` (`--profiling`): the handler's answers and the collapsed-stack sampling, without sockets.

The sampler is given its frames and stop event, so no thread sleeps here; the real sampling of a running
thread over HTTP is `tests/component/test_status_profiling_http.py`'s.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from types import FrameType

import pytest

from istio_agent.httpio.server_core import Request
from istio_agent.status import profiling


def request(path: str, remote: str = "127.0.0.1", query: str = "") -> Request:
    return Request("GET", path, path, query, (), remote)


def marker_frame() -> FrameType:
    return sys._getframe()


def test_a_stack_collapses_root_first_under_its_thread() -> None:
    folded = profiling.collapse("Main Thread", marker_frame())
    assert folded.startswith("Main_Thread;")
    assert folded.endswith(";test_status_profiling.py:marker_frame")
    assert " " not in folded


def test_the_sampler_counts_each_stack_and_skips_its_own_thread() -> None:
    stop = threading.Event()
    frame = marker_frame()
    me = threading.get_ident()

    def frames() -> dict[int, FrameType]:
        stop.set()  # one round only
        return {me: frame, 12345: frame}

    counts = profiling.sample_threads(30, stop, frames=frames)
    assert sum(counts.values()) == 1
    (stack,) = counts
    assert stack.startswith("thread-12345;") and stack.endswith(":marker_frame")
    assert profiling.render_collapsed(counts) == f"{stack} 1\n"


@pytest.mark.parametrize(("query", "seconds"), [("", 30), ("seconds=5", 5), ("debug=1&seconds=2", 2),
                                                ("seconds=0", 30), ("seconds=-4", 30), ("seconds=x", 30)])
def test_seconds_are_read_as_go_reads_them(query: str, seconds: int) -> None:
    assert profiling.profile_seconds(query) == seconds


def test_answers_by_path_and_peer() -> None:
    profiler = profiling.Profiler()

    async def answers() -> None:
        index = await profiler.handle(request("/debug/pprof/"))
        assert index.status == 200 and b"profile?seconds=N" in index.body
        assert (await profiler.handle(request("/debug/pprof/", remote="10.1.2.3"))).status == 403
        cmdline = await profiler.handle(request("/debug/pprof/cmdline"))
        assert cmdline.status == 200 and cmdline.body == "\x00".join(sys.argv).encode()
        for go_only in ("heap", "symbol", "trace", "allocs"):
            answer = await profiler.handle(request(f"/debug/pprof/{go_only}"))
            assert answer.status == 501 and b"Go runtime profile" in answer.body
        assert (await profiler.handle(request("/debug/pprof/nothing"))).status == 404
        too_long = await profiler.handle(request("/debug/pprof/profile", query="seconds=999999"))
        assert too_long.status == 400
        stacks = await profiler.handle(request("/debug/pprof/goroutine"))
        assert stacks.status == 200
        assert b"thread MainThread" in stacks.body and b"test_status_profiling.py" in stacks.body
        assert b"task " in stacks.body

    asyncio.run(answers())

"""`/debug/pprof/profile` over HTTP on a real status server: a busy thread shows in the collapsed stacks.

One profile at a time, as Go's; the goroutine dump names the threads and the loop's tasks.
"""

from __future__ import annotations

import asyncio
import threading

from support import eventually, http_request

from istio_agent.httpio.routing import Router
from istio_agent.httpio.server import HttpServer
from istio_agent.status.profiling import Profiler


def busy_marker(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


async def test_a_profile_samples_the_busy_thread_and_only_one_runs_at_a_time() -> None:
    router = Router()
    profiler = Profiler()
    profiler.add_routes(router)
    server = HttpServer(router)
    port = await server.start("127.0.0.1", 0)
    stop = threading.Event()
    worker = threading.Thread(target=busy_marker, args=(stop,), name="busy worker")
    worker.start()
    try:
        first = asyncio.create_task(asyncio.to_thread(http_request, "127.0.0.1", port,
                                                      "/debug/pprof/profile?seconds=1", timeout=30))
        await eventually(lambda: profiler._running is not None, what="the first profile to start")
        status, body = await asyncio.to_thread(http_request, "127.0.0.1", port, "/debug/pprof/profile?seconds=1")
        assert status == 500 and b"already in use" in body
        status, body = await first
        assert status == 200, body
        lines = body.decode().splitlines()
        busy = [line for line in lines if line.startswith("busy_worker;")]
        assert busy and all(":busy_marker" in line for line in busy), lines[:20]
        assert sum(int(line.rsplit(" ", 1)[1]) for line in busy) >= 10  # ~100 a second, whatever the machine
        status, body = await asyncio.to_thread(http_request, "127.0.0.1", port, "/debug/pprof/goroutine")
        assert status == 200 and b"thread busy worker" in body and b"busy_marker" in body
    finally:
        stop.set()
        worker.join(10)
        await server.stop()

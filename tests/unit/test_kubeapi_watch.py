"""A watch's stream: one encoding of each object shared by every watcher, frames written in slices, and a watcher
that falls more than its byte budget behind cut at once (its connection's task cancelled, its queue dropped)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from istiod_local.controlplane.kubeapi.store import PODS, WatchEvent
from istiod_local.controlplane.kubeapi.watch import SLICE, ObjectJson, WatchRequest, WatchStream


def _pod(name: str, rv: int, message: str = "") -> dict[str, Any]:
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "default", "resourceVersion": str(rv)},
            "status": {"message": message}}


def _event(rv: int, message: str = "") -> WatchEvent:
    return WatchEvent("MODIFIED", PODS, _pod("a", rv, message), rv, _pod("a", rv - 1))


def _stream(objects: ObjectJson, max_bytes: int = 1 << 20, **request: Any) -> WatchStream:
    return WatchStream(WatchRequest(PODS, "", None, None, **request), [], objects=objects,
                       current_version=lambda: 7, now=lambda: 0.0, bookmark_interval=60.0, max_bytes=max_bytes)


async def _lines(stream: WatchStream) -> list[dict[str, Any]]:
    data = b"".join([part async for part in stream])
    return [json.loads(line) for line in data.splitlines()]


async def test_every_watcher_gets_the_same_encoding_of_an_object() -> None:
    objects = ObjectJson()
    first, second = _stream(objects), _stream(objects)
    event = _event(5, "x" * 100)
    for stream in (first, second):
        stream.deliver(event)
        stream.stop()
    assert first._queue[0][1] is second._queue[0][1], "one encoding, shared"
    assert await _lines(first) == [{"type": "MODIFIED", "object": event.object}]


async def test_large_frames_are_written_in_slices() -> None:
    stream = _stream(ObjectJson(), max_bytes=10 << 20)
    stream.deliver(_event(5, "y" * (3 * SLICE)))
    stream.stop()
    parts = [part async for part in stream]
    assert max(len(p) for p in parts) <= SLICE and len(parts) >= 4
    assert json.loads(b"".join(parts))["object"]["status"]["message"] == "y" * (3 * SLICE)


async def test_a_watcher_past_its_byte_budget_is_cut_and_its_queue_dropped() -> None:
    objects = ObjectJson()

    async def connection() -> WatchStream:
        stream = _stream(objects, max_bytes=250_000)
        streams.append(stream)
        await asyncio.sleep(3600)  # a connection whose client never reads
        return stream

    streams: list[WatchStream] = []
    task = asyncio.create_task(connection())
    await asyncio.sleep(0)
    stream = streams[0]
    stream.deliver(_event(5, "1" * 100_000))
    stream.deliver(_event(6, "2" * 100_000))
    assert not stream.overflowed and stream.buffered > 200_000
    stream.deliver(_event(7, "3" * 100_000))
    assert stream.overflowed and stream.buffered == 0 and not stream._queue
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled(), "the connection was cut"
    stream.deliver(_event(8))
    assert not stream._queue, "nothing more is queued for a cut watcher"


async def test_a_resource_version_too_old_is_one_error_event() -> None:
    stream = WatchStream(WatchRequest(PODS, "", None, None), [], objects=ObjectJson(), current_version=lambda: 9,
                         now=lambda: 0.0, bookmark_interval=60.0, expired={"kind": "Status", "code": 410})
    assert await _lines(stream) == [{"type": "ERROR", "object": {"kind": "Status", "code": 410}}]


async def test_the_object_cache_is_bounded_in_bytes_and_keyed_by_the_object_itself() -> None:
    objects = ObjectJson(max_bytes=1000)
    kept = [_pod(f"p{n}", n, "z" * 300) for n in range(5)]
    for pod in kept:
        objects.get(pod)
    assert objects._held <= 1000 and len(objects._cache) < 5
    twin = _pod("p4", 4, "z" * 300)
    assert objects.get(twin) == objects.get(kept[4]) and objects.get(kept[4]) is objects.get(kept[4])

"""One watch's stream of JSON lines, with the memory a watcher may hold bounded in bytes.

Each object's JSON is encoded once (`ObjectJson`) and the same bytes go to
every watcher and every GET: 500 watchers of a 1 MB pod cost one encoding,
not 500 on the event loop. A watcher's queue holds references to those shared
frames; what it has not yet taken is counted in bytes, and a watcher more than
`max_bytes` (or `max_events`) behind is cut off at once, as the apiserver cuts
a watcher whose buffer fills (its client lists and watches again). The
connection itself is cut (its task cancelled) rather than left to finish
writing what it could not take. Frames are written in slices, so a slow
connection holds one slice of a large frame in its buffers, not the frame.

The stream is an `httpio` body stream: the server pulls it and writes each
slice with backpressure.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from istiod_local.controlplane.kubeapi import discovery
from istiod_local.controlplane.kubeapi.changes import WatchEvent, bookmark, filter_event
from istiod_local.controlplane.kubeapi.selectors import FieldSelector, LabelSelector

log = logging.getLogger("istiod_local.controlplane.kubeapi")

SLICE = 64 * 1024
MAX_BUFFERED_BYTES = 4 * 1024 * 1024
MAX_BUFFERED_EVENTS = 10_000


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class ObjectJson:
    """Objects' JSON, encoded once: the last `max_bytes` worth, keyed by the (never changed) object itself."""

    def __init__(self, max_bytes: int = 2 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._held = 0
        self._cache: OrderedDict[int, tuple[dict[str, Any], bytes]] = OrderedDict()

    def put(self, obj: dict[str, Any], encoded: bytes) -> None:
        key = id(obj)
        old = self._cache.pop(key, None)
        if old is not None:
            self._held -= len(old[1])
        self._cache[key] = (obj, encoded)  # holding `obj` keeps its id from being reused while cached
        self._held += len(encoded)
        while self._held > self.max_bytes and len(self._cache) > 1:
            _, (_, dropped) = self._cache.popitem(last=False)
            self._held -= len(dropped)

    def get(self, obj: dict[str, Any]) -> bytes:
        found = self._cache.get(id(obj))
        if found is not None and found[0] is obj:
            self._cache.move_to_end(id(obj))
            return found[1]
        encoded = dumps(obj)
        self.put(obj, encoded)
        return encoded


@dataclass(frozen=True)
class WatchRequest:
    """What one watcher asked for."""

    resource: str
    namespace: str
    labels: LabelSelector | None
    fields: FieldSelector | None
    table: bool = False
    include_object: str = "Metadata"
    bookmarks: bool = False
    initial_events_end: bool = False
    timeout: float = 1800.0


class WatchStream:
    """The body of one watch response: initial events, then changes as they come, bookmarks, until a timeout,
    the server's stop, or the watcher falling too far behind."""

    def __init__(self, request: WatchRequest, initial: list[WatchEvent], *, objects: ObjectJson,
                 current_version: Callable[[], int], now: Callable[[], float], bookmark_interval: float,
                 expired: dict[str, Any] | None = None, max_bytes: int = MAX_BUFFERED_BYTES,
                 max_events: int = MAX_BUFFERED_EVENTS) -> None:
        self.request = request
        self._initial = initial
        self._objects = objects
        self._version = current_version
        self._now = now
        self._bookmark_interval = bookmark_interval
        self._expired = expired
        self.max_bytes, self.max_events = max_bytes, max_events
        self._queue: deque[tuple[bytes, ...]] = deque()
        self.buffered = 0
        self._first_table = True
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self.overflowed = False
        self.done = asyncio.get_running_loop().create_future()
        # The connection's task (the request handler runs in it): cancelled to cut a watcher that fell behind.
        self._task = asyncio.current_task()
        self.on_close: Callable[[], None] = lambda: None

    # ---- fed by the store (on the loop) --------------------------------------------------------------

    def deliver(self, event: WatchEvent) -> None:
        if self._ended or event.resource != self.request.resource:
            return
        frame = self._frame(event)
        if frame is None:
            return
        self._queue.append(frame)
        self.buffered += sum(len(part) for part in frame)
        if self.buffered > self.max_bytes or len(self._queue) > self.max_events:
            self._cut()
            return
        self._wake()

    def stop(self) -> None:
        """End the stream cleanly (the server stops): what is queued is still sent."""
        self._ended = True
        self._wake()

    def _cut(self) -> None:
        log.warning("kube API: a watch of %s fell %d bytes (%d events) behind and was closed",
                    self.request.resource, self.buffered, len(self._queue))
        self.overflowed = self._ended = True
        self._queue.clear()
        self.buffered = 0
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # ---- frames -------------------------------------------------------------------------------------

    def _frame(self, event: WatchEvent) -> tuple[bytes, ...] | None:
        request = self.request
        seen = filter_event(event, request.labels, request.fields, request.namespace)
        if seen is None:
            return None
        if request.table:
            obj = seen.object
            rendered = discovery.table(request.resource, [obj], obj["metadata"]["resourceVersion"], self._now(),
                                       request.include_object, columns=self._first_table)
            self._first_table = False
            return (dumps({"type": seen.type, "object": rendered}) + b"\n",)
        return b'{"type":"' + seen.type.encode() + b'","object":', self._objects.get(seen.object), b"}\n"

    def _bookmark(self, annotations: dict[str, str] | None = None) -> tuple[bytes, ...]:
        obj = bookmark(self.request.resource, self._version())
        if annotations:
            obj["metadata"]["annotations"] = annotations
        return (dumps({"type": "BOOKMARK", "object": obj}) + b"\n",)

    # ---- the body stream ----------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._slices(self._frames())

    @staticmethod
    async def _slices(frames: AsyncIterator[tuple[bytes, ...]]) -> AsyncIterator[bytes]:
        async for frame in frames:
            for part in frame:
                if len(part) <= SLICE:
                    yield part
                    continue
                view = memoryview(part)  # slices of the shared frame, not copies of it
                for start in range(0, len(part), SLICE):
                    yield view[start:start + SLICE]  # type: ignore[misc]

    async def _frames(self) -> AsyncIterator[tuple[bytes, ...]]:
        if self._expired is not None:
            yield (dumps({"type": "ERROR", "object": self._expired}) + b"\n",)
            return
        for frame in _frames_of(self, self._initial):
            yield frame
        self._initial = []
        if self.request.initial_events_end:  # the end of the initial state, as the apiserver marks it
            yield self._bookmark({"k8s.io/initial-events-end": "true"})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request.timeout
        next_bookmark = loop.time() + self._bookmark_interval
        while True:
            while self._queue:
                frame = self._queue.popleft()
                self.buffered -= sum(len(part) for part in frame)
                yield frame
            if self._ended or loop.time() >= deadline:
                return
            if self.request.bookmarks and loop.time() >= next_bookmark:
                yield self._bookmark()
                next_bookmark = loop.time() + self._bookmark_interval
                continue
            wake_at = min(deadline, next_bookmark) if self.request.bookmarks else deadline
            self._waiter = loop.create_future()
            timer = loop.call_at(wake_at, self._wake)
            try:
                await self._waiter
            finally:
                timer.cancel()
                self._waiter = None

    async def aclose(self) -> None:
        self._ended = True
        self._queue.clear()
        self.buffered = 0
        self.on_close()
        if not self.done.done():
            self.done.set_result(None)


def _frames_of(stream: WatchStream, events: Iterable[WatchEvent]) -> Iterable[tuple[bytes, ...]]:
    for event in events:
        frame = stream._frame(event)
        if frame is not None:
            yield frame

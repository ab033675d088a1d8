"""`run_view`: sample, build, draw, once a second, until `stop` is set (see the package docstring)."""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TextIO

from istiod_local.meshview.collector import Collector
from istiod_local.meshview.model import History, MeshEvent, MeshView, ViewTarget, build_view, changes
from istiod_local.meshview.render import log_lines, render

EventSource = Callable[[], Iterable[MeshEvent | str]] | queue.Queue[MeshEvent | str] | None


def _drain(events: EventSource, now: float) -> list[MeshEvent]:
    if events is None:
        return []
    items: list[MeshEvent | str] = []
    if isinstance(events, queue.Queue):
        while True:
            try:
                items.append(events.get_nowait())
            except queue.Empty:
                break
    else:
        items = list(events())
    return [e if isinstance(e, MeshEvent) else MeshEvent(now, str(e)) for e in items]


class MeshWatcher:
    """One round at a time (for tests and for callers with their own loop): `step()` returns the new view."""

    def __init__(self, targets: Callable[[], Sequence[ViewTarget]], istiod_monitoring: str | None = None,
                 events: EventSource = None, *, istiod_netns: str | None = None, window: float = 10.0,
                 slow_every: int = 5, clock: Callable[[], float] = time.time,
                 istiod_name: str = "istiod-local") -> None:
        self._targets = targets
        self._events = events
        self._clock = clock
        self.history = History(window)
        self.collector = Collector(istiod_monitoring, istiod_netns, slow_every, istiod_name=istiod_name)
        self.view: MeshView | None = None
        self.last_changes: list[str] = []
        self.last_round_s = 0.0  # how long the last round's reads took (shown in the live view's header)

    def step(self) -> MeshView:
        now = self._clock()
        started = time.monotonic()
        samples, istiod = self.collector.sample(list(self._targets()), now)
        self.last_round_s = time.monotonic() - started
        self.history.add_pods(samples, now)
        if istiod is not None:
            self.history.add_istiod(istiod)
        for event in _drain(self._events, now):
            self.history.add_event(event)
        view = build_view(self.history, now)
        self.last_changes = changes(self.view, view)
        given = {e.text for e in view.events if e.source == "mesh"}
        for line in self.last_changes:
            if line not in given:
                self.history.add_event(MeshEvent(now, line, source="view"))
        self.view = build_view(self.history, now) if self.last_changes else view
        return self.view

    def close(self) -> None:
        self.collector.close()


def run_view(targets: Callable[[], Sequence[ViewTarget]], istiod_monitoring: str | None, stop: threading.Event,
             events: EventSource = None, out: TextIO | None = None, *, istiod_netns: str | None = None,
             interval: float = 1.0, window: float = 10.0, live: bool | None = None,
             istiod_name: str = "istiod-local") -> None:
    """Watch the mesh until `stop` is set; the rich live view when `out` is a terminal, else the plain log.
    `istiod_monitoring` is the control plane's monitoring port (`istiod_name` says whose)."""
    stream = out if out is not None else sys.stdout
    if live is None:
        live = stream.isatty()
    watcher = MeshWatcher(targets, istiod_monitoring, events, istiod_netns=istiod_netns, window=window,
                          istiod_name=istiod_name)
    try:
        if live:
            _run_live(watcher, stop, stream, interval)
        else:
            _run_log(watcher, stop, stream, interval)
    finally:
        watcher.close()


def _run_log(watcher: MeshWatcher, stop: threading.Event, stream: TextIO, interval: float) -> None:
    while not stop.is_set():
        started = time.monotonic()
        view = watcher.step()
        lines = log_lines(view.at, watcher.last_changes)
        if lines:
            stream.write("\n".join(lines) + "\n")
            stream.flush()
        stop.wait(max(0.0, interval - (time.monotonic() - started)))


def _run_live(watcher: MeshWatcher, stop: threading.Event, stream: TextIO, interval: float) -> None:
    from rich.console import Console
    from rich.live import Live

    console = Console(file=stream, force_terminal=True)  # asked for (--live) or a terminal: draw in place
    with Live(console=console, auto_refresh=False, redirect_stdout=False, redirect_stderr=False) as display:
        while not stop.is_set():
            started = time.monotonic()
            view = watcher.step()
            note = f"{len(view.pods)} pods read in {watcher.last_round_s * 1000:.0f} ms"
            display.update(render(view, console.size.height, note), refresh=True)
            stop.wait(max(0.0, interval - (time.monotonic() - started)))

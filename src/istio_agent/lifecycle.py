"""The one lifecycle every program runs its components on: start in order, stop in reverse, share fates.

`pilot-agent proxy`, `install-cni` and `istiod-local serve` are each a list of
components built by their program's composition root. `Lifecycle` knows none
of them by name. It is given its components in stages (a stage is a list, or a
function that builds one when the previous stage has started, so that its
imports happen only then) and:

1. starts them one by one, in the order given (dependency order), then calls `on_started` (the program's
   once-started step, e.g. the agent's `memory.freeze_start_up_objects`);
2. waits for a stop request (`request_stop`: SIGTERM/SIGINT, see `run_until_signalled`; `/quitquitquit`) or
   for a component that shares the program's fate (`wait_exit()`, e.g. Envoy,
   install-cni's installer loop) to end on its own, whose exit code then
   becomes the program's;
3. on a stop request, and only then, drains every component that can drain
   (`drain()`), all at once: Envoy's termination drain, readiness turning false;
4. stops every started component in reverse order, also after a failed start.

There is no global state: two lifecycles can run in one process.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)

# What a program exits with when a component's start fails, or a fate-sharing component fails with an exception.
START_FAILED_EXIT_CODE = 1


class Component(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class FateSharing(Protocol):
    """A component whose end ends the program: `wait_exit()` returns the exit code the program must exit with."""

    async def wait_exit(self) -> int: ...


@runtime_checkable
class Draining(Protocol):
    """A component with something to do before the program stops (called on a stop request only)."""

    async def drain(self) -> None: ...


Stage = Sequence[Component] | Callable[[], Sequence[Component]]


def component_name(component: object) -> str:
    return str(getattr(component, "name", type(component).__name__))


def resident_summary() -> str:
    """This process's resident memory as /proc/self/status gives it (VmRSS, RssAnon, RssFile), for the debug
    line after each component's start that `benchmarks/bench_memory.py` reads; empty off Linux."""
    try:
        with open("/proc/self/status") as status:
            fields = dict(line.split(":", 1) for line in status if line.startswith(("VmRSS", "RssAnon", "RssFile")))
    except OSError:
        return ""
    return ", ".join(f"{key} {int(value.split()[0]) / 1024:.1f} MB" for key, value in fields.items())


class Lifecycle:
    """Runs its components until told to stop or until one that shares its fate ends.

    `name` is the program's, for its log lines ("agent started: ..."), and `logger` the one they go to
    (the program's own, so that they carry its scope; this module's by default). `on_started` runs once,
    when every component has started.
    """

    def __init__(self, *stages: Stage, name: str = "agent", logger: logging.Logger | None = None,
                 on_started: Callable[[], None] | None = None) -> None:
        self.stages = stages
        self.name = name
        self.log = logger or log
        self.on_started = on_started
        self.exit_code = 0
        self.started: list[Component] = []
        self._stopping = asyncio.Event()

    def request_stop(self, exit_code: int = 0) -> None:
        self.exit_code = self.exit_code or exit_code
        self._stopping.set()

    async def run(self) -> int:
        """Run to the end; returns the exit code. A failing start raises after the started ones are stopped."""
        watchers: dict[asyncio.Task[int], Component] = {}
        if self.log.isEnabledFor(logging.DEBUG):
            self.log.debug("starting: %s", resident_summary())
        try:
            for stage in self.stages:
                for component in stage() if callable(stage) else stage:
                    await component.start()
                    self.started.append(component)
                    if self.log.isEnabledFor(logging.DEBUG):  # the allocation budget: every MB has an owner
                        self.log.debug("started %s: %s", component_name(component), resident_summary())
                    if isinstance(component, FateSharing):
                        watchers[asyncio.create_task(component.wait_exit())] = component
            self.log.info("%s started: %s", self.name, ", ".join(component_name(c) for c in self.started))
            if self.on_started is not None:
                self.on_started()
            ended = await self._wait_for_end(watchers)
            if ended is None:
                self.log.info("%s stopping", self.name)
                await self._drain()
        finally:
            for task in watchers:
                task.cancel()
            await self._stop_all()
        return self.exit_code

    async def run_until_signalled(self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT),
                                  on_signal: Callable[[], None] | None = None) -> int:
        """`run`, with `signals` as stop requests (handlers on the running loop for as long as the run lasts;
        `on_signal` is called first, e.g. to log the signal)."""
        loop = asyncio.get_running_loop()

        def stop() -> None:
            if on_signal is not None:
                on_signal()
            self.request_stop()

        for signum in signals:
            loop.add_signal_handler(signum, stop)
        try:
            return await self.run()
        finally:
            for signum in signals:
                loop.remove_signal_handler(signum)

    async def _wait_for_end(self, watchers: dict[asyncio.Task[int], Component]) -> Component | None:
        """Wait for a stop request (None) or the first fate-sharing component to end (that component)."""
        stop = asyncio.create_task(self._stopping.wait())
        try:
            done, _ = await asyncio.wait([stop, *watchers], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        for task in done:
            if task in watchers:
                component = watchers[task]
                code = task.result() if task.exception() is None else START_FAILED_EXIT_CODE
                self.log.warning("%s ended on its own: the %s exits with %d", component_name(component), self.name,
                                 code)
                self.exit_code = self.exit_code or code
                return component
        return None

    async def _drain(self) -> None:
        drains = [c.drain() for c in self.started if isinstance(c, Draining)]
        results = await asyncio.gather(*drains, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                self.log.error("draining failed: %s", result)

    async def _stop_all(self) -> None:
        for component in reversed(self.started):
            try:
                await component.stop()
            except Exception:
                self.log.exception("stopping %s failed", component_name(component))
            else:
                self.log.debug("stopped %s", component_name(component))
        self.started.clear()

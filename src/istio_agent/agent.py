"""The agent: runs a list of components in order, shares their fate, drains, and stops them in reverse.

`Agent` knows nothing about certificates, Envoy or DNS. It is given its
components in stages (a stage is a list, or a function that builds one when
the previous stage has started, so that its imports happen only then) and:

1. starts them one by one, in the order given (dependency order);
2. waits for a stop request (`request_stop`: SIGTERM/SIGINT, `/quitquitquit`) or
   for a component that shares the agent's fate (`wait_exit()`, e.g. Envoy) to
   end on its own, whose exit code then becomes the agent's;
3. on a stop request, and only then, drains every component that can drain
   (`drain()`), all at once: Envoy's termination drain, readiness turning false;
4. stops every started component in reverse order, also after a failed start.

What the components are and how they are wired is `assembly.py`'s business;
`pilot-agent proxy` runs `run()` below. There is no global state: two agents
can run in one process.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from istio_agent.config.errors import ConfigError
from istio_agent.config.options import AgentFlags, AgentOptions, load_agent_options

if TYPE_CHECKING:
    from istio_agent.security.key_ahead import KeyAhead

log = logging.getLogger(__name__)

# What `pilot-agent proxy` exits with when the configuration or a component's start fails.
START_FAILED_EXIT_CODE = 1


class Component(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class FateSharing(Protocol):
    """A component whose end ends the agent: `wait_exit()` returns the exit code the agent must exit with."""

    async def wait_exit(self) -> int: ...


@runtime_checkable
class Draining(Protocol):
    """A component with something to do before the agent stops (called on a stop request only)."""

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


class Agent:
    """Runs its components until told to stop or until one that shares its fate ends."""

    def __init__(self, *stages: Stage) -> None:
        self.stages = stages
        self.exit_code = 0
        self.started: list[Component] = []
        self._stopping = asyncio.Event()

    def request_stop(self, exit_code: int = 0) -> None:
        self.exit_code = self.exit_code or exit_code
        self._stopping.set()

    async def run(self) -> int:
        """Run to the end; returns the exit code. A failing start raises after the started ones are stopped."""
        watchers: dict[asyncio.Task[int], Component] = {}
        if log.isEnabledFor(logging.DEBUG):
            log.debug("starting: %s", resident_summary())
        try:
            for stage in self.stages:
                for component in stage() if callable(stage) else stage:
                    await component.start()
                    self.started.append(component)
                    if log.isEnabledFor(logging.DEBUG):  # the allocation budget: every MB has an owner
                        log.debug("started %s: %s", component_name(component), resident_summary())
                    if isinstance(component, FateSharing):
                        watchers[asyncio.create_task(component.wait_exit())] = component
            log.info("agent started: %s", ", ".join(component_name(c) for c in self.started))
            ended = await self._wait_for_end(watchers)
            if ended is None:
                log.info("agent stopping")
                await self._drain()
        finally:
            for task in watchers:
                task.cancel()
            await self._stop_all()
        return self.exit_code

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
                log.warning("%s ended on its own: the agent exits with %d", component_name(component), code)
                self.exit_code = self.exit_code or code
                return component
        return None

    async def _drain(self) -> None:
        drains = [c.drain() for c in self.started if isinstance(c, Draining)]
        results = await asyncio.gather(*drains, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                log.error("draining failed: %s", result)

    async def _stop_all(self) -> None:
        for component in reversed(self.started):
            try:
                await component.stop()
            except Exception:
                log.exception("stopping %s failed", component_name(component))
        self.started.clear()


def load_options(flags: AgentFlags) -> AgentOptions | None:
    """`pilot-agent proxy`'s options, or None after printing the error (the caller exits with 1)."""
    try:
        return load_agent_options(flags)
    except ConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return None


def run_agent(options: AgentOptions, cap_malloc_arenas: bool = True, first_key: KeyAhead | None = None) -> int:
    """Run the agent for `options` on a new event loop; its exit code.

    `cap_malloc_arenas` is false when the operator set MALLOC_ARENA_MAX, which glibc has then applied.
    `first_key` is the workload key made ahead since the CLI started (`security/key_ahead.py`), if any.
    """
    import signal

    from istio_agent.assembly import assemble
    from istio_agent.eventloop import new_event_loop
    from istio_agent.memory import limit_malloc_arenas

    if cap_malloc_arenas:
        limit_malloc_arenas()
    # asyncio's own loop, not uvloop: gRPC moves the agent's bytes on its own threads, and this loop carries
    # only gRPC's completions, the status server and Envoy's supervision. Measured by bench_memory (A/B, two
    # runs each): uvloop's import, loop and libuv workers cost the proxyless agent 2.6 MB RSS / 1.1 MB
    # anonymous and the sidecar 0.3-1 MB; bench_xds's push ratio did not move. The DNS proxy's own io thread
    # keeps its choice (DnsProxyOptions.use_uvloop), where uvloop serves the queries.
    loop = new_event_loop(prefer_uvloop=False)
    asyncio.set_event_loop(loop)
    agent = assemble(options, first_key)
    for sig in (signal.SIGTERM, signal.SIGINT):  # first: from here on a SIGTERM is a graceful stop
        loop.add_signal_handler(sig, agent.request_stop)
    for var in options.without_effect:
        log.warning("environment variable %s is set but has no effect here: %s", var.name, var.note)
    try:
        return loop.run_until_complete(agent.run())
    except (ConfigError, OSError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return START_FAILED_EXIT_CODE
    finally:
        loop.close()

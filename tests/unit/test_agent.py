"""The Agent in-process, with stand-in components: start order, fate-sharing, drain decisions, reverse stop."""

from __future__ import annotations

import asyncio

import pytest
from fakes import RecordingPart as Part

from istio_agent.agent.assembly import Agent
from istio_agent.lifecycle import Component


class Drains(Part):
    """Has a drain step; the drain waits until `release` is set, so a test sees drains overlap."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__(name, log)
        self.release = asyncio.Event()

    async def drain(self) -> None:
        self.log.append(f"drain {self.name}")
        await self.release.wait()
        self.log.append(f"drained {self.name}")


class SharesFate(Part):
    """Ends on its own when `end(code)` is called, like Envoy exiting."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__(name, log)
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def end(self, code: int) -> None:
        self.exited.set_result(code)

    async def wait_exit(self) -> int:
        return await asyncio.shield(self.exited)

    async def drain(self) -> None:
        self.log.append(f"drain {self.name}")


async def started(agent: Agent, count: int) -> None:
    while len(agent.started) < count:
        await asyncio.sleep(0)


async def test_components_start_in_order_and_stop_in_reverse_on_a_stop_request() -> None:
    log: list[str] = []
    built: list[str] = []

    def second_stage() -> list[Component]:
        built.append(f"built after {log[-1]}")
        return [Part("xds", log), Part("status", log)]

    agent = Agent([Part("identity", log)], second_stage)
    run = asyncio.create_task(agent.run())
    await started(agent, 3)
    agent.request_stop()
    assert await run == 0
    assert built == ["built after start identity"], "a stage is built only once the one before it has started"
    assert log == ["start identity", "start xds", "start status", "stop status", "stop xds", "stop identity"]


async def test_a_fate_sharing_component_ending_ends_the_agent_with_its_code_and_nothing_drains() -> None:
    log: list[str] = []
    envoy = SharesFate("envoy", log)
    status = Drains("status", log)
    agent = Agent([Part("identity", log), status, envoy])
    run = asyncio.create_task(agent.run())
    await started(agent, 3)
    envoy.end(255)  # Envoy failed: upstream's pilot-agent exits -1
    assert await run == 255
    assert not any(entry.startswith("drain") for entry in log), "no drain when a component died on its own"
    assert log[-3:] == ["stop envoy", "stop status", "stop identity"]


async def test_a_stop_request_drains_every_draining_component_at_once_then_stops_them() -> None:
    log: list[str] = []
    status, envoy = Drains("status", log), Drains("envoy", log)
    agent = Agent([Part("identity", log), status, envoy])
    run = asyncio.create_task(agent.run())
    await started(agent, 3)
    agent.request_stop()
    while "drain envoy" not in log or "drain status" not in log:
        await asyncio.sleep(0)
    assert not any(entry.startswith("stop") for entry in log), "nothing stops while draining"
    status.release.set()
    envoy.release.set()
    assert await run == 0
    assert log[-3:] == ["stop envoy", "stop status", "stop identity"]


async def test_the_first_exit_code_asked_for_wins() -> None:
    agent = Agent([Part("only", [])])
    agent.request_stop(3)
    agent.request_stop(0)
    assert await agent.run() == 3


async def test_a_failed_start_stops_what_started_and_raises() -> None:
    log: list[str] = []
    agent = Agent([Part("identity", log), Part("status", log, fail_start=OSError("status could not bind")),
                   Part("envoy", log)])
    with pytest.raises(OSError, match="status could not bind"):
        await agent.run()
    assert log == ["start identity", "start status", "stop identity"]


async def test_a_failing_stop_does_not_keep_the_others_running() -> None:
    log: list[str] = []
    agent = Agent([Part("identity", log), Part("xds", log, fail_stop=RuntimeError("stop failed")), Part("status", log)])
    agent.request_stop()
    assert await agent.run() == 0
    assert log[-3:] == ["stop status", "stop xds", "stop identity"]


async def test_a_stop_request_during_start_still_drains_once_everything_started() -> None:
    log: list[str] = []
    envoy = SharesFate("envoy", log)

    class AsksToStop(Part):
        async def start(self) -> None:
            await super().start()
            agent.request_stop()

    agent = Agent([AsksToStop("status", log), envoy])
    assert await agent.run() == 0
    assert log == ["start status", "start envoy", "drain envoy", "stop envoy", "stop status"]


async def test_on_started_runs_once_every_component_has_started_and_before_any_stops() -> None:
    log: list[str] = []
    agent = Agent([Part("identity", log)], lambda: [Part("xds", log), Part("envoy", log)],
                  on_started=lambda: log.append("started"))
    agent.request_stop()
    assert await agent.run() == 0
    assert log == ["start identity", "start xds", "start envoy", "started", "stop envoy", "stop xds",
                   "stop identity"]


async def test_on_started_does_not_run_when_a_start_fails() -> None:
    log: list[str] = []
    agent = Agent([Part("identity", log), Part("status", log, fail_start=OSError("status could not bind"))],
                  on_started=lambda: log.append("x"))
    with pytest.raises(OSError):
        await agent.run()
    assert "x" not in log

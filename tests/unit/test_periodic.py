"""The shared polling loop: steps run until stop(), start is idempotent, stop is safe before start."""

from __future__ import annotations

import asyncio

import pytest
from support import eventually

from istio_agent import memory
from istio_agent.clock import VirtualClock
from istio_agent.memory import MemoryTrimmer
from istio_agent.periodic import Periodic


async def test_steps_run_until_stopped_and_start_twice_runs_one_loop() -> None:
    calls: list[asyncio.Task[object] | None] = []

    async def step() -> None:
        calls.append(asyncio.current_task())

    ticker = Periodic(0.001, step, "test-ticker")
    await ticker.start()
    await ticker.start()
    await eventually(lambda: len(calls) >= 3, "three steps")
    await ticker.stop()
    assert len({id(task) for task in calls}) == 1  # one loop, however often start() was called
    assert all(task is not None and task.get_name() == "test-ticker" for task in calls)
    count = len(calls)
    await asyncio.sleep(0.01)  # stopped: no step may run any more
    assert len(calls) == count


async def test_stop_without_start_and_twice_is_harmless() -> None:
    async def step() -> None:
        raise AssertionError("never started")

    ticker = Periodic(0.001, step, "idle")
    await ticker.stop()
    await ticker.start()
    await ticker.stop()
    await ticker.stop()


async def test_a_failing_step_ends_the_loop_and_stop_reports_it() -> None:
    failed = asyncio.Event()

    async def step() -> None:
        failed.set()
        raise RuntimeError("boom")

    ticker = Periodic(0.001, step, "failing")
    await ticker.start()
    await asyncio.wait_for(failed.wait(), 10)  # the loop's task ends with the step's exception
    with pytest.raises(RuntimeError, match="boom"):
        await ticker.stop()


class FakeLibc:
    """glibc's two memory knobs, counting the trims (what they do to the heap is glibc's business)."""

    def __init__(self) -> None:
        self.trims = 0

    def malloc_trim(self, pad: int) -> int:
        assert pad == 0, "trim everything above the heap's minimum"
        self.trims += 1
        return 1

    def mallopt(self, option: int, value: int) -> int:
        return 1


async def test_memory_trimmer_trims_every_interval_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = FakeLibc()
    monkeypatch.setattr(memory, "_libc", lambda: libc)
    trimmer = MemoryTrimmer(interval=0.001)
    await trimmer.start()
    await eventually(lambda: libc.trims >= 3, "three trims", timeout=5)
    await trimmer.stop()
    count = libc.trims
    await asyncio.sleep(0.01)  # stopped: ten more intervals bring no trim
    assert libc.trims == count


async def test_memory_trimmer_is_a_no_op_without_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_libc", lambda: None)
    trimmer = MemoryTrimmer(interval=0.001)
    await trimmer.start()
    await asyncio.sleep(0.01)
    # A trim without a libc would fail its step, and stop() would re-raise that: nothing ran.
    await trimmer.stop()


def test_memory_trimmer_soon_trims_once_a_burst_is_over(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = FakeLibc()
    monkeypatch.setattr(memory, "_libc", lambda: libc)

    async def scenario() -> None:
        trimmer = MemoryTrimmer(interval=3600, settle=1.0)
        trimmer.soon()  # not started: nothing to do
        await trimmer.start()
        for _ in range(10):  # a stream closes every half second for five seconds
            trimmer.soon()
            await asyncio.sleep(0.5)
        assert libc.trims == 0  # the last close is only half a second old
        await asyncio.sleep(0.6)
        assert libc.trims == 1
        await asyncio.sleep(10)
        assert libc.trims == 1  # one trim for the whole burst
        trimmer.soon()
        await trimmer.stop()  # a trim asked for and not yet run goes with the trimmer
        await asyncio.sleep(5)
        assert libc.trims == 1

    VirtualClock().run(scenario())


def test_glibc_is_called_through_ctypes_extension_directly() -> None:
    """The real knobs answer as glibc documents (1: done / memory released, 0: nothing to release)."""
    import platform

    libc = memory._libc()
    if platform.libc_ver()[0] != "glibc":
        assert libc is None
        return
    assert libc is not None
    assert libc.mallopt(memory.M_ARENA_MAX, 8) == 1  # this test process's own cap: harmless
    assert libc.malloc_trim(0) in (0, 1)


def test_freezing_start_up_objects_takes_them_out_of_the_collectors_walks() -> None:
    import gc

    keep = [[object()] for _ in range(100)]  # tracked containers alive "since start-up"
    gc.unfreeze()
    try:
        memory.freeze_start_up_objects()
        assert gc.get_freeze_count() >= len(keep)
        assert not any(obj is keep for obj in gc.get_objects()), "a frozen object is no longer walked"
    finally:
        gc.unfreeze()

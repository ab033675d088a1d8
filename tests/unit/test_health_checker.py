"""The workload health checker's rules: thresholds into state changes, the probe schedule, and the runner in
virtual time (initial delay, period, only changes reported, a hung probe failing, Envoy's readiness first)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from istio_agent.clock import VirtualClock
from istio_agent.envoy.admin import AdminError
from istio_agent.health.checker import HealthChange, HealthThresholds, next_probe_at
from istio_agent.health.options import ExecAction, HealthCheckOptions
from istio_agent.health.probers import EnvoyReadyProbe, Outcome, Probe
from istio_agent.health.runner import WorkloadHealthChecker

OK: Outcome = (True, "")


def bad(message: str = "down") -> Outcome:
    return (False, message)


def run(thresholds: HealthThresholds, results: list[Outcome]) -> list[HealthChange | None]:
    return [thresholds.observe(healthy, message) for healthy, message in results]


# ---- thresholds -----------------------------------------------------------------------------------------


def test_threshold_one_reports_the_first_result_at_once_then_only_changes() -> None:
    changes = run(HealthThresholds(1, 1), [OK, OK, OK, bad("refused"), bad("refused"), OK])
    assert changes == [HealthChange(True), None, None, HealthChange(False, "refused"), None, HealthChange(True)]


def test_the_first_report_waits_for_a_threshold_whichever_state_it_is() -> None:
    assert run(HealthThresholds(2, 3), [OK, OK]) == [None, HealthChange(True)]
    assert run(HealthThresholds(2, 3), [bad(), bad(), bad("third")]) == [None, None, HealthChange(False, "third")]


def test_counts_must_be_consecutive() -> None:
    thresholds = HealthThresholds(2, 3)
    run(thresholds, [OK, OK])
    # Two failures, a success, two failures: never three in a row, never unhealthy.
    assert run(thresholds, [bad(), bad(), OK, bad(), bad()]) == [None] * 5
    assert run(thresholds, [bad("now")]) == [HealthChange(False, "now")]
    # One success then a failure: the success count starts again.
    assert run(thresholds, [OK, bad(), OK, OK]) == [None, None, None, HealthChange(True)]


def test_staying_in_a_state_never_reports_again_however_long() -> None:
    thresholds = HealthThresholds(1, 2)
    changes = run(thresholds, [bad()] * 10)
    assert [c for c in changes if c is not None] == [HealthChange(False, "down")]


# ---- schedule ---------------------------------------------------------------------------------------------


def test_ticks_follow_the_end_of_the_first_probe() -> None:
    # First probe ran 5.0-5.3: the ticker starts at 5.3.
    assert next_probe_at(5.3, 10, started=5.0, ended=5.3) == pytest.approx(15.3)
    assert next_probe_at(5.3, 10, started=15.3, ended=15.4) == pytest.approx(25.3)


def test_a_probe_overrunning_the_period_is_followed_at_once_and_missed_ticks_are_dropped() -> None:
    assert next_probe_at(0, 10, started=10, ended=12) == 20  # within the period: the next tick
    assert next_probe_at(0, 10, started=10, ended=25) == 25  # overran one tick: run at once
    assert next_probe_at(0, 10, started=10, ended=47) == 47  # overran three: one run, not three
    assert next_probe_at(0, 10, started=47, ended=48) == 50  # then back on the grid


def test_the_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="period"):
        next_probe_at(0, 0, 0, 0)


# ---- the runner in virtual time ----------------------------------------------------------------------------


class Script:
    """A probe whose answer depends on the virtual time; records when it ran."""

    def __init__(self, clock: VirtualClock, answer: Callable[[float], Outcome], takes: float = 0.0) -> None:
        self.clock, self.answer, self.takes = clock, answer, takes
        self.times: list[float] = []

    async def __call__(self) -> Outcome:
        self.times.append(self.clock.elapsed())
        if self.takes:
            await asyncio.sleep(self.takes)
        return self.answer(self.times[-1])


def options(**kw: float) -> HealthCheckOptions:
    return HealthCheckOptions(action=ExecAction(("true",)), **kw)  # type: ignore[arg-type]


def scenario(clock: VirtualClock, checker_options: HealthCheckOptions, probes: list[Probe], seconds: float,
             ) -> list[tuple[float, bool, str]]:
    reports: list[tuple[float, bool, str]] = []
    checker = WorkloadHealthChecker(checker_options, probes,
                                    lambda healthy, message: reports.append((clock.elapsed(), healthy, message)),
                                    clock=clock)

    async def main() -> None:
        await checker.start()
        await asyncio.sleep(seconds)
        await checker.stop()

    clock.run(main())
    return reports


def test_initial_delay_then_every_period_and_only_changes_reported() -> None:
    clock = VirtualClock()
    # Healthy, then the app stops at t=40 and comes back at t=80.
    app = Script(clock, lambda t: bad("connection refused") if 40 <= t < 80 else OK)
    reports = scenario(clock, options(initial_delay=5, period=10, failure_threshold=3, success_threshold=2),
                       [app], 120)
    assert app.times == pytest.approx([5, 15, 25, 35, 45, 55, 65, 75, 85, 95, 105, 115])
    # Success threshold 2: healthy at the second probe; 3 failures (45, 55, 65); 2 successes (85, 95).
    assert reports == [(15, True, ""), (65, False, "connection refused"), (95, True, "")]


def test_a_probe_that_hangs_past_its_timeout_is_a_failure_and_checking_goes_on() -> None:
    clock = VirtualClock()
    hung = Script(clock, lambda t: OK, takes=3600)
    reports = scenario(clock, options(period=10, timeout=2, failure_threshold=2), [hung], 25)
    # Each hang is cut at its timeout (+ the grace), the ticker starting when the first one was: 2.5 s.
    assert hung.times == pytest.approx([0, 12.5, 22.5])
    assert len(reports) == 1 and reports[0][1] is False and "within 2s" in reports[0][2]


def test_envoy_not_ready_fails_the_probe_first_and_the_app_is_not_asked() -> None:
    clock = VirtualClock()
    envoy = Script(clock, lambda t: OK if t >= 20 else bad("config not received from XDS server"))
    app = Script(clock, lambda t: OK)
    reports = scenario(clock, options(period=10), [envoy, app], 35)
    assert envoy.times == [0, 10, 20, 30]
    assert app.times == [20, 30]
    assert reports == [(0, False, "config not received from XDS server"), (20, True, "")]


def test_a_probe_raising_counts_as_a_failure() -> None:
    clock = VirtualClock()

    async def broken() -> Outcome:
        raise RuntimeError("bug")

    reports = scenario(clock, options(period=10), [broken], 15)
    assert reports == [(0, False, "probe failed: bug")]


# ---- Envoy's readiness -----------------------------------------------------------------------------------------


class FakeAdmin:
    """Envoy's /stats as the readiness check reads them: first unreachable, then configured and LIVE."""

    def __init__(self) -> None:
        self.calls = 0
        self.stage = "down"

    async def stats(self, filter_regex: str, used_only: bool = True) -> str:
        self.calls += 1
        if self.stage == "down":
            raise AdminError("connection refused")
        if "cds" in filter_regex:
            lds = "1" if self.stage == "live" else "0"
            return f"cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: {lds}\n"
        return "server.state: 0\nlistener_manager.workers_started: 1\n"


async def test_envoy_readiness_is_the_ready_rules_and_is_not_asked_once_ready() -> None:
    admin = FakeAdmin()
    probe = EnvoyReadyProbe(admin)  # type: ignore[arg-type]
    healthy, message = await probe()
    assert not healthy and "connection refused" in message
    admin.stage = "no-lds"
    healthy, message = await probe()
    assert not healthy and message.startswith("config not fully received from XDS server")
    admin.stage = "live"
    assert await probe() == (True, "")
    calls = admin.calls
    admin.stage = "down"  # once ready, Envoy stays ready for the checker: not asked again
    assert await probe() == (True, "")
    assert admin.calls == calls

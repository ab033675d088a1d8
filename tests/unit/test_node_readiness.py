"""The node's wait for many pods (`node/readiness.py`): rounds over what is still pending, a dead process
or the deadline ending the wait with a message naming the pod, all on a fake clock and a fake prober."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from istiod_local.node.readiness import ROUND_INTERVAL, ReadinessRounds, Target, wait_all


def _target(name: str) -> Target:
    return Target(name, f"pod {name} to be ready", "10.244.0.9", 15021, "/healthz/ready")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class ScriptedProber:
    """Each target is ready from its given round on (1-based); before that it answers 503."""

    def __init__(self, ready_from: dict[str, int]) -> None:
        self.ready_from = ready_from
        self.rounds: list[list[str]] = []

    def round(self, targets: Iterable[Target]) -> dict[str, str | None]:
        keys = [t.key for t in targets]
        self.rounds.append(keys)
        n = len(self.rounds)
        return {key: None if n >= self.ready_from[key] else "HTTP 503" for key in keys}


def test_each_round_probes_only_what_is_still_pending_until_all_are_ready() -> None:
    clock, prober = Clock(), ScriptedProber({"a": 1, "b": 3, "c": 2})
    error = wait_all(prober, [_target("a"), _target("b"), _target("c")], 30, lambda _: None,
                     now=lambda: clock.now, sleep=clock.sleep)
    assert error is None
    assert prober.rounds == [["a", "b", "c"], ["b", "c"], ["b"]]
    assert clock.sleeps == [ROUND_INTERVAL, ROUND_INTERVAL]


def test_the_deadline_names_the_first_pending_pod_how_many_others_and_its_last_error() -> None:
    clock, prober = Clock(), ScriptedProber({"a": 1, "b": 10**6, "c": 10**6})
    error = wait_all(prober, [_target("a"), _target("b"), _target("c")], 5, lambda _: None,
                     now=lambda: clock.now, sleep=clock.sleep)
    assert error == "timed out after 5s waiting for pod b to be ready (and 1 more: c): HTTP 503"
    assert 5 <= sum(clock.sleeps) <= 5 + 2 * ROUND_INTERVAL


def test_a_dead_process_of_a_pending_pod_ends_the_wait_at_once() -> None:
    clock, prober = Clock(), ScriptedProber({"a": 1, "b": 10**6})
    asked: list[list[str]] = []

    def died(pending: Sequence[Target]) -> str | None:
        asked.append([t.key for t in pending])
        return "b pilot-agent exited with 1; last log lines:\nboom"

    error = wait_all(prober, [_target("a"), _target("b")], 60, died, now=lambda: clock.now, sleep=clock.sleep)
    assert error == "while waiting for pod b to be ready: b pilot-agent exited with 1; last log lines:\nboom"
    assert asked == [["b"]]  # only the pods still waited for are watched
    assert clock.sleeps == []


def test_rounds_keep_the_last_error_of_a_target_that_became_ready_later() -> None:
    rounds = ReadinessRounds([_target("a"), _target("b")], deadline=10)
    rounds.record({"a": "connection refused", "b": "HTTP 503"})
    rounds.record({"a": None, "b": "HTTP 500"})
    assert [t.key for t in rounds.pending] == ["b"] and not rounds.done
    assert rounds.last_error == {"a": "connection refused", "b": "HTTP 500"}
    assert rounds.expired(10.5) and not rounds.expired(9)
    rounds.record({"b": None})
    assert rounds.done

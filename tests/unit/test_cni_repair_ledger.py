"""The repair ledger: once per resourceVersion, retries with backoff, bounded attempts, a new pod starts afresh."""

from __future__ import annotations

from istio_agent.cni.repair.ledger import MAX_ATTEMPTS, Backoff, Ledger

KEY = ("default", "p")


def test_a_broken_version_is_queued_once_and_acted_on_once() -> None:
    ledger = Ledger()
    assert ledger.wants(KEY, "u1", "7")
    assert not ledger.wants(KEY, "u1", "7")  # already queued
    assert ledger.due(KEY, "u1", "7")
    ledger.done(KEY, "u1", "7")
    assert not ledger.wants(KEY, "u1", "7")  # a re-list of the same version
    assert ledger.wants(KEY, "u1", "8")  # a new version of a still broken pod is judged again


def test_the_worker_skips_a_version_handled_meanwhile() -> None:
    ledger = Ledger()
    assert ledger.wants(KEY, "u1", "7")
    ledger.done(KEY, "u1", "7")
    assert not ledger.due(KEY, "u1", "7")


def test_failures_back_off_and_give_up_after_max_attempts() -> None:
    ledger = Ledger(Backoff(first=0.5, cap=30))
    assert ledger.wants(KEY, "u1", "7")
    delays = []
    for _ in range(MAX_ATTEMPTS):
        assert ledger.due(KEY, "u1", "7")
        delays.append(ledger.failed(KEY, "u1", "7"))
    assert delays == [0.5, 1.0, 2.0, 4.0, None]
    assert not ledger.wants(KEY, "u1", "7")  # given up at this version
    assert ledger.wants(KEY, "u1", "8")  # ...until the pod changes
    assert ledger.due(KEY, "u1", "8")
    assert ledger.failed(KEY, "u1", "8") == 0.5  # attempts start afresh


def test_a_queued_retry_blocks_requeueing_until_taken() -> None:
    ledger = Ledger()
    assert ledger.wants(KEY, "u1", "7") and ledger.due(KEY, "u1", "7")
    assert ledger.failed(KEY, "u1", "7") is not None
    assert not ledger.wants(KEY, "u1", "8")  # the retry takes the latest version
    assert ledger.due(KEY, "u1", "8")


def test_settled_and_forgotten_pods() -> None:
    ledger = Ledger()
    assert ledger.wants(KEY, "u1", "7")
    ledger.settled(KEY)
    assert ledger.wants(KEY, "u1", "8")
    ledger.done(KEY, "u1", "8")
    ledger.forget(KEY)
    assert len(ledger) == 0
    assert ledger.wants(KEY, "u1", "8")  # forgotten: a pod seen again is judged again


def test_a_new_uid_under_the_same_name_starts_afresh() -> None:
    ledger = Ledger()
    assert ledger.wants(KEY, "u1", "7")
    ledger.done(KEY, "u1", "7")
    assert ledger.wants(KEY, "u2", "7")


def test_backoff_caps() -> None:
    assert Backoff(first=1, cap=5).delay(10) == 5
    assert Backoff(first=1, cap=5).delay(0) == 1

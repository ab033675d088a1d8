"""The workload certificate's lifecycle, event by event, with plain numbers for time."""

from __future__ import annotations

from istio_agent.security.core.cert_lifecycle import (
    CertificateLifecycle,
    Expire,
    Push,
    RenewalPolicy,
    Request,
    Retry,
    Write,
)
from istio_agent.security.core.secrets import SecretItem

HOUR = 3600.0


def cert(created: float, lifetime: float = HOUR, root: bytes = b"root-1") -> SecretItem:
    return SecretItem("default", cert_chain=b"chain", private_key=b"key", root_cert=root,
                      created=created, expires=created + lifetime)


def lifecycle(jitter: float = 0.0, rand: float = 0.5) -> CertificateLifecycle:
    return CertificateLifecycle(RenewalPolicy(0.5, jitter, retry_initial=0.1, retry_max=10.0), lambda: rand)


def test_prewarm_asks_once_and_concurrent_demand_joins() -> None:
    life = lifecycle()
    assert life.start(0.0) == [Request()]
    assert life.demand(0.1) == [], "a request is already in flight"
    assert life.deadline() is None, "nothing to time while waiting for the CA without a certificate"


def test_first_certificate_is_written_not_pushed_and_rotation_is_scheduled() -> None:
    life = lifecycle()
    life.start(0.0)
    first = cert(0.0)
    assert life.issued(first, 0.0) == [Write(first)]
    assert life.rotate_at == life.deadline() == 1800.0
    assert life.timer(1799.0) == []
    assert life.valid(1799.0) is first
    assert life.timer(1800.0) == [Request()]
    second = cert(1800.0)
    assert life.issued(second, 1800.0) == [Write(second), Push("default")]
    assert life.deadline() == 3600.0


def test_jitter_spreads_the_rotation_time() -> None:
    early, late = lifecycle(jitter=0.01, rand=1.0), lifecycle(jitter=0.01, rand=0.0)
    for life in (early, late):
        life.start(0.0)
        life.issued(cert(0.0), 0.0)
    assert early.rotate_at == 1800.0 - 36.0
    assert late.rotate_at == 1800.0 + 36.0


def test_a_new_root_pushes_rootca_too() -> None:
    life = lifecycle()
    life.start(0.0)
    life.issued(cert(0.0), 0.0)
    life.timer(1800.0)
    renewed = cert(1800.0, root=b"root-2")
    assert life.issued(renewed, 1800.0) == [Write(renewed), Push("default"), Push("ROOTCA")]
    assert life.last_root == b"root-2"


def test_failures_back_off_and_the_certificate_expires_exactly_at_its_expiry() -> None:
    life = lifecycle()
    life.start(0.0)
    first = cert(0.0)
    life.issued(first, 0.0)
    now = 1800.0
    delays = []
    assert life.timer(now) == [Request()]
    while now < HOUR:
        (retry,) = life.failed("CA is down", now)
        assert isinstance(retry, Retry) and retry.serving == (now < HOUR)
        delays.append(retry.delay)
        deadline = life.deadline()
        assert deadline is not None and deadline == min(now + retry.delay, HOUR)
        now = deadline
        actions = life.timer(now)
        if now == HOUR:
            assert actions[0] == Expire(first)
            break
        assert actions == [Request()]
    assert delays[:4] == [0.1, 0.2, 0.4, 0.8]
    assert max(delays) == 10.0
    assert life.valid(HOUR) is None, "never served at or after its expiry"


def test_on_demand_without_prewarm_never_schedules_rotation() -> None:
    life = lifecycle()
    assert life.demand(0.0) == [Request()]
    item = cert(0.0)
    assert life.issued(item, 0.0) == [Write(item)]
    assert life.deadline() == HOUR, "only the expiry is timed"
    assert life.timer(1800.0) == []
    assert life.failed("boom", 10.0) == [Retry("boom", 0.1, serving=True)]


def test_stop_cancels_scheduled_requests() -> None:
    life = lifecycle()
    life.start(0.0)
    life.issued(cert(0.0), 0.0)
    life.stop()
    assert life.deadline() == HOUR
    assert life.timer(2000.0) == []

"""Rotation schedule and retry pacing: pure arithmetic, checked exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from istio_agent.security.core.rotation import Backoff, ca_retry_delay, jittered_ratio, rotation_time

HOUR = 3600.0
T0 = 1_700_000_000.0


@pytest.mark.parametrize(
    ("ratio", "after"),
    [(0.5, 30 * 60), (0.25, 45 * 60), (0.75, 15 * 60)],
)
def test_one_hour_certificate_rotates_at_the_grace_ratio(ratio: float, after: float) -> None:
    # rand=0.5 is the middle of the jitter range: no jitter.
    at = rotation_time(T0, T0 + HOUR, ratio, 0.01, 0.5, now=T0)
    assert at == pytest.approx(T0 + after)


def test_expired_certificate_rotates_now() -> None:
    now = T0 + 2 * HOUR
    assert rotation_time(T0, T0 + HOUR, 0.5, 0.01, 0.5, now=now) == now


def test_rotation_is_never_in_the_past() -> None:
    # Half the lifetime is already gone and ratio 0.75 asks for rotation at 15 min: that moment has passed.
    now = T0 + 40 * 60
    assert rotation_time(T0, T0 + HOUR, 0.75, 0.0, 0.5, now=now) == now


def test_jitter_moves_rotation_both_ways() -> None:
    early = rotation_time(T0, T0 + HOUR, 0.5, 0.1, 1.0, now=T0)
    late = rotation_time(T0, T0 + HOUR, 0.5, 0.1, 0.0, now=T0)
    assert early == pytest.approx(T0 + 0.4 * HOUR)
    assert late == pytest.approx(T0 + 0.6 * HOUR)


@given(
    ratio=st.floats(0.0, 1.0),
    jitter=st.floats(0.0, 2.0),
    rand=st.floats(0.0, 1.0, exclude_max=True),
    lifetime=st.floats(1.0, 1e7),
    elapsed=st.floats(0.0, 2e7),
)
def test_rotation_stays_within_the_certificate(
    ratio: float, jitter: float, rand: float, lifetime: float, elapsed: float
) -> None:
    now = T0 + elapsed
    at = rotation_time(T0, T0 + lifetime, ratio, jitter, rand, now=now)
    assert at >= now
    assert at <= max(now, T0 + lifetime)
    assert 0.0 <= jittered_ratio(ratio, jitter, rand) <= 1.0


def test_backoff_grows_to_its_cap_and_resets() -> None:
    backoff = Backoff(initial=0.1, maximum=1.0, multiplier=2.0, spread=0.0)
    delays = [backoff.next() for _ in range(6)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    backoff.reset()
    assert backoff.next() == pytest.approx(0.1)


def test_backoff_jitter_stays_within_spread() -> None:
    high = Backoff(initial=1.0, maximum=10.0, spread=0.1, rand=lambda: 0.999999)
    low = Backoff(initial=1.0, maximum=10.0, spread=0.1, rand=lambda: 0.0)
    assert high.next() == pytest.approx(1.1, rel=1e-4)
    assert low.next() == pytest.approx(0.9)


def test_ca_retry_delays_are_exponential_from_100ms() -> None:
    assert [ca_retry_delay(n, 0.5) for n in range(5)] == pytest.approx([0.0, 0.1, 0.2, 0.4, 0.8])
    assert ca_retry_delay(1, 0.0) == pytest.approx(0.09)
    assert ca_retry_delay(1, 1.0) == pytest.approx(0.11)

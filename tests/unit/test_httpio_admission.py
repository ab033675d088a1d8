"""Connection slots shared by source (`httpio.admission`): a flooding client competes with itself, never with a
request being answered."""

from __future__ import annotations

import pytest

from istio_agent.httpio.admission import ConnectionSlots


def test_a_source_at_its_limit_replaces_its_own_least_used_connection() -> None:
    slots: ConnectionSlots[str] = ConnectionSlots(max_connections=10, max_per_source=2)
    assert slots.admit("a1", "10.0.0.1").admitted and slots.admit("a2", "10.0.0.1").admitted
    assert slots.admit("b1", "10.0.0.2").evict is None
    slots.served("a1")  # a1 completed a request: a2 (which never did) goes first
    decision = slots.admit("a3", "10.0.0.1")
    assert decision.admitted and decision.evict == "a2"
    assert slots.count("10.0.0.1") == 2 and slots.count("10.0.0.2") == 1 and slots.evicted == 1


def test_when_full_the_crowded_source_gives_way_to_a_newcomer() -> None:
    slots: ConnectionSlots[str] = ConnectionSlots(max_connections=3, max_per_source=3)
    for conn in ("x1", "x2"):
        slots.admit(conn, "attacker")
    slots.admit("k1", "kubelet")
    decision = slots.admit("c1", "cni")
    assert decision.evict == "x1" and len(slots) == 3
    assert slots.count("kubelet") == 1, "the source holding one slot keeps it"


def test_a_busy_connection_is_never_evicted_and_a_newcomer_is_refused_instead() -> None:
    slots: ConnectionSlots[str] = ConnectionSlots(max_connections=5, max_per_source=2)
    slots.admit("w1", "10.0.0.1")
    slots.admit("w2", "10.0.0.1")
    slots.set_busy("w1", True)
    slots.set_busy("w2", True)  # two watches being streamed
    refused = slots.admit("w3", "10.0.0.1")
    assert not refused.admitted and refused.evict is None and slots.refused == 1
    slots.set_busy("w2", False)
    assert slots.admit("w3", "10.0.0.1").evict == "w2"


def test_removed_connections_free_their_slot_and_bad_limits_are_refused() -> None:
    slots: ConnectionSlots[str] = ConnectionSlots(max_connections=1, max_per_source=1)
    slots.admit("a", "s")
    slots.remove("a")
    slots.remove("never-admitted")
    assert len(slots) == 0 and slots.admit("b", "s").evict is None
    with pytest.raises(ValueError):
        slots.admit("b", "s")
    with pytest.raises(ValueError):
        ConnectionSlots(0, 1)

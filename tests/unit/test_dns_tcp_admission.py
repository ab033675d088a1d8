"""Who keeps a DNS-over-TCP slot: the per-source limit, eviction of the longest-idle, busy connections kept.

Connections are plain strings and sources plain addresses; `now` is passed in.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from istio_agent.dns.core.tcp_admission import Admission, ConnectionTable
from istio_agent.dns.options import DnsProxyOptions

A, B, C = "10.0.0.1", "10.0.0.2", "10.0.0.3"


def fill(table: ConnectionTable[str], source: str, n: int, start: float = 0.0, prefix: str = "") -> list[str]:
    conns = [f"{prefix or source}#{i}" for i in range(n)]
    for i, conn in enumerate(conns):
        assert table.admit(conn, source, start + i) == Admission(True)
    return conns


def test_below_the_limits_everyone_is_admitted_and_nothing_evicted() -> None:
    table: ConnectionTable[str] = ConnectionTable(10, 4)
    fill(table, A, 4)
    fill(table, B, 4, start=10.0)
    assert len(table) == 8
    assert (table.count(A), table.count(B), table.count(C)) == (4, 4, 0)
    assert table.evicted == table.refused == 0


def test_a_source_at_its_limit_replaces_its_own_longest_idle() -> None:
    table: ConnectionTable[str] = ConnectionTable(100, 3)
    a0, a1, _a2 = fill(table, A, 3)
    (b0,) = fill(table, B, 1, start=0.5)
    table.touch(a0, 5.0)  # a0 is active again: a1 is now the longest idle of A
    assert table.admit("a-new", A, 6.0) == Admission(True, a1)
    assert a1 not in table and b0 in table  # another source's older connection is not A's to take
    assert table.count(A) == 3
    assert table.evicted == 1


def test_when_full_a_newcomer_replaces_the_longest_idle_of_any_source() -> None:
    table: ConnectionTable[str] = ConnectionTable(4, 4)
    a0, a1 = fill(table, A, 2)
    b0, b1 = fill(table, B, 2, start=2.0)
    table.touch(a0, 10.0)
    table.touch(a1, 11.0)
    assert table.admit("c0", C, 12.0) == Admission(True, b0)
    assert len(table) == 4
    assert table.admit("c1", C, 13.0) == Admission(True, b1)
    assert table.admit("c2", C, 14.0) == Admission(True, a0)
    assert table.count(B) == 0


def test_connections_with_queries_in_flight_are_never_evicted() -> None:
    table: ConnectionTable[str] = ConnectionTable(3, 3)
    a0, a1, a2 = fill(table, A, 3)
    table.set_busy(a0, True)
    table.set_busy(a1, True)
    assert table.admit("b0", B, 5.0) == Admission(True, a2)  # a0, a1 are older but waiting on upstream
    table.set_busy("b0", True)
    assert table.admit("b1", B, 6.0) == Admission(False)  # everyone is being served: refuse
    assert table.refused == 1 and "b1" not in table
    table.set_busy(a0, False)  # its answer went out
    assert table.admit("b1", B, 7.0) == Admission(True, a0)


def test_a_busy_source_at_its_limit_refuses_its_own_newcomer() -> None:
    table: ConnectionTable[str] = ConnectionTable(100, 2)
    for conn in fill(table, A, 2):
        table.set_busy(conn, True)
    assert table.admit("a-new", A, 5.0) == Admission(False)
    assert table.admit("b0", B, 5.0) == Admission(True)


def test_one_flooding_source_leaves_room_for_everyone_else() -> None:
    """1,100 connections from one address hold 64 slots at most; another client still gets in."""
    table: ConnectionTable[str] = ConnectionTable(1024, 64)
    for i in range(1100):
        decision = table.admit(f"attacker#{i}", A, i * 0.001)
        assert decision.admitted
        assert decision.evict == (None if i < 64 else f"attacker#{i - 64}")
    assert table.count(A) == 64
    assert table.admit("dig", B, 2.0) == Admission(True)


def test_many_flooding_sources_fill_the_table_and_a_newcomer_still_gets_in() -> None:
    table: ConnectionTable[str] = ConnectionTable(1024, 64)
    for s in range(16):  # 16 x 64: every slot taken
        fill(table, f"127.0.1.{s}", 64, start=s * 100.0)
    assert len(table) == 1024
    for i in range(64):  # a 17th flooding source takes the oldest slots, whoever held them
        assert table.admit(f"late#{i}", "127.0.1.16", 2000.0 + i) == Admission(True, f"127.0.1.0#{i}")
    assert table.count("127.0.1.0") == 0
    assert table.admit("dig", A, 5000.0) == Admission(True, "127.0.1.1#0")
    assert "dig" in table and len(table) == 1024


def test_removal_is_idempotent_and_frees_the_slot() -> None:
    table: ConnectionTable[str] = ConnectionTable(2, 2)
    a0, a1 = fill(table, A, 2)
    table.remove(a0)
    table.remove(a0)
    table.remove("never-admitted")
    table.touch(a0, 9.0)  # reports about a gone connection are ignored
    table.set_busy(a0, True)
    assert table.admit("a2", A, 10.0) == Admission(True)
    assert list(table) == [a1, "a2"]
    assert table.idle_since(a1) == 1.0 and table.idle_since(a0) is None


def test_bad_limits_and_double_admission_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ConnectionTable(0, 1)
    with pytest.raises(ValueError, match="at least 1"):
        ConnectionTable(1, 0)
    table: ConnectionTable[str] = ConnectionTable(2, 5)
    assert table.max_per_source == 2  # a per-source limit above the cap is the cap
    table.admit("x", A, 0.0)
    with pytest.raises(ValueError, match="twice"):
        table.admit("x", A, 1.0)


def test_the_proxy_defaults_turn_the_rules_on() -> None:
    options = DnsProxyOptions()
    assert options.tcp_partial_frame_timeout == 3.0
    assert options.tcp_first_query_timeout == 3.0
    assert options.tcp_idle_timeout == 8.0
    assert (options.max_tcp_connections, options.max_tcp_connections_per_source) == (1024, 64)


@given(st.lists(st.tuples(st.sampled_from(["admit", "touch", "busy", "idle", "remove"]),
                          st.integers(0, 29), st.integers(0, 3)), max_size=200))
def test_limits_hold_and_evictions_pick_the_longest_idle(ops: list[tuple[str, int, int]]) -> None:
    """Against a plain model: limits never exceeded, a victim is the least recently active idle candidate."""
    cap, per_source = 8, 3
    table: ConnectionTable[int] = ConnectionTable(cap, per_source)
    model: dict[int, tuple[int, float, bool]] = {}  # conn -> (source, last active, busy)
    for step, (op, conn, source) in enumerate(ops):
        now = float(step)
        if op == "admit" and conn not in model:
            same = {c: v for c, v in model.items() if v[0] == source}
            pool = same if len(same) >= per_source else model if len(model) >= cap else None
            candidates = {c: v[1] for c, v in (pool or {}).items() if not v[2]}
            decision = table.admit(conn, source, now)
            if pool is not None and not candidates:
                assert decision == Admission(False)
                continue
            assert decision.admitted
            expected = min(candidates, key=lambda c: candidates[c]) if pool is not None else None
            assert decision.evict == expected
            if expected is not None:
                del model[expected]
            model[conn] = (source, now, False)
        elif conn in model:
            src, last, busy = model[conn]
            if op == "touch":
                table.touch(conn, now)
                model[conn] = (src, now, busy)
            elif op in ("busy", "idle"):
                table.set_busy(conn, op == "busy")
                model[conn] = (src, last, op == "busy")
            elif op == "remove":
                table.remove(conn)
                del model[conn]
        assert len(table) == len(model) <= cap
        assert all(table.count(s) <= per_source for s in range(4))
        assert set(table) == set(model)

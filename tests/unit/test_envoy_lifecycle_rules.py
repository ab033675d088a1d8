"""Sans-IO rules of the Envoy lifecycle: stats parsing, drain decisions, readiness."""

from __future__ import annotations

from istio_agent.envoy.drain import DrainPolicy, next_step
from istio_agent.envoy.stats import active_downstream_connections, parse_stats
from istio_agent.status.readiness import ReadinessState

STATS = """\
listener.0.0.0.0_15006.downstream_cx_active: 2
listener.0.0.0.0_15006.worker_0.downstream_cx_active: 2
listener.0.0.0.0_15001.downstream_cx_active: 1
listener.0.0.0.0_15090.downstream_cx_active: 3
listener.0.0.0.0_15021.downstream_cx_active: 1
listener.admin.downstream_cx_active: 1
http.inbound_0.0.0.0_8080.downstream_cx_active: 2
cluster_manager.cds.update_success: 1
server.hot_restart_epoch: 0
histogram: P0(nan,0) P25(nan,0)
"""


def test_parse_stats_skips_non_integers() -> None:
    stats = parse_stats(STATS)
    assert stats["cluster_manager.cds.update_success"] == 1
    assert "histogram" not in stats


def test_active_connections_exclude_istio_listeners_workers_and_http() -> None:
    assert active_downstream_connections(parse_stats(STATS)) == 3
    assert active_downstream_connections({"listener.0.0.0.0_15090.downstream_cx_active": 4}) == 0
    assert active_downstream_connections({}) is None


def test_drain_fixed_duration() -> None:
    policy = DrainPolicy(termination_drain_duration=5, exit_on_zero_active_connections=False, minimum_drain_duration=1)
    assert next_step(policy, 100, 100, "unpolled").wait == 5
    assert next_step(policy, 100, 104, "unpolled").wait == 1
    assert next_step(policy, 100, 105, "unpolled").stop


def test_drain_exit_on_zero_waits_minimum_then_polls() -> None:
    policy = DrainPolicy(termination_drain_duration=5, exit_on_zero_active_connections=True, minimum_drain_duration=3)
    first = next_step(policy, 0, 0, "unpolled")
    assert not first.stop and first.wait == 3
    # Connections at zero before the minimum: still wait the minimum.
    assert not next_step(policy, 0, 1, 0).stop
    assert next_step(policy, 0, 3, "unpolled").poll_connections
    busy = next_step(policy, 0, 3, 4)
    assert not busy.stop and busy.wait == 1.0
    assert next_step(policy, 0, 40, 0).stop
    assert next_step(policy, 0, 4, None).stop


def _updates(cds: int, lds: int, rejected: int = 0) -> dict[str, int]:
    return {"cluster_manager.cds.update_success": cds, "listener_manager.lds.update_success": lds,
            "listener_manager.lds.update_rejected": rejected}


def test_readiness_rules_and_latch() -> None:
    state = ReadinessState()
    live = {"server.state": 0, "listener_manager.workers_started": 1}
    assert state.evaluate(None, None) is not None
    assert state.evaluate(_updates(0, 0), live) == (
        "config not received from XDS server (is Istiod running?): "
        "cds updates: 0 successful, 0 rejected; lds updates: 0 successful, 0 rejected")
    assert (state.evaluate(_updates(0, 1), live) or "").startswith("config not fully received from XDS server: ")
    assert (state.evaluate(_updates(1, 0), live) or "").startswith("config not fully received from XDS server: ")
    # A rejected update is not configuration accepted (upstream's rule): unready, saying it was rejected.
    assert state.evaluate(_updates(1, 0, rejected=1), live) == (
        "config received from XDS server, but was rejected: "
        "cds updates: 1 successful, 0 rejected; lds updates: 0 successful, 1 rejected")
    rejected_cds = {"cluster_manager.cds.update_rejected": 1, "listener_manager.lds.update_success": 1}
    assert (state.evaluate(rejected_cds, live) or "").startswith("config received from XDS server, but was rejected")
    not_live = {"server.state": 2, "listener_manager.workers_started": 1}
    assert state.evaluate(_updates(1, 1, rejected=1), not_live) == "server is not live, current state is: 2"
    assert "workers" in (state.evaluate(_updates(1, 1), {"server.state": 0}) or "")
    assert state.evaluate(_updates(1, 1), live) is None
    assert not state.needs_envoy_stats()
    # Latched: no stats needed afterwards.
    assert state.evaluate(None, None) is None
    state.draining = True
    assert "DRAINING" in (state.evaluate(None, None) or "")


def test_readiness_waits_for_name_table_when_dns_on() -> None:
    state = ReadinessState(dns_enabled=True)
    live = {"server.state": 0, "listener_manager.workers_started": 1}
    assert "NameTable" in (state.evaluate(_updates(1, 1), live) or "")
    state.name_table_received = True
    assert state.evaluate(None, None) is None

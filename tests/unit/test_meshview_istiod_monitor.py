"""istiod-local's XdsMonitor (what the monitoring port shows), fed by hand: ACKs, NACKs, stale nonces, pushes."""

from __future__ import annotations

from istio_agent.protos import typeurls
from istiod_local.controlplane.monitoring import XdsMonitor, metric_type
from istiod_local.meshview.collector import parse_istiod_metrics
from istiod_local.meshview.stats import prometheus_samples

ECHO = "outbound|80||echo.default.svc.cluster.local"
NODE = "sidecar~10.244.0.2~client-1.default~default.svc.cluster.local"


def fed() -> XdsMonitor:
    monitor = XdsMonitor()
    monitor.connected("c1", NODE, "sidecar", "10.244.0.2:40000", "1.28.0", 1000.0)
    monitor.request("c1", typeurls.CLUSTER, "", None)
    monitor.sent("c1", typeurls.CLUSTER, "n1", 1000.5, push=False)
    monitor.request("c1", typeurls.CLUSTER, "n1", None)  # ACK
    monitor.request("c1", typeurls.ENDPOINT, "", None, [ECHO])
    monitor.sent("c1", typeurls.ENDPOINT, "n2", 1000.6, push=False)
    monitor.request("c1", typeurls.ENDPOINT, "n2", "bad endpoints", [ECHO])  # NACK
    monitor.request("c1", typeurls.CLUSTER, "n0", None)  # a nonce we no longer hold
    monitor.sent("c1", typeurls.CLUSTER, "n3", 1002.0, push=True)
    return monitor


def values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(name, tuple(sorted(labels.items()))): value for name, labels, value in prometheus_samples(text)}


def test_metrics_have_upstreams_names_and_labels() -> None:
    text = fed().metrics_text(mesh_version=4, services=3)
    got = values(text)
    assert got[("pilot_xds", (("version", "1.28.0"),))] == 1
    assert got[("pilot_xds_pushes", (("type", "cds"),))] == 2
    assert got[("pilot_xds_pushes", (("type", "eds"),))] == 1
    assert got[("pilot_total_xds_rejects", (("type", "eds"),))] == 1
    assert got[("pilot_xds_eds_reject", (("node", NODE),))] == 1
    assert got[("pilot_xds_expired_nonce", ())] == 1
    assert got[("pilot_services", ())] == 3
    assert got[("istiod_local_mesh_version", ())] == 4
    assert got[("istiod_local_last_push_timestamp_seconds", ())] == 1002.0
    assert "# TYPE pilot_xds_pushes counter" in text and "# TYPE pilot_xds gauge" in text
    sample = parse_istiod_metrics(text, 1003.0)  # and the view reads it back
    assert (sample.connected, sample.version, sample.last_push) == (1, "4", 1002.0)


def test_a_push_timestamp_keeps_every_digit() -> None:
    """An epoch timestamp has ten digits before the point; six significant ones put the last push minutes off."""
    monitor = fed()
    monitor.sent("c1", typeurls.CLUSTER, "n4", 1796141089.25, push=True)
    text = monitor.metrics_text()
    assert values(text)[("istiod_local_last_push_timestamp_seconds", ())] == 1796141089.25
    assert parse_istiod_metrics(text, 1796141099.25).last_push == 1796141089.25


def test_syncz_shows_nonces_sent_and_acked_and_the_last_error() -> None:
    (status,) = fed().syncz()
    assert status["proxy"] == NODE and status["proxy_type"] == "sidecar" and status["istio_version"] == "1.28.0"
    assert status["cluster_sent"] == "n3" and status["cluster_acked"] == "n1"
    assert status["endpoint_sent"] == "n2" and "endpoint_acked" not in status
    eds = status["resources"][typeurls.ENDPOINT]
    assert eds == {"sent": "n2", "lastError": "bad endpoints", "sentTime": "1970-01-01T00:16:40.600000Z"}
    assert fed().syncz("other") == [] and len(fed().syncz("default")) == 1


def test_an_ack_clears_the_error() -> None:
    monitor = fed()
    monitor.sent("c1", typeurls.ENDPOINT, "n4", 1003.0, push=True)
    monitor.request("c1", typeurls.ENDPOINT, "n4", None)
    eds = monitor.syncz()[0]["resources"][typeurls.ENDPOINT]
    assert eds["acked"] == "n4" and "lastError" not in eds


def test_connections_and_a_closed_stream() -> None:
    monitor = fed()
    document = monitor.connections()
    assert document["totalClients"] == 1
    (client,) = document["clients"]
    assert client == {"connectionId": "c1", "connectedAt": "1970-01-01T00:16:40Z", "address": "10.244.0.2:40000",
                      "watches": {typeurls.CLUSTER: ["*"],
                                  typeurls.ENDPOINT: [ECHO]}}
    monitor.disconnected("c1")
    assert monitor.connections() == {"totalClients": 0}
    assert values(monitor.metrics_text()).get(("pilot_xds", (("version", "1.28.0"),))) is None
    monitor.request("c1", typeurls.CLUSTER, "x", "late")  # a stream already gone is ignored
    assert values(monitor.metrics_text())[("pilot_total_xds_rejects", (("type", "eds"),))] == 1


def test_delta_subscriptions_accumulate() -> None:
    monitor = XdsMonitor()
    monitor.connected("d1", NODE, "sidecar", "x", "", 0.0)
    monitor.request("d1", typeurls.ENDPOINT, "", None, ["a"], delta=True)
    monitor.request("d1", typeurls.ENDPOINT, "", None, ["b"], delta=True)
    monitor.request("d1", typeurls.CLUSTER, "", None, [], delta=True)
    monitor.request("d1", typeurls.ROUTE, "", None, [])  # SotW naming nothing of a non-wildcard type: nothing
    watches = monitor.connections()["clients"][0]["watches"]
    assert watches == {typeurls.CLUSTER: ["*"], typeurls.ENDPOINT: ["a", "b"], typeurls.ROUTE: []}


def test_metric_type() -> None:
    assert [metric_type(t) for t in (typeurls.CLUSTER, typeurls.NAME_TABLE, "x")] == ["cds", "nds", "x"]

"""Routing decisions of one proxied stream: forward, consume (NDS/PCDS) or drop; subscriptions; health."""

from __future__ import annotations

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.service.discovery.v3 import discovery_pb2

from istio_agent.protos import nds_pb2, typeurls
from istio_agent.xds.core.session import (
    Consume,
    Drop,
    Health,
    StreamSession,
    ToEnvoy,
    apply_node_hook,
    health_request,
)

BOTH = frozenset({typeurls.NAME_TABLE, typeurls.PROXY_CONFIG})


def _request(type_url: str, delta: bool, nonce: str = "") -> bytes:
    if delta:
        return discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, response_nonce=nonce).SerializeToString()
    return discovery_pb2.DiscoveryRequest(type_url=type_url, response_nonce=nonce).SerializeToString()


def _response(type_url: str, delta: bool, resources: list[tuple[str, bytes]], nonce: str = "n1") -> bytes:
    if delta:
        d = discovery_pb2.DeltaDiscoveryResponse(type_url=type_url, nonce=nonce, system_version_info="sv")
        for i, (any_type, value) in enumerate(resources):
            r = d.resources.add(name=f"r{i}", version="1")
            r.resource.type_url, r.resource.value = any_type, value
        return d.SerializeToString()
    s = discovery_pb2.DiscoveryResponse(type_url=type_url, nonce=nonce, version_info="v1")
    for any_type, value in resources:
        r = s.resources.add()
        r.type_url, r.value = any_type, value
    return s.SerializeToString()


def _parse_request(data: bytes, delta: bool) -> discovery_pb2.DiscoveryRequest | discovery_pb2.DeltaDiscoveryRequest:
    cls = discovery_pb2.DeltaDiscoveryRequest if delta else discovery_pb2.DiscoveryRequest
    return cls.FromString(data)


@pytest.mark.parametrize("delta", [False, True])
def test_envoy_types_are_forwarded_byte_for_byte(delta: bool) -> None:
    session = StreamSession(delta=delta, consumed=BOTH)
    cluster = cluster_pb2.Cluster(name="c").SerializeToString()
    data = _response(typeurls.CLUSTER, delta, [(typeurls.CLUSTER, cluster)])
    action = session.on_response(data)
    assert isinstance(action, ToEnvoy) and action.data is data


@pytest.mark.parametrize("delta", [False, True])
def test_name_table_is_consumed_and_acked(delta: bool) -> None:
    table = nds_pb2.NameTable()
    table.table["a.b.svc.cluster.local"].ips.append("10.0.0.1")
    session = StreamSession(delta=delta, consumed=BOTH)
    action = session.on_response(
        _response(typeurls.NAME_TABLE, delta, [(typeurls.NAME_TABLE, table.SerializeToString())], nonce="n7")
    )
    assert isinstance(action, Consume)
    assert nds_pb2.NameTable.FromString(action.value) == table
    ack = _parse_request(session.ack(action), delta)
    assert (ack.type_url, ack.response_nonce) == (typeurls.NAME_TABLE, "n7")
    assert not ack.HasField("error_detail")
    if not delta:
        assert isinstance(ack, discovery_pb2.DiscoveryRequest) and ack.version_info == "v1"
    nack = _parse_request(session.ack(action, "cannot apply"), delta)
    assert (nack.error_detail.code, nack.error_detail.message) == (13, "cannot apply")


@pytest.mark.parametrize("delta", [False, True])
def test_proxy_config_is_consumed(delta: bool) -> None:
    session = StreamSession(delta=delta, consumed=BOTH)
    action = session.on_response(_response(typeurls.PROXY_CONFIG, delta, [(typeurls.PROXY_CONFIG, b"")]))
    assert isinstance(action, Consume) and action.type_url == typeurls.PROXY_CONFIG


def test_istio_types_are_dropped_when_not_consumed() -> None:
    session = StreamSession(delta=False, consumed=frozenset())
    action = session.on_response(_response(typeurls.NAME_TABLE, False, [(typeurls.NAME_TABLE, b"")]))
    assert isinstance(action, Drop)
    assert isinstance(session.on_response(_response("type.googleapis.com/foo.Bar", False, [])), Drop)


def test_empty_consumed_response_is_dropped_without_ack() -> None:
    session = StreamSession(delta=False, consumed=BOTH)
    assert isinstance(session.on_response(_response(typeurls.NAME_TABLE, False, [])), Drop)


def test_workload_type_is_forwarded() -> None:
    session = StreamSession(delta=True, consumed=BOTH)
    assert isinstance(session.on_response(_response(typeurls.WORKLOAD, True, [])), ToEnvoy)


@pytest.mark.parametrize("delta", [False, True])
def test_first_lds_request_triggers_subscriptions_and_health(delta: bool) -> None:
    session = StreamSession(delta=delta, consumed=BOTH, health=Health(False, "probe failed"))
    cds = _request(typeurls.CLUSTER, delta)
    assert session.on_request(cds) == [cds]
    lds = _request(typeurls.LISTENER, delta)
    out = session.on_request(lds)
    assert out[0] == lds
    extra = [_parse_request(d, delta) for d in out[1:]]
    assert [r.type_url for r in extra] == [typeurls.NAME_TABLE, typeurls.PROXY_CONFIG, typeurls.HEALTH_INFO]
    assert (extra[2].error_detail.code, extra[2].error_detail.message) == (13, "probe failed")
    # Later LDS requests (ACKs) are just forwarded.
    ack = _request(typeurls.LISTENER, delta, nonce="1")
    assert session.on_request(ack) == [ack]


def test_only_consumed_types_are_subscribed() -> None:
    session = StreamSession(delta=False, consumed=frozenset({typeurls.NAME_TABLE}))
    out = session.on_request(_request(typeurls.LISTENER, False))
    assert [_parse_request(d, False).type_url for d in out[1:]] == [typeurls.NAME_TABLE]
    session = StreamSession(delta=False, consumed=frozenset())
    assert len(session.on_request(_request(typeurls.LISTENER, False))) == 1


def test_health_is_withheld_until_lds() -> None:
    session = StreamSession(delta=False, consumed=frozenset())
    assert session.on_health(Health(True)) == []
    out = session.on_request(_request(typeurls.LISTENER, False))
    assert [_parse_request(d, False).type_url for d in out] == [typeurls.LISTENER, typeurls.HEALTH_INFO]
    (report,) = session.on_health(Health(False, "down"))
    assert _parse_request(report, False).error_detail.message == "down"


@pytest.mark.parametrize("delta", [False, True])
def test_health_request_shape(delta: bool) -> None:
    healthy = _parse_request(health_request(Health(True), delta), delta)
    assert healthy.type_url == "type.googleapis.com/istio.v1.HealthInformation"
    assert not healthy.HasField("error_detail")
    sick = _parse_request(health_request(Health(False, "readiness probe: 503"), delta), delta)
    assert (sick.error_detail.code, sick.error_detail.message) == (13, "readiness probe: 503")


def test_node_hook_edits_only_the_node() -> None:
    request = discovery_pb2.DiscoveryRequest(type_url=typeurls.CLUSTER, resource_names=["x"])
    request.node.id = "sidecar~1.2.3.4~a.b~b.svc.cluster.local"

    def hook(node: object) -> None:
        node.metadata.update({"EXTRA": "yes"})  # type: ignore[attr-defined]

    edited = discovery_pb2.DiscoveryRequest.FromString(apply_node_hook(request.SerializeToString(), False, hook))
    assert edited.node.metadata["EXTRA"] == "yes"
    assert edited.node.id == request.node.id and list(edited.resource_names) == ["x"]

"""The sans-IO ADS sessions: what gets answered, what gets pushed, SotW and Delta."""

from __future__ import annotations

import itertools
from collections.abc import Collection

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, wrappers_pb2
from google.rpc import status_pb2

from istio_agent.protos import typeurls
from istiod_local.controlplane.xds.generators.base import Resources
from istiod_local.controlplane.xds.sessions import DeltaSession, SotwSession

SERVED = (typeurls.CLUSTER, typeurls.ENDPOINT, typeurls.LISTENER, typeurls.ROUTE, typeurls.NAME_TABLE)


class World:
    """Resources by type, as plain strings packed into Any; edit `data` and push."""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, str]] = {
            typeurls.CLUSTER: {"a": "1", "b": "1"},
            typeurls.ENDPOINT: {"a": "e1", "b": "e1"},
            typeurls.LISTENER: {"l": "1"},
            typeurls.ROUTE: {"80": "r"},
            typeurls.NAME_TABLE: {"": "nt"},
        }

    def generate(self, type_url: str, names: Collection[str] | None) -> Resources:
        out = {}
        for name, value in self.data[type_url].items():
            if names is None or name in names:
                packed = any_pb2.Any()
                packed.Pack(wrappers_pb2.StringValue(value=value))
                out[name] = packed
        return out


def _nonces() -> itertools.count[int]:
    return itertools.count(1)


def sotw(world: World) -> SotwSession:
    counter = _nonces()
    return SotwSession("proxy", SERVED, world.generate, nonce=lambda: f"n{next(counter)}")


def delta(world: World) -> DeltaSession:
    counter = _nonces()
    return DeltaSession("proxy", SERVED, world.generate, nonce=lambda: f"n{next(counter)}")


def req(type_url: str, names: list[str] | None = None, nonce: str = "",
        error: str = "") -> discovery_pb2.DiscoveryRequest:
    r = discovery_pb2.DiscoveryRequest(type_url=type_url, resource_names=names or [], response_nonce=nonce)
    if error:
        r.error_detail.CopyFrom(status_pb2.Status(code=13, message=error))
    return r


def test_sotw_first_request_ack_nack_stale() -> None:
    s = sotw(World())
    (cds,) = s.on_request(req(typeurls.CLUSTER), "1")
    assert (cds.nonce, cds.version_info, len(cds.resources)) == ("n1", "1", 2)
    assert s.on_request(req(typeurls.CLUSTER, nonce="n1"), "1") == []  # ACK
    assert s.watches[typeurls.CLUSTER].acked_version == "1"
    assert s.on_request(req(typeurls.CLUSTER, nonce="old"), "1") == []  # stale
    assert s.on_request(req(typeurls.CLUSTER, nonce="n1", error="boom"), "1") == []  # NACK
    assert s.watches[typeurls.CLUSTER].nacked == "boom"
    assert s.on_request(req(typeurls.HEALTH_INFO, error="unhealthy"), "1") == []
    assert s.on_request(req(typeurls.SECRET, ["default"]), "1") == []  # not served here


def test_sotw_named_types_and_subscription_change() -> None:
    s = sotw(World())
    (eds,) = s.on_request(req(typeurls.ENDPOINT, ["a"]), "1")
    assert len(eds.resources) == 1
    (eds2,) = s.on_request(req(typeurls.ENDPOINT, ["a", "b"], nonce=eds.nonce), "1")
    assert len(eds2.resources) == 2
    (rds,) = s.on_request(req(typeurls.ROUTE), "1")
    assert len(rds.resources) == 0  # RDS is never wildcard


def test_sotw_push_sends_only_changed_types_and_forces_endpoints_after_clusters() -> None:
    world = World()
    s = sotw(world)
    for type_url in (typeurls.CLUSTER, typeurls.ENDPOINT, typeurls.LISTENER):
        s.on_request(req(type_url, ["a", "b"] if type_url == typeurls.ENDPOINT else None), "1")
    assert s.on_push("2") == []  # nothing changed
    world.data[typeurls.LISTENER]["l"] = "2"
    assert [r.type_url for r in s.on_push("3")] == [typeurls.LISTENER]
    world.data[typeurls.CLUSTER]["a"] = "2"
    pushed = s.on_push("4")
    assert [r.type_url for r in pushed] == [typeurls.CLUSTER, typeurls.ENDPOINT]
    assert all(r.version_info == "4" for r in pushed)


def dreq(type_url: str, subscribe: list[str] | None = None, unsubscribe: list[str] | None = None, nonce: str = "",
         error: str = "", initial: dict[str, str] | None = None) -> discovery_pb2.DeltaDiscoveryRequest:
    r = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, resource_names_subscribe=subscribe or [],
                                            resource_names_unsubscribe=unsubscribe or [], response_nonce=nonce,
                                            initial_resource_versions=initial or {})
    if error:
        r.error_detail.CopyFrom(status_pb2.Status(code=13, message=error))
    return r


def test_delta_wildcard_then_incremental_push() -> None:
    world = World()
    s = delta(world)
    (cds,) = s.on_request(dreq(typeurls.CLUSTER), "1")
    assert sorted(r.name for r in cds.resources) == ["a", "b"] and not cds.removed_resources
    assert s.on_request(dreq(typeurls.CLUSTER, nonce=cds.nonce), "1") == []
    world.data[typeurls.CLUSTER] = {"a": "1", "c": "1"}
    (pushed,) = s.on_push("2")
    assert [r.name for r in pushed.resources] == ["c"] and list(pushed.removed_resources) == ["b"]
    assert s.on_push("3") == []


def test_delta_named_subscriptions() -> None:
    world = World()
    s = delta(world)
    (eds,) = s.on_request(dreq(typeurls.ENDPOINT, ["a", "zz"]), "1")
    assert [r.name for r in eds.resources] == ["a"] and list(eds.removed_resources) == ["zz"]
    # A re-subscription is answered even though nothing changed.
    (again,) = s.on_request(dreq(typeurls.ENDPOINT, ["a"], nonce=eds.nonce), "1")
    assert [r.name for r in again.resources] == ["a"]
    (more,) = s.on_request(dreq(typeurls.ENDPOINT, ["b"]), "1")
    assert [r.name for r in more.resources] == ["b"]
    assert s.on_request(dreq(typeurls.ENDPOINT, unsubscribe=["a"]), "1") == []
    world.data[typeurls.ENDPOINT] = {"a": "e2", "b": "e2"}
    (pushed,) = s.on_push("2")
    assert [r.name for r in pushed.resources] == ["b"]  # "a" is no longer watched


def test_delta_nack_and_initial_versions() -> None:
    world = World()
    s = delta(world)
    (first,) = s.on_request(dreq(typeurls.LISTENER), "1")
    held = {r.name: r.version for r in first.resources}
    assert s.on_request(dreq(typeurls.LISTENER, nonce=first.nonce, error="bad listener"), "1") == []
    assert s.watches[typeurls.LISTENER].nacked == "bad listener"

    resumed = delta(world)
    (again,) = resumed.on_request(dreq(typeurls.LISTENER, initial={**held, "gone": "x"}), "1")
    assert not again.resources and list(again.removed_resources) == ["gone"]


def test_delta_cluster_change_resends_its_endpoints() -> None:
    world = World()
    s = delta(world)
    s.on_request(dreq(typeurls.CLUSTER), "1")
    s.on_request(dreq(typeurls.ENDPOINT, ["a", "b"]), "1")
    world.data[typeurls.CLUSTER]["a"] = "2"
    cds, eds = s.on_push("2")
    assert [r.name for r in cds.resources] == ["a"]
    assert [r.name for r in eds.resources] == ["a"]  # unchanged, but its cluster was replaced

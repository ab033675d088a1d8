"""`istiod-local serve`: WorkloadEntry auto-registration and health, seen by another proxy's EDS.

A "VM" here is an ADS client on the TLS port with the node metadata a VM's
agent sends (`AUTO_REGISTER_GROUP`, and `PROXY_CONFIG.readinessProbe` when it
runs a probe) and a service-account token; a sidecar on the plaintext port
watches the service's endpoints. The grace period is cut to a second with
`--workload-entry-grace-period` (a reconnect on an open channel takes
milliseconds); no test measures it, they only observe the order in which
things happen.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2
from launchers import IstiodLocal, RegistryFile, istiod_local_cli
from needs import need_file
from support import ISTIOD_LOCAL, eventually

from istio_agent.protos import typeurls
from istiod_local.controlplane.xds.ads import AdsServer
from istiod_local.controlplane.xds.autoregistration import AutoRegistration, WorkloadEntryOptions
from istiod_local.controlplane.xds.registry import parse_registry

REGISTRY = """\
services:
- name: vm
  selector: {app: vm}
  ports: [{name: http, port: 80, targetPort: 8080}]
workloadGroups:
- name: vm
  metadata: {labels: {app: vm}}
  template: {serviceAccount: vm-sa}
  probe: {periodSeconds: 1, httpGet: {port: 8080}}
"""
CLUSTER = "outbound|80||vm.default.svc.cluster.local"
PROBE = {"readinessProbe": {"httpGet": {"port": 8080}}}


@pytest.fixture
def istiod(tmp_path: Path) -> Any:
    need_file(ISTIOD_LOCAL)
    registry = RegistryFile(tmp_path / "mesh.yaml", REGISTRY)
    with IstiodLocal(tmp_path / "state", registry=registry,
                     args=["--workload-entry-grace-period", "1s"]) as server:
        yield server


def _node(pod: str, ip: str, **meta: Any) -> base_pb2.Node:
    metadata = struct_pb2.Struct()
    metadata.update({"NAMESPACE": "default", **meta})
    return base_pb2.Node(id=f"sidecar~{ip}~{pod}.default~default.svc.cluster.local", metadata=metadata)


class Watcher:
    """A sidecar watching the service's endpoints; `next()` is the next assignment pushed to it."""

    def __init__(self, istiod: IstiodLocal) -> None:
        self.channel = grpc.aio.insecure_channel(istiod.plaintext)
        self.call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel).StreamAggregatedResources()

    async def start(self) -> set[str]:
        await self.call.write(discovery_pb2.DiscoveryRequest(node=_node("sleep-1", "10.244.0.9"),
                                                             type_url=typeurls.ENDPOINT, resource_names=[CLUSTER]))
        return await self.next()

    async def next(self) -> set[str]:
        response = await asyncio.wait_for(self.call.read(), 20)
        await self.call.write(discovery_pb2.DiscoveryRequest(type_url=typeurls.ENDPOINT, resource_names=[CLUSTER],
                                                             response_nonce=response.nonce))
        cla = endpoint_pb2.ClusterLoadAssignment()
        response.resources[0].Unpack(cla)
        return {lb.endpoint.address.socket_address.address for group in cla.endpoints for lb in group.lb_endpoints}

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()


class Vm:
    """A VM's proxy: its ADS stream on the TLS port with its token."""

    def __init__(self, istiod: IstiodLocal, ip: str, service_account: str = "vm-sa", probe: bool = False,
                 instance_ips: str | None = None) -> None:
        self.istiod, self.ip, self.service_account, self.probe = istiod, ip, service_account, probe
        self.instance_ips = ip if instance_ips is None else instance_ips
        creds = grpc.ssl_channel_credentials(root_certificates=istiod.root_pem())
        self.channel = grpc.aio.secure_channel(istiod.secure, creds,
                                               options=[("grpc.ssl_target_name_override", "istiod.istio-system.svc")])
        self.call: Any = None
        # Minted once (a CLI run): a reconnect must be quick next to the grace period.
        self.token = istiod.token(service_account=service_account)

    async def connect(self) -> None:
        token = self.token
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel)
        self.call = stub.StreamAggregatedResources(metadata=[("authorization", f"Bearer {token}")])
        meta: dict[str, Any] = {"AUTO_REGISTER_GROUP": "vm", "SERVICE_ACCOUNT": self.service_account,
                                "INSTANCE_IPS": self.instance_ips}
        if self.probe:
            meta["PROXY_CONFIG"] = PROBE
        await self.call.write(discovery_pb2.DiscoveryRequest(node=_node("vm-host", self.ip, **meta),
                                                             type_url=typeurls.CLUSTER))
        await asyncio.wait_for(self.call.read(), 20)  # its own config: the stream was accepted

    async def health(self, error: str = "") -> None:
        request = discovery_pb2.DiscoveryRequest(type_url=typeurls.HEALTH_INFO)
        if error:
            request.error_detail.CopyFrom(status_pb2.Status(code=500, message=error))
        await self.call.write(request)

    async def disconnect(self) -> None:
        self.call.cancel()
        self.call = None

    async def close(self) -> None:
        if self.call is not None:
            self.call.cancel()
        await self.channel.close()


async def test_a_vm_registers_is_seen_by_others_and_leaves_after_the_grace_period(istiod: IstiodLocal) -> None:
    watcher = Watcher(istiod)
    vm, marker = Vm(istiod, "10.0.0.5"), Vm(istiod, "10.0.0.6")
    try:
        assert await watcher.start() == set()
        await vm.connect()
        assert await watcher.next() == {"10.0.0.5"}
        assert "auto-registered WorkloadEntry default/vm-10.0.0.5" in istiod.log_text()
        await marker.connect()
        assert await watcher.next() == {"10.0.0.5", "10.0.0.6"}

        # A reconnect within the grace period keeps the entry: the watcher sees no change for it.
        await vm.disconnect()
        await vm.connect()
        # The marker leaves after the vm's first grace period would have ended: once it is gone, so is that deadline.
        await marker.disconnect()
        assert await watcher.next() == {"10.0.0.5"}

        await vm.disconnect()
        assert await watcher.next() == set()
        assert "cleaned up auto-registered WorkloadEntry default/vm-10.0.0.5" in istiod.log_text()
    finally:
        await vm.close()
        await marker.close()
        await watcher.close()


async def test_a_token_for_another_service_account_cannot_register(istiod: IstiodLocal) -> None:
    watcher = Watcher(istiod)
    intruder, vm = Vm(istiod, "10.0.0.7", service_account="other"), Vm(istiod, "10.0.0.5")
    try:
        assert await watcher.start() == set()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await intruder.connect()
        assert "service account mismatch" in (info.value.details() or "")
        await eventually(lambda: "service account mismatch: token for 'other', entry wants 'vm-sa'"
                         in istiod.log_text(), "the refusal's reason in istiod-local's log")
        # The next change the watcher sees is the rightful VM alone: the intruder never became an endpoint.
        await vm.connect()
        assert await watcher.next() == {"10.0.0.5"}
    finally:
        await intruder.close()
        await vm.close()
        await watcher.close()


async def test_instance_ips_that_are_not_addresses_are_refused_and_never_pushed(istiod: IstiodLocal) -> None:
    watcher = Watcher(istiod)
    bad = [Vm(istiod, "10.0.0.8", instance_ips=ips) for ips in ("evil", "300.1.1.1", "1.2.3.4 ; rm", "10.0.0.1/8",
                                                               "fe80::1%eth0")]
    vm = Vm(istiod, "10.0.0.5")
    try:
        assert await watcher.start() == set()
        for each in bad:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await each.connect()
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"INSTANCE_IPS {each.instance_ips!r}" in (info.value.details() or "")
            assert "is not an IP address" in (info.value.details() or "")
        await vm.connect()
        assert await watcher.next() == {"10.0.0.5"}, "no refused address ever reached EDS"
    finally:
        for each in [*bad, vm]:
            await each.close()
        await watcher.close()


async def test_a_burst_of_registrations_is_answered_and_pushed_in_few_rebuilds() -> None:
    """In-process: 300 VMs register at a concurrency of 100 and stay; each is answered, each is registered, and
    the mesh is rebuilt for the burst a few times, not once per VM (each rebuild pushes to every VM)."""
    ads = AdsServer(parse_registry(REGISTRY),
                    workload_entries=AutoRegistration(options=WorkloadEntryOptions(validate_identity=False)))
    server = grpc.aio.server()
    ads.register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(4)]
    calls: list[Any] = []
    gate = asyncio.Semaphore(100)
    first = ads.snapshot.version

    async def register(n: int) -> None:
        async with gate:
            ip = f"10.1.{n // 250}.{n % 250 + 1}"
            call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channels[n % 4]).StreamAggregatedResources()
            calls.append(call)
            await call.write(discovery_pb2.DiscoveryRequest(
                node=_node("vm-host", ip, AUTO_REGISTER_GROUP="vm", INSTANCE_IPS=ip), type_url=typeurls.CLUSTER))
            await asyncio.wait_for(call.read(), 60)

    try:
        await asyncio.gather(*(register(n) for n in range(300)))
        assert len(ads.workload_entry_status()) == 300
        await eventually(lambda: sum(1 for w in ads.snapshot.workloads if w.ip.startswith("10.1.")) == 300,
                         "every entry in the mesh")
        rebuilds = ads.snapshot.version - first
        assert rebuilds < 100, f"{rebuilds} rebuilds for 300 registrations"
    finally:
        for call in calls:
            call.cancel()
        for channel in channels:
            await channel.close()
        await server.stop(None)


async def test_health_reports_take_the_entry_out_of_eds_and_back(istiod: IstiodLocal) -> None:
    watcher = Watcher(istiod)
    vm, other = Vm(istiod, "10.0.0.5", probe=True), Vm(istiod, "10.0.0.6")
    try:
        assert await watcher.start() == set()
        await vm.connect()  # health checks enabled: out of EDS until its first good report
        await other.connect()
        assert await watcher.next() == {"10.0.0.6"}
        await vm.health()
        assert await watcher.next() == {"10.0.0.5", "10.0.0.6"}
        await vm.health("Get http://127.0.0.1:8080/: connection refused")
        assert await watcher.next() == {"10.0.0.6"}
        await eventually(lambda: "is unhealthy: Get http://127.0.0.1:8080/: connection refused" in istiod.log_text(),
                         "the unhealthy report in the log")
        await vm.health()
        assert await watcher.next() == {"10.0.0.5", "10.0.0.6"}
    finally:
        await vm.close()
        await other.close()
        await watcher.close()


async def test_configure_writes_files_whose_token_registers_the_vm(istiod: IstiodLocal, tmp_path: Path) -> None:
    out = tmp_path / "vm-files"
    done = istiod_local_cli("workload-entry", "configure", "--name", "vm", "--namespace", "default", "--autoregister",
                            "--registry", str(tmp_path / "mesh.yaml"), "-o", str(out), "--tokenDuration", "600",
                            state_dir=istiod.state_dir)
    assert f"Configuration generation into directory {out} was successful" in done.stdout
    assert "a security token for namespace 'default' and service account 'vm-sa'" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["cluster.env", "hosts", "istio-token", "mesh.yaml",
                                                     "root-cert.pem"]
    assert (out / "root-cert.pem").read_bytes() == istiod.root_pem()
    assert "ISTIO_META_AUTO_REGISTER_GROUP='vm'\n" in (out / "cluster.env").read_text()
    assert (out / "hosts").read_text() == "127.0.0.1 istiod.istio-system.svc\n"
    assert "readinessProbe:\n    httpGet:\n      port: 8080\n" in (out / "mesh.yaml").read_text()

    watcher, vm = Watcher(istiod), Vm(istiod, "10.0.0.8")
    vm.token = (out / "istio-token").read_text()
    try:
        assert await watcher.start() == set()
        await vm.connect()
        assert await watcher.next() == {"10.0.0.8"}
    finally:
        await vm.close()
        await watcher.close()


def test_configure_refuses_an_unknown_group_and_conflicting_flags(tmp_path: Path) -> None:
    registry = RegistryFile(tmp_path / "mesh.yaml", REGISTRY)
    base = ["workload-entry", "configure", "--registry", str(registry.path), "-o", str(tmp_path / "out")]
    done = istiod_local_cli(*base, "--name", "nope", "--namespace", "default", state_dir=tmp_path / "s", check=False)
    assert done.returncode != 0 and "workloadgroup nope not found in namespace default" in done.stderr
    done = istiod_local_cli(*base, "--name", "vm", "--namespace", "default", "--internalIP", "10.0.0.1",
                            "--externalIP", "10.0.0.2", state_dir=tmp_path / "s", check=False)
    assert done.returncode != 0 and "mutually exclusive" in done.stderr
    done = istiod_local_cli(*base, state_dir=tmp_path / "s", check=False)
    assert done.returncode != 0 and "expecting a WorkloadGroup artifact file" in done.stderr


@pytest.mark.parametrize(("variable", "value"), [("PILOT_WORKLOAD_ENTRY_GRACE_PERIOD", "soon"),
                                                  ("PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS", "maybe")])
def test_a_bad_istiod_variable_stops_serve_naming_it(tmp_path: Path, variable: str, value: str) -> None:
    registry = RegistryFile(tmp_path / "mesh.yaml", REGISTRY)
    env = {**os.environ, variable: value}
    done = istiod_local_cli("serve", "--registry", str(registry.path), "--kube-api-addr", "off",
                            state_dir=tmp_path / "s", env=env, check=False)
    assert done.returncode != 0 and f"{variable}: " in done.stderr and repr(value) in done.stderr


def test_configure_without_an_address_for_istiod_leaves_hosts_empty(tmp_path: Path) -> None:
    registry = RegistryFile(tmp_path / "mesh.yaml", REGISTRY)
    out = tmp_path / "out"
    done = istiod_local_cli("workload-entry", "configure", "--registry", str(registry.path), "-o", str(out),
                            "--name", "vm", "--namespace", "default", "--discovery-address", "istiod.example:15012",
                            "--capture-dns=false", state_dir=tmp_path / "s")
    assert "use --ingressIP" in done.stderr and (out / "hosts").read_text() == ""
    assert "ISTIO_META_DNS_CAPTURE" not in (out / "cluster.env").read_text()
    assert "discoveryAddress: istiod.istio-system.svc:15012\n" in (out / "mesh.yaml").read_text()


async def test_delta_streams_register_and_report_health_too() -> None:
    """In-process, on a Delta stream (the agent relays Envoy's flavour), with the identity check off."""
    options = WorkloadEntryOptions(validate_identity=False)
    ads = AdsServer(parse_registry(REGISTRY), workload_entries=AutoRegistration(options=options))
    server = grpc.aio.server()
    ads.register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).DeltaAggregatedResources()
        node = _node("vm-host", "10.0.0.5", AUTO_REGISTER_GROUP="vm", PROXY_CONFIG=PROBE)
        await call.write(discovery_pb2.DeltaDiscoveryRequest(node=node, type_url=typeurls.CLUSTER))
        await asyncio.wait_for(call.read(), 10)
        assert [(e["name"], e["healthy"]) for e in ads.workload_entry_status()] == [("vm-10.0.0.5", False)]
        await call.write(discovery_pb2.DeltaDiscoveryRequest(type_url=typeurls.HEALTH_INFO))
        await eventually(lambda: ads.workload_entry_status()[0]["healthy"], "the good report to count")
        bad = discovery_pb2.DeltaDiscoveryRequest(type_url=typeurls.HEALTH_INFO,
                                                  error_detail=status_pb2.Status(code=13, message="503"))
        await call.write(bad)
        await eventually(lambda: not ads.workload_entry_status()[0]["healthy"], "the bad report to count")
        assert ads.workload_entry_status()[0]["conditions"][0]["message"] == "503"
        call.cancel()
    finally:
        await channel.close()
        await server.stop(None)

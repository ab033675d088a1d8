"""resolv.conf parsing, the /debug/ndsz view, metrics exposition and options parsing."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_dns_support import info, sample_table

from istio_agent.dns import name_table_json
from istio_agent.dns.core.responder import FAILED, FORWARDED, LOCAL, MALFORMED
from istio_agent.dns.forward import Forwarder, parse_resolv_conf
from istio_agent.dns.metrics import UPSTREAM_FAILURES, DnsMetrics
from istio_agent.dns.options import DnsProxyOptions, port53_rules
from istio_agent.dns.proxy import listen_host_port
from istio_agent.metrics import CollectorRegistry, generate_latest
from istio_agent.protos import nds_pb2


def test_resolv_conf() -> None:
    conf = parse_resolv_conf(
        "# comment\n"
        "nameserver 10.96.0.10\n"
        "domain ignored.example\n"
        "search ns1.svc.cluster.local svc.cluster.local cluster.local  # trailing\n"
        "nameserver fd00::10 ; another\n"
        "options ndots:5\n"
        "nameserver\n"
    )
    assert conf.servers == ("10.96.0.10", "fd00::10")
    assert conf.search == ("ns1.svc.cluster.local", "svc.cluster.local", "cluster.local")
    assert parse_resolv_conf("search a b\ndomain c\n").search == ("c",)  # last one wins
    assert parse_resolv_conf("").servers == ()


def test_ndsz_before_and_after() -> None:
    assert name_table_json(None) == (404, "{}")
    nt = nds_pb2.NameTable()
    nt.table["svc.ns1.svc.cluster.local"].CopyFrom(info(["1.2.3.4"], "Kubernetes", "svc", "ns1", ["alt.example"]))
    nt.table["ext.example"].CopyFrom(info(["5.6.7.8"]))
    status, body = name_table_json(nt)
    assert status == 200
    assert json.loads(body) == {"table": {
        "svc.ns1.svc.cluster.local": {"ips": ["1.2.3.4"], "registry": "Kubernetes", "shortname": "svc",
                                      "namespace": "ns1", "altHosts": ["alt.example"]},
        "ext.example": {"ips": ["5.6.7.8"], "registry": "External"},
    }}
    assert name_table_json(sample_table())[1] == name_table_json(sample_table())[1]


def _scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_on_given_registry() -> None:
    registry = CollectorRegistry()
    metrics = DnsMetrics(registry)
    udp, udp2, tcp = metrics.counts("udp"), metrics.counts("udp"), metrics.counts("tcp")
    udp[LOCAL] += 3
    udp2[LOCAL] += 2
    udp[FORWARDED] += 4
    tcp[FAILED] += 2
    tcp[UPSTREAM_FAILURES] += 1
    udp2[MALFORMED] += 5
    metrics.upstream_latency.observe(0.003)
    got = _scrape(registry)
    assert got[("istio_agent_dns_queries_total", (("outcome", "local"), ("protocol", "udp")))] == 5
    assert got[("istio_agent_dns_queries_total", (("outcome", "forwarded"), ("protocol", "udp")))] == 4
    assert got[("istio_agent_dns_queries_total", (("outcome", "failed"), ("protocol", "tcp")))] == 2
    assert got[("istio_agent_dns_queries_total", (("outcome", "malformed"), ("protocol", "udp")))] == 5
    assert got[("istio_agent_dns_requests_total", ())] == 16
    assert got[("istio_agent_dns_upstream_requests_total", ())] == 5
    assert got[("istio_agent_dns_upstream_failures_total", ())] == 1
    assert got[("istio_agent_dns_upstream_request_duration_seconds_count", ())] == 1
    assert got[("istio_agent_dns_upstream_request_duration_seconds_bucket", (("le", "0.005"),))] == 1
    assert got[("istio_agent_dns_upstream_request_duration_seconds_bucket", (("le", "0.001"),))] == 0


def test_metrics_default_to_a_private_registry() -> None:
    from prometheus_client import REGISTRY
    before = set(REGISTRY._names_to_collectors)
    first, second = DnsMetrics(), DnsMetrics()  # twice: no duplicate registration anywhere
    assert set(REGISTRY._names_to_collectors) == before
    assert first.registry is not second.registry


def test_listen_address() -> None:
    assert listen_host_port("localhost:15053") == ("localhost", 15053)
    assert listen_host_port("[::1]:53") == ("::1", 53)
    assert listen_host_port("0.0.0.0:15053") == ("0.0.0.0", 15053)
    assert listen_host_port(":15053") == ("", 15053)


@pytest.mark.parametrize("addr", ["localhost", "localhost:dns", "::1:53", "127.0.0.1:70000"])
def test_bad_listen_address_names_the_setting(addr: str) -> None:
    with pytest.raises(ValueError, match=r"^DNS address: ") as err:
        listen_host_port(addr)
    assert repr(addr) in str(err.value)


def test_port53_rules() -> None:
    base = DnsProxyOptions(addr="0.0.0.0:53", resolv_conf="/etc/resolv.conf")
    root = port53_rules(base, uid=0, alt_resolv_conf_exists=True)
    assert root.respond_before_sync and root.resolv_conf == "/var/lib/istio/resolv.conf"
    assert port53_rules(base, uid=0, alt_resolv_conf_exists=False).resolv_conf == "/etc/resolv.conf"
    assert port53_rules(base, uid=1337, alt_resolv_conf_exists=True).addr == "localhost:15053"
    other = DnsProxyOptions(addr="localhost:15053")
    assert port53_rules(other, uid=0, alt_resolv_conf_exists=True) is other


@pytest.mark.parametrize("parallel", [False, True])
async def test_forwarder_without_servers_fails_at_once(parallel: bool) -> None:
    forwarder = Forwarder([], parallel=parallel, timeout=5.0)
    await forwarder.start()
    try:
        got: list[bytes | None] = []
        forwarder.query_udp(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x01x\x00\x00\x01\x00\x01",
                            got.append)
        assert got == [None]
        assert await forwarder.query(b"\x12\x34" + b"\x01\x00" + b"\x00" * 8, tcp=True) is None
    finally:
        await forwarder.close()

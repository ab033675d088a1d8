"""Real peers for the DNS component tests: a dnsmasq upstream, dig, and the proxy itself.

No tests here; test_dns_proxy.py and test_dns_fuzz.py import these helpers.
Everything listens on loopback only and is torn down by the fixtures.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import dns.rdatatype
from needs import need_tool
from support import free_udp_tcp_port, stop_process

from istio_agent.dns import DnsProxy, DnsProxyOptions
from istio_agent.metrics import CollectorRegistry
from istio_agent.protos import nds_pb2

NAMESPACE = "ns1"
DOMAIN = "ns1.svc.cluster.local"
SEARCH = "ns1.svc.cluster.local svc.cluster.local cluster.local"
BIG_COUNT = 100


def dns_query(port: int, name: str, rdtype: str = "A", *, tcp: bool = False, timeout: float = 2.0,
              host: str = "127.0.0.1") -> dns.message.Message:
    q = dns.message.make_query(name, dns.rdatatype.from_text(rdtype))
    if tcp:
        return dns.query.tcp(q, host, port=port, timeout=timeout)
    return dns.query.udp(q, host, port=port, timeout=timeout)


def wait_answering(port: int, name: str, deadline_s: float = 10.0) -> None:
    """Poll until a server on `port` answers (any rcode) over UDP and TCP."""
    deadline = time.monotonic() + deadline_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            dns_query(port, name, timeout=0.3)
            dns_query(port, name, tcp=True, timeout=0.3)
            return
        except Exception as exc:  # not up yet
            last = exc
            time.sleep(0.05)
    raise TimeoutError(f"DNS server on port {port} never answered: {last}")


@dataclass
class Dnsmasq:
    port: int
    proc: subprocess.Popen[bytes]


@contextlib.contextmanager
def run_dnsmasq(extra: list[str], port: int | None = None) -> Iterator[Dnsmasq]:
    """dnsmasq on 127.0.0.1:port, no system config, no upstream; stopped on exit."""
    binary = need_tool("dnsmasq")
    port = port or free_udp_tcp_port()
    proc = subprocess.Popen(
        [binary, "--no-daemon", "--conf-file=/dev/null", f"--port={port}", "--listen-address=127.0.0.1",
         "--bind-interfaces", "--no-resolv", "--no-hosts", "--pid-file=", "--log-facility=/dev/null", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_answering(port, "probe.invalid.")
        yield Dnsmasq(port, proc)
    finally:
        stop_process(proc, grace=5)


def upstream_args() -> list[str]:
    """The test upstream: *.ext.test -> 1.2.3.4, big.ext.test with BIG_COUNT A records, a TXT."""
    args = ["--address=/ext.test/1.2.3.4", "--txt-record=txt.ext.test,hello from dnsmasq", "--edns-packet-max=4096"]
    args += [f"--host-record=big.ext.test,10.1.{i // 256}.{i % 256}" for i in range(BIG_COUNT)]
    return args


def dig(port: int, *args: str, host: str = "127.0.0.1") -> str:
    binary = need_tool("dig")
    result = subprocess.run([binary, f"@{host}", "-p", str(port), "+tries=1", "+time=3", *args],
                            capture_output=True, text=True, timeout=30)
    return result.stdout


def dig_message(port: int, *args: str, host: str = "127.0.0.1") -> dns.message.Message:
    """Run dig and parse its raw reply (+qr off, hex dump via +noall +answer is not enough)."""
    out = dig(port, "+noall", "+comments", "+answer", *args, host=host)
    return parse_dig(out)


def parse_dig(out: str) -> dns.message.Message:
    """Rebuild a message from dig's presentation output (header line, flags line, answer section)."""
    text = []
    rcode = "NOERROR"
    flags = ""
    for line in out.splitlines():
        if "->>HEADER<<-" in line:
            rcode = line.split("status:")[1].split(",")[0].strip()
        elif line.startswith(";; flags:"):
            flags = line.split(";", 2)[2].split(":", 1)[1].split(";")[0].strip().upper()
        elif line and not line.startswith(";"):
            text.append(line)
    if not flags and rcode == "NOERROR" and not text:
        raise AssertionError(f"dig got no reply:\n{out}")
    body = f"id 1\nopcode QUERY\nrcode {rcode}\nflags {flags}\n;ANSWER\n" + "\n".join(text) + "\n"
    return dns.message.from_text(body)


def write_resolv_conf(path: Path, servers: list[str], search: str = SEARCH) -> Path:
    path.write_text("".join(f"nameserver {s}\n" for s in servers) + f"search {search}\noptions ndots:5\n")
    return path


def name_table() -> nds_pb2.NameTable:
    nt = nds_pb2.NameTable()
    entries = {
        "echo.ns1.svc.cluster.local": nds_pb2.NameInfo(ips=["10.96.0.20"], registry="Kubernetes",
                                                       shortname="echo", namespace="ns1"),
        "other.ns2.svc.cluster.local": nds_pb2.NameInfo(ips=["10.96.0.30"], registry="Kubernetes",
                                                        shortname="other", namespace="ns2"),
        "api.example.com": nds_pb2.NameInfo(ips=["240.240.0.1"], registry="External"),
        "v6.example.com": nds_pb2.NameInfo(ips=["fd00::1"], registry="External"),
        "*.wild.example.com": nds_pb2.NameInfo(ips=["240.240.0.9"], registry="External"),
        "many.example.com": nds_pb2.NameInfo(ips=[f"240.240.{i // 256}.{i % 256}" for i in range(BIG_COUNT)],
                                             registry="External"),
    }
    for host, entry in entries.items():
        nt.table[host].CopyFrom(entry)
    return nt


@contextlib.asynccontextmanager
async def running_proxy(resolv_conf: Path, upstream_port: int, *, addr: str = "127.0.0.1:0",
                        timeout: float = 1.0, parallel: bool = False,
                        registry: CollectorRegistry | None = None, **options: Any) -> AsyncIterator[DnsProxy]:
    """A started proxy on loopback; `options` are further DnsProxyOptions fields."""
    proxy = DnsProxy(DnsProxyOptions(addr=addr, namespace=NAMESPACE, domain=DOMAIN,
                                     resolv_conf=str(resolv_conf), upstream_port=upstream_port,
                                     upstream_timeout=timeout, forward_parallel=parallel, **options),
                     registry=registry if registry is not None else CollectorRegistry())
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()

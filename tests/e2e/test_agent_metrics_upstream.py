"""The agent's :15020 metric families against upstream's, each read from a running pod of its own.

Two pods, each a network namespace with its own istiod-local, Envoy and DNS proxy: one runs upstream's
Go pilot-agent (`tests/upstream_agent.py` says where it is), the other ours, with the same environment.
Both are taken through the same life: ready (upstream records its start-up time then), a DNS query
answered from the NameTable and one forwarded to a resolver that cannot be reached, a scrape, then
istiod restarted under them (their XDS streams end and are dialled again). Then the `istio_agent_*`
families of each merged page are compared: every one upstream's has, ours has under the same name, type
and label names, but for the exceptions below. Upstream's agent writes a family only once it has a value
(its OpenTelemetry exporter), ours from the start, so ours may have more; `docs/PILOT-AGENT.md#metrics`
lists upstream's whole set, which `tests/unit/test_agent_metric_families.py` checks without a Go agent.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import upstream_agent
from launchers import IstiodLocal, RegistryFile, agent_environment, echo_registry
from needs import need, need_root, need_sidecar_binaries, need_tool
from support import ENVOY, PILOT_AGENT, poll, stop_process

# Families upstream's agent has and ours does not, and why: a Python process has no Go runtime.
EXCEPTIONS = re.compile(r"istio_agent_go_.*")
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")
SCRAPE = """
import http.client, sys
conn = http.client.HTTPConnection("127.0.0.1", 15020, timeout=10)
conn.request("GET", sys.argv[1])
response = conn.getresponse()
sys.stdout.write(f"{response.status}\\n")
sys.stdout.flush()
sys.stdout.buffer.write(response.read())
"""


@dataclass(frozen=True)
class Family:
    type: str
    labels: frozenset[str]


def families(page: str) -> dict[str, Family]:
    """`istio_agent_*` families of a text page: TYPE lines, and the label names of their series."""
    types = {m.group(1): m.group(2) for m in re.finditer(r"^# TYPE (istio_agent_\S+) (\S+)$", page, re.M)}
    labels: dict[str, set[str]] = {name: set() for name in types}
    for line in page.splitlines():
        if not line.startswith("istio_agent_"):
            continue
        sample = re.split(r"[{ ]", line, maxsplit=1)[0]
        family = sample if sample in types else next(
            (sample[: -len(s)] for s in SUFFIXES if sample.endswith(s) and sample[: -len(s)] in types), None)
        if family is not None:
            labels[family] |= set(re.findall(r'([a-zA-Z_]\w*)="', line)) - {"le", "quantile"}
    return {name: Family(typ, frozenset(labels[name])) for name, typ in types.items()}


def same_family(theirs: Family, ours: Family) -> bool:
    """Same type, and the same label names when both pages have series of it: a family nothing has counted yet
    shows no series, so no label names (an expired SDS nonce, say, happens in one run and not the other)."""
    return theirs.type == ours.type and (theirs.labels == ours.labels or not theirs.labels or not ours.labels)


class Pod:
    """A network namespace with istiod-local and one agent (ours or upstream's) in a pod directory."""

    def __init__(self, base: Path, name: str, upstream: bool) -> None:
        self.name, self.upstream = name, upstream
        self.ns = f"s27b-{name}-{base.name[-6:]}"
        self.dir = base / name
        self.prefix = ["ip", "netns", "exec", self.ns]
        self.agent: subprocess.Popen[bytes] | None = None
        self.log = base / f"{name}.log"
        subprocess.run(["ip", "netns", "add", self.ns], check=True, timeout=30)
        subprocess.run(["ip", "-n", self.ns, "link", "set", "lo", "up"], check=True, timeout=30)
        registry = RegistryFile(base / f"{name}-mesh.yaml", echo_registry())
        self.istiod = IstiodLocal(base / f"{name}-state", registry=registry, grpc_addr="127.0.0.1:15010",
                                  secure_addr="127.0.0.1:15012", prefix=self.prefix)

    def start(self) -> None:
        self.istiod.start()
        self.istiod.pod_files(self.dir, pod="echo-1")
        if self.upstream:
            upstream_agent.lay_out_pod(self.dir)
            environment = agent_environment(proxy_config={
                "discoveryAddress": "127.0.0.1:15012", "binaryPath": str(ENVOY), "configPath": "./etc/istio/proxy"})
            binary = upstream_agent.upstream_bin() / "pilot-agent"
        else:
            environment = agent_environment(discovery="localhost:15012")
            binary = PILOT_AGENT
        environment.update(ISTIO_META_DNS_CAPTURE="true", CLOUD_PLATFORM="none")
        with self.log.open("wb") as log:
            self.agent = subprocess.Popen([*self.prefix, str(binary), "proxy", "sidecar"], cwd=self.dir,
                                          env=environment, stdout=log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def get(self, path: str) -> tuple[int, str]:
        done = subprocess.run([*self.prefix, sys.executable, "-c", SCRAPE, path], capture_output=True, timeout=30)
        if done.returncode != 0:
            return 0, done.stderr.decode(errors="replace")
        status, _, body = done.stdout.partition(b"\n")
        return int(status), body.decode(errors="replace")

    def ready(self) -> bool:
        assert self.agent is not None and self.agent.poll() is None, f"{self.name}'s agent exited:\n{self.output()}"
        return self.get("/healthz/ready")[0] == 200

    def dig(self, name: str) -> None:
        subprocess.run([*self.prefix, "dig", "@127.0.0.1", "-p", "15053", "+time=7", "+tries=1", name],
                       capture_output=True, timeout=30)

    def page(self) -> str:
        status, body = self.get("/stats/prometheus")
        assert status == 200, f"{self.name}: /stats/prometheus answered {status}: {body[:500]}"
        return body

    def close(self) -> None:
        stop_process(self.agent)  # type: ignore[arg-type]
        self.istiod.stop()
        for pid in subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True).stdout.split():
            subprocess.run(["kill", "-9", pid], check=False)
        subprocess.run(["ip", "netns", "del", self.ns], check=False, timeout=30)


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[tuple[Pod, Pod]]:
    need_root()
    need_sidecar_binaries()
    need_tool("dig")
    need(not upstream_agent.missing(), upstream_agent.missing())
    made: list[Pod] = []
    try:
        theirs = Pod(tmp_path, "go", upstream=True)
        made.append(theirs)
        ours = Pod(tmp_path, "py", upstream=False)
        made.append(ours)
        yield theirs, ours
    finally:
        for pod in made:
            pod.close()


def test_our_metric_families_contain_upstreams(pods: tuple[Pod, Pod]) -> None:
    theirs, ours = pods
    for pod in pods:
        pod.start()
    for pod in pods:
        poll(pod.ready, f"{pod.name}'s agent to be ready", 90, pod.output)
        pod.dig("echo.default.svc.cluster.local.")  # answered from the NameTable
        pod.dig("nothing-here.invalid.")  # forwarded to resolv.conf's servers, which this namespace cannot reach
        pod.page()
    before = {pod.name: pod.page().count("istio_agent_xds_proxy_requests") for pod in pods}
    assert all(before.values()), before
    for pod in pods:  # istiod goes away and comes back: each agent's XDS streams end and are dialled again
        pod.istiod.stop()
        pod.istiod.start()
    for pod in pods:
        def reconnected(pod: Pod = pod) -> bool:
            page = pod.page()  # ours has the series from the start: wait for them to count the ends
            return all(counted_types(page, f"istio_agent_{side}_connection_terminations")
                       for side in ("istiod", "envoy")) and pod.ready()

        poll(reconnected, f"{pod.name}'s agent to reconnect", 90, pod.output)
    their_page, our_page = theirs.page(), ours.page()
    upstream_families, our_families = families(their_page), families(our_page)

    missing = {name for name in upstream_families if name not in our_families}
    assert {name for name in missing if not EXCEPTIONS.fullmatch(name)} == set(), sorted(our_families)
    assert missing, "upstream's page had no Go runtime families: was it upstream's agent?"
    differing = {name: (family, our_families[name]) for name, family in upstream_families.items()
                 if name in our_families and not same_family(family, our_families[name])}
    assert differing == {}
    # What both runs went through shows on both pages.
    for name in ("istio_agent_startup_duration_seconds", "istio_agent_dns_requests_total",
                 "istio_agent_istiod_connection_terminations", "istio_agent_envoy_connection_terminations",
                 "istio_agent_pilot_xds_send_time", "istio_agent_scrapes_total"):
        assert name in upstream_families and name in our_families, name
    # istiod going away ended each agent's streams the same way: its side as upstream classifies the status
    # (istiod-local's "Cancelling all calls" is an error to both), Envoy's side cancelled by the proxy.
    for family in ("istio_agent_istiod_connection_terminations", "istio_agent_envoy_connection_terminations"):
        assert counted_types(our_page, family) == counted_types(their_page, family) != set(), family


def counted_types(page: str, family: str) -> set[str]:
    """The `type` values of `family`'s series that counted something."""
    return {m.group(1) for m in re.finditer(rf'^{family}{{type="(\w+)"}} (\S+)$', page, re.M)
            if float(m.group(2)) > 0}

"""Envoy's bootstrap (`envoy-rev.json`) and command line against upstream's agent, on generated pods.

Each case is a pod as `pilot-agent proxy sidecar|router` sees it: a ProxyConfig (PROXY_CONFIG, and for some
cases part of it as the mesh config file's `defaultConfig` or the `proxy.istio.io/config` annotation) with the
fields that reach the bootstrap (discoveryAddress, statNameLength, proxyStatsMatcher, concurrency, drain
durations, tracing of every provider, proxyMetadata, holdApplicationUntilProxyStarts, ports, the metrics and
access-log services, extraStatTags, gatewayTopology, runtimeValues, ...), the pod's annotations (the stats
inclusion lists and histogram buckets) and labels files, node metadata (ISTIO_META_*), the pod's environment
(POD_*, INSTANCE_IP, ...), flags (--domain, --concurrency, --proxyLogLevel, --proxyComponentLogLevel,
--log_as_json) and the pod's interface addresses.

Upstream's agent (the Go `pilot-agent` at the pin) runs in a network namespace of its own (each agent binds
fixed ports) that holds the case's addresses, a `upstream_sandbox.Sandbox` set up once per module, in a pod
directory with its proxy image's bootstrap template (./var/lib/istio/envoy/envoy_bootstrap_tmpl.json: its
default rendering) and file-mounted workload certificates (./var/run/secrets/workload-spiffe-credentials, so
neither agent asks a CA or waits for a certificate; ./etc/certs/root-cert.pem is the XDS root). ProxyConfig's
`binaryPath` is a stand-in Envoy that records its command line and a copy of its `-c` file in the working
directory, then waits for its agent to end: the bootstrap compared is the one the agent handed Envoy.

Ours is our default rendering (the built-in renderer: the pod directory has no template), made the way our
agent makes it at Envoy's start: options loaded by `load_agent_options` inside a namespace with the same
addresses (a thread that entered it), the bootstrap written by `write_bootstrap`, the command line from
`envoy_command`. A process start per case would make a case cost seconds; every PROCESS_EVERY-th case also runs
our real `pilot-agent` (with the same stand-in, at the same time as upstream's), and what its Envoy was handed
must be the in-process bytes and command line, which ties the two paths together.

Compared: whether each side started Envoy (a pod either refuses is refused by both), the bootstrap as parsed
JSON, Envoy's command line, the files of the config directory (names, modes; sockets left out) and the
bootstrap's mode. Normalised (docs/UPSTREAM.md): each side's pod directory (`<workdir>`); ISTIO_VERSION, when
the pod does not set it (upstream's module build has no release stamp: "unknown"); the bootstrap is read as
Envoy reads it (JSON, else YAML, which Envoy falls back to).

Deliberate differences (docs/UPSTREAM.md), each counted only under its own conditions: ours puts DNS_PROXY_ADDR
(its default) in node metadata whenever the DNS proxy runs (docs/NOT-UPSTREAM.md; only that key, only when the
variable is unset); with ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL=true upstream's template leaves a trailing comma
in the status listener's filter, so its file is not strict JSON (Envoy reads it as YAML, the same config),
where ours writes strict JSON; node metadata that does not fit upstream's typed field makes upstream's agent
exit ("failed generating node metadata") where ours keeps the value, as in the gRPC bootstrap's differential.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import upstream_agent
import yaml
from hypothesis import given
from hypothesis import strategies as st
from needs import need, need_file
from support import VENV_BIN
from upstream_peers import (
    DIFF_EXAMPLES,
    Tally,
    base_env,
    describe,
    differential,
    downward_file,
    in_netns,
    need_upstream,
)
from upstream_sandbox import Sandbox

from istio_agent.agent.loader import load_agent_options
from istio_agent.agent.options import AgentFlags
from istio_agent.config import env
from istio_agent.envoy.argv import envoy_command, read_bootstrap_override
from istio_agent.envoy.bootstrap.render import write_bootstrap
from istio_agent.grpcxds.writer import write_bootstrap_file
from istio_agent.version import ISTIO_COMPAT_VERSION

HOSTS: dict[str, tuple[str, ...]] = {
    "loopback": (),
    "v4": ("10.244.1.9/24",),
    "v6": ("fd00:10:244:1::9/64",),
    "dual": ("10.244.1.9/24", "fd00:10:244:1::9/64"),
}
PROCESS_EVERY = 20  # one case in this many also runs our pilot-agent as a process
CONFIG_DIR = "etc/istio/proxy"
ENVOY_CONFIG = "envoy-config.json"  # the stand-in's copy of its -c file
ENVOY_ARGV = "envoy-argv.txt"  # the stand-in's command line, one argument a line
STAND_IN = f"""#!/bin/sh
# A stand-in Envoy: its command line and a copy of its -c file in its working directory, then it waits for
# its agent to end. `--mode validate` (ours asks it when a bootstrap has istio-proxy-only parts) passes.
for arg in "$@"; do [ "$arg" = validate ] && exit 0; done
printf '%s\\n' "$@" > {ENVOY_ARGV}.tmp && mv {ENVOY_ARGV}.tmp {ENVOY_ARGV}
config=""
while [ $# -gt 0 ]; do [ "$1" = -c ] && config="$2"; shift; done
cp "$config" {ENVOY_CONFIG}.tmp && mv {ENVOY_CONFIG}.tmp {ENVOY_CONFIG}
while kill -0 "$PPID" 2>/dev/null; do sleep 0.2; done
"""
TEMPLATE_ENV = {"CLOUD_PLATFORM": "none"}  # no cloud metadata server to ask (both read it)
FATAL = re.compile(r"^Error: ", re.M)

NAME = st.from_regex(r"\A[a-z]([a-z0-9-]{0,10}[a-z0-9])?\Z", fullmatch=True)
LABEL = st.from_regex(r"\A[a-z0-9]([a-z0-9.-]{0,10}[a-z0-9])?\Z", fullmatch=True)
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=10)
DURATION = st.sampled_from(["45s", "5s", "1m30s", "0.5s", "2s", "0s"])
STAT_PREFIX = st.sampled_from(["cluster.outbound", "http.inbound", "reporter=", "tcp", "upstream_rq_", "grpc"])
STAT_REGEX = st.sampled_from([".*outlier_detection.*", "cluster\\..*", "http\\.[0-9]+\\.rq"])
MATCHER = st.fixed_dictionaries({}, optional={
    "inclusionPrefixes": st.lists(STAT_PREFIX, max_size=2), "inclusionSuffixes": st.lists(STAT_PREFIX, max_size=2),
    "inclusionRegexps": st.lists(STAT_REGEX, max_size=2)})
TRACING = st.one_of(
    st.builds(lambda a: {"zipkin": {"address": a}}, st.sampled_from(["zipkin.istio-system:9411", "10.0.0.9:9411"])),
    st.just({"datadog": {"address": "$(HOST_IP):8126"}}),
    st.just({"lightstep": {"address": "lightstep-satellite:443", "accessToken": "token-1"}}),
    st.just({"stackdriver": {"debug": True, "maxNumberOfAttributes": 200}}),
    st.just({"openCensusAgent": {"address": "dns:opencensus:55678", "context": ["W3C_TRACE_CONTEXT", "B3"]}}),
).flatmap(lambda provider: st.fixed_dictionaries({}, optional={
    "sampling": st.sampled_from([1.0, 50.0, 100.0, 0.0]), "maxPathTagLength": st.sampled_from([0, 99, 256]),
    "customTags": st.just({"env": {"environment": {"name": "POD_NAME", "defaultValue": "x"}},
                           "lit": {"literal": {"value": "v"}}}),
}).map(lambda extra: {**provider, **extra}))
PROXY_METADATA = st.dictionaries(
    st.sampled_from(["ISTIO_META_FOO", "ISTIO_META_NETWORK", "ISTIO_META_DNS_CAPTURE", "BAR",
                     "ISTIO_META_ENABLE_HBONE", "ISTIO_META_CLUSTER_ID"]),
    st.sampled_from(["true", "false", "net-1", "c1", ""]), max_size=2)
PROXY_CONFIG: dict[str, st.SearchStrategy[Any]] = {
    "discoveryAddress": st.sampled_from(["istiod.istio-system.svc:15012", "localhost:15010", "10.0.0.1:15012",
                                         "[fd00::1]:15012", "istiod-canary.istio-system.svc:15012"]),
    "statNameLength": st.sampled_from([0, 50, 189, 250]),
    "proxyStatsMatcher": MATCHER,
    "concurrency": st.sampled_from([0, 1, 2, 8]),
    "drainDuration": DURATION, "terminationDrainDuration": DURATION,
    "tracing": TRACING,
    "proxyMetadata": PROXY_METADATA,
    "holdApplicationUntilProxyStarts": st.booleans(),
    "statusPort": st.sampled_from([15020, 15021]),
    "proxyAdminPort": st.sampled_from([15000, 15001]),
    "controlPlaneAuthPolicy": st.sampled_from(["MUTUAL_TLS", "NONE"]),
    "serviceCluster": NAME,
    "tracingServiceName": st.sampled_from(["APP_LABEL_AND_NAMESPACE", "CANONICAL_NAME_ONLY",
                                           "CANONICAL_NAME_AND_NAMESPACE"]),
    "envoyMetricsService": st.builds(lambda a: {"address": a}, st.sampled_from(["ems.istio-system:9000"])),
    "envoyAccessLogService": st.builds(lambda a: {"address": a}, st.sampled_from(["als.istio-system:9000"])),
    "extraStatTags": st.lists(st.sampled_from(["request_host", "destination_port", "custom"]), max_size=2),
    "gatewayTopology": st.fixed_dictionaries({"numTrustedProxies": st.integers(0, 3)}),
    "meshId": NAME,
    "runtimeValues": st.dictionaries(st.sampled_from(["envoy.reloadable_features.x", "re2.max_program_size.x"]),
                                     st.sampled_from(["true", "1000"]), max_size=2),
}
KNOWN_META: dict[str, st.SearchStrategy[str]] = {
    "CLUSTER_ID": NAME, "NETWORK": NAME, "MESH_ID": NAME, "WORKLOAD_NAME": NAME,
    "DNS_CAPTURE": st.sampled_from(["true", "false"]), "ENABLE_HBONE": st.sampled_from(["true", "false"]),
    "REQUESTED_NETWORK_VIEW": st.lists(NAME, max_size=2).map(",".join),
    "APP_CONTAINERS": st.lists(NAME, max_size=2).map(",".join),
    "INTERCEPTION_MODE": st.sampled_from(["REDIRECT", "TPROXY", "NONE"]),
    "ROUTER_MODE": st.sampled_from(["sni-dnat", "standard"]),
    "ENABLE_SELF_DISCOVERY": st.sampled_from(["true", "false"]),
    "SIDECAR_LISTEN_ALL": st.sampled_from(["true", "false"]),
    "ISTIO_VERSION": st.sampled_from(["1.28.0", "1.30.0-dev"]),
    "OWNER": st.just("kubernetes://apis/apps/v1/namespaces/ns/deployments/app"),
}
STATS_ANNOTATIONS: dict[str, st.SearchStrategy[str]] = {
    "sidecar.istio.io/statsInclusionPrefixes": st.lists(STAT_PREFIX, min_size=1, max_size=2).map(",".join),
    "sidecar.istio.io/statsInclusionSuffixes": st.lists(STAT_PREFIX, min_size=1, max_size=2).map(",".join),
    "sidecar.istio.io/statsInclusionRegexps": st.lists(STAT_REGEX, min_size=1, max_size=2).map(",".join),
    "sidecar.istio.io/statsHistogramBuckets": st.sampled_from(['{"istiocustom": [1, 5, 10]}',
                                                              '{"cluster_manager": [1, 2.5]}']),
    "sidecar.istio.io/statsCompression": st.sampled_from(["true", "false"]),
}
# Process-wide settings upstream reads from its environment for the bootstrap.
FEATURES: dict[str, st.SearchStrategy[str]] = {
    "ISTIO_DUAL_STACK": st.sampled_from(["true", "false"]), "ISTIO_DELTA_XDS": st.sampled_from(["true", "false"]),
    "ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL": st.sampled_from(["true", "false"]),
    "HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED": st.sampled_from(["true", "false"]),
    "EXIT_ON_ZERO_ACTIVE_CONNECTIONS": st.sampled_from(["true", "false"]),
    "MINIMUM_DRAIN_DURATION": st.sampled_from(["5s", "10s"]),
    "PILOT_CERT_PROVIDER": st.sampled_from(["istiod", "kubernetes", "custom", "none"]),
    "ISTIO_META_ENABLE_SELF_DISCOVERY": st.sampled_from(["true"]),
    "ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS": st.sampled_from(["100", "x"]),
    "ISTIO_AGENT_ENVOY_LOG_AS_JSON": st.sampled_from(["true"]),
}
OVERRIDE = st.sampled_from(["admin:\n  address:\n    socket_address:\n      port_value: 15999\n",
                            "node:\n  cluster: $(HOST_IP)\n", "{}\n"])
ANNOTATION_CONFIG = st.sampled_from([
    "concurrency: 3", "drainDuration: 7s", "tracing:\n  sampling: 10", "proxyStatsMatcher:\n  inclusionPrefixes: [tls]",
    "holdApplicationUntilProxyStarts: true", "proxyMetadata:\n  ISTIO_META_X: y1"])


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    fields = draw(st.lists(st.sampled_from(sorted(PROXY_CONFIG)), max_size=5, unique=True))
    proxy_config = {name: draw(PROXY_CONFIG[name]) for name in fields}
    mesh_default = {k: proxy_config.pop(k) for k in list(proxy_config) if draw(st.integers(0, 3)) == 0}
    environment = dict(TEMPLATE_ENV)
    optional: dict[str, st.SearchStrategy[str]] = {
        "POD_NAME": NAME, "POD_NAMESPACE": NAME, "SERVICE_ACCOUNT": NAME,
        "INSTANCE_IP": st.sampled_from(["10.244.1.9", "fd00:10:244:1::9", "10.1.2.3"]),
        "ISTIO_META_CLUSTER_ID": NAME, "TRUST_DOMAIN": st.sampled_from(["cluster.local", "example.org"]),
        "HOST_IP": st.sampled_from(["10.0.0.5", "fd00::5"]),
        "ISTIO_METAJSON_ANNOTATIONS": st.just('{"extra": "x"}'),
    }
    for key, strategy in optional.items():
        if draw(st.integers(0, 2)) == 0:
            environment[key] = draw(strategy)
    for key in draw(st.lists(st.sampled_from(sorted(KNOWN_META)), max_size=3, unique=True)):
        environment[f"ISTIO_META_{key}"] = draw(KNOWN_META[key])
    for key in draw(st.lists(st.sampled_from(sorted(FEATURES)), max_size=2, unique=True)):
        environment[key] = draw(FEATURES[key])
    for key, value in draw(st.dictionaries(st.from_regex(r"\A[A-Z][A-Z0-9_]{0,8}\Z", fullmatch=True), TEXT,
                                           max_size=2)).items():
        environment[f"ISTIO_META_X_{key}"] = value
    if draw(st.integers(0, 5)) == 0:
        environment["ISTIO_METAJSON_X_EXTRA"] = draw(st.sampled_from(['{"K": {"x": 1}}', '{"A": [1, "b"]}', "{"]))
    labels = draw(st.dictionaries(st.sampled_from(["app", "version", "service.istio.io/canonical-name",
                                                   "topology.kubernetes.io/region", "topology.kubernetes.io/zone"]),
                                  NAME, max_size=3))
    annotations = {key: draw(STATS_ANNOTATIONS[key])
                   for key in draw(st.lists(st.sampled_from(sorted(STATS_ANNOTATIONS)), max_size=2, unique=True))}
    if draw(st.integers(0, 4)) == 0:
        annotations["proxy.istio.io/config"] = draw(ANNOTATION_CONFIG)
    flags = []
    if draw(st.integers(0, 3)) == 0:
        flags.append(draw(st.sampled_from(["--concurrency=2", "--proxyLogLevel=debug", "--log_as_json",
                                           "--proxyComponentLogLevel=misc:error,upstream:debug",
                                           "--domain=ns.svc.cluster.local", "--serviceCluster=svc-x"])))
    return {"type": draw(st.sampled_from(["sidecar", "sidecar", "sidecar", "router", "router", "waypoint"])),
            "flags": flags, "proxy_config": proxy_config, "yaml": draw(st.booleans()),
            "override": draw(OVERRIDE) if draw(st.integers(0, 7)) == 0 else None, "mesh_default": mesh_default,
            "env": environment, "labels": labels, "annotations": annotations,
            "host": draw(st.sampled_from(sorted(HOSTS)))}


# --- running both ---------------------------------------------------------------------------------------------
def workload_credentials() -> dict[str, bytes]:
    """A self-signed workload certificate, its key and root: file-mounted certificates, so no CA is asked."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "cluster.local")])
    now = datetime.datetime.now(datetime.UTC)
    spiffe = x509.UniformResourceIdentifier("spiffe://cluster.local/ns/default/sa/default")
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName([spiffe]), critical=False)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return {"var/run/secrets/workload-spiffe-credentials/cert-chain.pem": pem,
            "var/run/secrets/workload-spiffe-credentials/key.pem": key_pem,
            "var/run/secrets/workload-spiffe-credentials/root-cert.pem": pem,
            "etc/certs/root-cert.pem": pem}


class Bench:
    """What every case shares: the sandboxes (per host kind, one per side), the stand-in Envoy, the pods' files."""

    def __init__(self, top: Path, boxes: dict[tuple[str, str], Sandbox], template: bytes) -> None:
        self.top = top
        self.boxes = boxes
        self.stand_in = top / "envoy"
        self.stand_in.write_text(STAND_IN)
        self.stand_in.chmod(0o755)
        self.files = workload_credentials()
        self.template = template
        self.numbers = iter(range(1 << 30))

    def pod_directory(self, pod: dict[str, Any], side: str, number: int) -> Path:
        """A pod's work directory (short: sockets live in it); upstream's has its image's template."""
        workdir = self.top / f"{side[0]}{number}"
        files = dict(self.files)
        if side == "upstream":
            files[upstream_agent.TEMPLATE_IN_IMAGE] = self.template
        files["etc/istio/pod/labels"] = downward_file(pod["labels"]).encode()
        files["etc/istio/pod/annotations"] = downward_file(pod["annotations"]).encode()
        if pod["override"] is not None:
            files["override.yaml"] = pod["override"].encode()
        if pod["mesh_default"]:
            files["etc/istio/config/mesh"] = yaml.safe_dump({"defaultConfig": pod["mesh_default"]}).encode()
        for name, data in files.items():
            (workdir / name).parent.mkdir(parents=True, exist_ok=True)
            (workdir / name).write_bytes(data)
        return workdir

    def environment(self, pod: dict[str, Any], workdir: Path) -> dict[str, str]:
        """The pod's variables, PROXY_CONFIG (JSON or YAML) pointing at the stand-in Envoy, and the override."""
        proxy_config = {**pod["proxy_config"], "binaryPath": str(self.stand_in)}
        text = yaml.safe_dump(proxy_config) if pod["yaml"] else json.dumps(proxy_config)
        override = {"ISTIO_BOOTSTRAP_OVERRIDE": str(workdir / "override.yaml")} if pod["override"] else {}
        return {**pod["env"], "PROXY_CONFIG": text, **override}


@pytest.fixture(scope="module")
def bench() -> Iterator[Bench]:
    need(not upstream_agent.missing(), upstream_agent.missing())
    template = upstream_agent.bootstrap_template()
    assert template is not None
    top = Path(tempfile.mkdtemp(prefix="eb-", dir="/tmp"))
    try:
        with contextlib.ExitStack() as stack:
            boxes = {(host, side): stack.enter_context(Sandbox(top / f"box-{host}-{side}", addresses=addresses))
                     for host, addresses in HOSTS.items() for side in ("upstream", "ours")}
            yield Bench(top, boxes, template.read_bytes())
    finally:
        shutil.rmtree(top, ignore_errors=True)


class AgentRun:
    """One agent process in a pod directory inside a sandbox, until it hands Envoy its bootstrap (the stand-in's
    copy appears) or says why it will not (it exits, or prints cobra's "Error:")."""

    def __init__(self, box: Sandbox, argv: list[str], environment: dict[str, str], workdir: Path) -> None:
        self.workdir = workdir
        self.log_path = workdir / "agent.log"
        with self.log_path.open("w") as out:
            self.proc = box.popen(argv, base_env(environment), cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)

    def done(self) -> bool:
        return (self.workdir / ENVOY_CONFIG).exists() or self.proc.poll() is not None or \
            bool(FATAL.search(self.log()))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def finish(self) -> tuple[bytes | None, list[str]]:
        """The bootstrap Envoy was handed and its command line (None, [] when Envoy never started); the agent
        (and its stand-in Envoy) killed."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        config = self.workdir / ENVOY_CONFIG
        if not config.exists():
            return None, []
        return config.read_bytes(), (self.workdir / ENVOY_ARGV).read_text().splitlines()


def wait_all(runs: list[AgentRun], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not all(run.done() for run in runs):
        assert time.monotonic() < deadline, "an agent neither started Envoy nor exited:\n" + \
            "\n".join(run.log()[-2000:] for run in runs)
        time.sleep(0.01)


def agent_flags(pod: dict[str, Any]) -> AgentFlags:
    """The flags our CLI would give the agent for the pod's command line (as `cli.proxy_run.run_proxy`)."""
    import dataclasses

    from istio_agent.cli import proxy_argv

    call = proxy_argv.parse(["proxy", pod["type"], *pod["flags"]])
    assert call is not None, pod["flags"]
    values = {**call.flags, "log_as_json": call.log_options.as_json}
    wanted = {f.name for f in dataclasses.fields(AgentFlags)}
    return AgentFlags(proxy_type=call.proxy_type, **{k: v for k, v in values.items() if k in wanted})


def ours_in_process(box: Sandbox, pod: dict[str, Any], environment: dict[str, str], workdir: Path
                    ) -> tuple[bytes | None, list[str], str]:
    """Our agent's options for the pod, loaded in the sandbox's namespace, and the bootstrap and Envoy command
    line made from them as the supervisor makes them at Envoy's start."""
    def load() -> tuple[bytes | None, list[str]]:
        options = load_agent_options(agent_flags(pod), env.Environment(environment), workdir)
        if options.grpc_bootstrap is not None:  # the assembly writes it before Envoy starts (upstream too)
            write_bootstrap_file(options.grpc_bootstrap.path, options.grpc_bootstrap.content)
        envoy = options.envoy
        if envoy is None:
            return None, []
        written = write_bootstrap(envoy.bootstrap, envoy.workdir, istio_bootstrap=envoy.source.istio_bootstrap,
                                  template_file=envoy.source.template_file)
        source = envoy.source
        override = read_bootstrap_override(source.override_path, source.host_ip) if source.override_path else ""
        launch = replace(envoy.launch, config_file=written.for_envoy, config_override_json=override)
        return written.path.read_bytes(), envoy_command(envoy.binary_path, launch)[1:]

    try:
        data, argv = in_netns(box.netns, load)
        return data, argv, ""
    except Exception as exc:  # a pod we refuse: compared with upstream refusing it
        return None, [], f"{type(exc).__name__}: {exc}"


def normalised(data: bytes, workdir: Path, pod: dict[str, Any], version: str, side: str) -> Any:
    """The bootstrap as Envoy reads it, `<workdir>` for the pod directory and `<release>` for a version the pod
    did not set. A file that is not strict JSON is read as YAML, as Envoy does when its JSON parse fails; the
    caller counts that apart (`strict_json`)."""
    text = data.decode().replace(str(workdir), "<workdir>")
    try:
        bootstrap = json.loads(text)
    except ValueError as exc:
        at = getattr(exc, "pos", 0)
        try:
            bootstrap = yaml.safe_load(text)
        except yaml.YAMLError:
            raise AssertionError(f"{side}'s bootstrap is neither JSON nor YAML ({exc}): "
                                 f"...{text[max(0, at - 300):at + 100]}...") from None
    metadata = bootstrap.get("node", {}).get("metadata", {})
    if "ISTIO_META_ISTIO_VERSION" not in pod["env"] and metadata.get("ISTIO_VERSION") == version:
        metadata["ISTIO_VERSION"] = "<release>"
    return bootstrap


def normalised_argv(argv: list[str], workdir: Path) -> list[str]:
    return [arg.replace(str(workdir), "<workdir>") for arg in argv]


def config_files(workdir: Path) -> dict[str, str]:
    """The config directory's files (not sockets, not a write in flight): name -> mode."""
    directory = workdir / CONFIG_DIR
    return {p.name: oct(p.stat().st_mode & 0o7777) for p in sorted(directory.iterdir())
            if not p.is_socket() and not p.name.endswith(".tmp")} if directory.is_dir() else {}


def strict_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def without_dns_proxy_addr(pod: dict[str, Any], mine: Any, theirs: Any) -> Any:
    """docs/NOT-UPSTREAM.md: ours puts DNS_PROXY_ADDR (its default) in node metadata whenever the DNS proxy runs,
    upstream only when the variable is set. `mine` without it when that is all it adds, else None."""
    metadata = mine.get("node", {}).get("metadata", {})
    if "DNS_PROXY_ADDR" in pod["env"] or metadata.get("DNS_PROXY_ADDR") != "localhost:15053" or \
            "DNS_PROXY_ADDR" in theirs.get("node", {}).get("metadata", {}):
        return None
    trimmed = json.loads(json.dumps(mine))
    del trimmed["node"]["metadata"]["DNS_PROXY_ADDR"]
    return trimmed


def first_difference(a: Any, b: Any, path: str = "") -> str:
    """Where two JSON values first differ, for a failure message."""
    if type(a) is not type(b):
        return f"{path or '/'}: {json.dumps(a)[:300]} != {json.dumps(b)[:300]}"
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}/{key}: only in {'ours' if key not in a else 'upstream'}'s: " \
                       f"{json.dumps(a.get(key, b.get(key)))[:300]}"
            if a[key] != b[key]:
                return first_difference(a[key], b[key], f"{path}/{key}")
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}: {json.dumps(a)[:300]} != {json.dumps(b)[:300]}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return first_difference(x, y, f"{path}[{i}]")
    return f"{path or '/'}: {json.dumps(a)[:300]} != {json.dumps(b)[:300]}"


@pytest.mark.timeout(120 + 4 * DIFF_EXAMPLES)  # one pytest test runs every generated case
def test_envoy_bootstrap_differential(bench: Bench) -> None:
    upstream = need_upstream("pilot-agent")
    ours_agent = need_file(VENV_BIN / "pilot-agent", "our pilot-agent")
    tally = Tally("envoy-bootstrap")

    @differential
    @given(pod=pods())
    def compare(pod: dict[str, Any]) -> None:
        number = next(bench.numbers)
        process = number % PROCESS_EVERY == PROCESS_EVERY - 1
        theirs_dir = bench.pod_directory(pod, "upstream", number)
        ours_dir = bench.pod_directory(pod, "ours", number)
        process_dir = bench.pod_directory(pod, "process", number) if process else None
        argv = ["proxy", pod["type"], *pod["flags"]]
        runs: list[AgentRun] = []
        try:
            runs += [AgentRun(bench.boxes[pod["host"], "upstream"], [str(upstream), *argv],
                              bench.environment(pod, theirs_dir), theirs_dir)]
            if process_dir is not None:
                runs.append(AgentRun(bench.boxes[pod["host"], "ours"], [str(ours_agent), *argv],
                                     bench.environment(pod, process_dir), process_dir))
            ours, ours_argv, ours_error = ours_in_process(bench.boxes[pod["host"], "ours"], pod,
                                                          bench.environment(pod, ours_dir), ours_dir)
            wait_all(runs)
            theirs, theirs_argv = runs[0].finish()
            where = f"pod {describe(pod)}\nupstream said:\n{runs[0].log()[-1500:]}\nours said: {ours_error}"
            if process_dir is not None:
                from_process, process_argv = runs[1].finish()
                assert from_process == ours, f"our pilot-agent handed Envoy another bootstrap\n{where}\n" \
                                             f"{runs[1].log()[-1500:]}"
                assert normalised_argv(process_argv, process_dir) == normalised_argv(ours_argv, ours_dir), where
            if theirs is None and ours is not None and "failed generating node metadata" in runs[0].log():
                tally.count("deliberate: metadata not fitting upstream's typed field is kept, not fatal")
                return
            assert (ours is None) == (theirs is None), f"one side started no Envoy\n{where}"
            if theirs is None or ours is None:
                tally.count("both refused")
                return
            mine = normalised(ours, ours_dir, pod, ISTIO_COMPAT_VERSION, "ours")
            theirs_json = normalised(theirs, theirs_dir, pod, "unknown", "upstream")
            deliberate = ""
            assert strict_json(ours), f"our bootstrap is not strict JSON\n{where}"
            if not strict_json(theirs):
                # Upstream's template leaves a trailing comma in the status listener's PROXY protocol filter.
                assert pod["env"].get("ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL") == "true", \
                    f"upstream's bootstrap is not strict JSON\n{where}"
                deliberate = "strict JSON where upstream's template leaves a trailing comma (Envoy reads both)"
            if mine != theirs_json and without_dns_proxy_addr(pod, mine, theirs_json) is not None:
                mine = without_dns_proxy_addr(pod, mine, theirs_json)
                deliberate = deliberate or "DNS_PROXY_ADDR in node metadata"
            assert mine == theirs_json, f"bootstraps differ: {first_difference(theirs_json, mine)}\n{where}"
            assert normalised_argv(ours_argv, ours_dir) == normalised_argv(theirs_argv, theirs_dir), \
                f"Envoy's command lines differ\n{where}"
            assert config_files(ours_dir) == config_files(theirs_dir), where
            if deliberate:
                tally.count(f"deliberate: {deliberate}")
            else:
                tally.count("equal (and our pilot-agent process too)" if process else "equal")
        finally:
            for run in runs:
                run.finish()
            for workdir in (theirs_dir, ours_dir, process_dir):
                if workdir is not None:
                    shutil.rmtree(workdir, ignore_errors=True)

    compare()
    print(tally.report())
    assert tally.counts["cases"] >= 1


def test_normalisation_leaves_what_differs_visible(tmp_path: Path) -> None:
    """Only the pod directory and an ISTIO_VERSION the pod did not set are rewritten; YAML only when not JSON."""
    data = json.dumps({"a": f"{tmp_path}/x", "node": {"metadata": {"ISTIO_VERSION": "1.2.3"}}, "b": "unknown"})
    assert normalised(data.encode(), tmp_path, {"env": {}}, "1.2.3", "ours") == \
        {"a": "<workdir>/x", "node": {"metadata": {"ISTIO_VERSION": "<release>"}}, "b": "unknown"}
    pinned = {"env": {"ISTIO_META_ISTIO_VERSION": "1.2.3"}}
    assert normalised(data.encode(), tmp_path, pinned, "1.2.3", "ours")["node"]["metadata"]["ISTIO_VERSION"] == "1.2.3"
    assert normalised(data.encode(), tmp_path, {"env": {}}, "9.9.9", "ours")["node"]["metadata"]["ISTIO_VERSION"] == \
        "1.2.3"
    assert normalised(b'{"a": {"b": true,\n}}', tmp_path, {"env": {}}, "", "upstream") == {"a": {"b": True}}
    assert not strict_json(b'{"a": {"b": true,\n}}') and strict_json(b'{"a": 1}')
    assert normalised_argv(["-c", f"{tmp_path}/etc/istio/proxy/envoy-rev.json", "-l", "warning"], tmp_path) == \
        ["-c", "<workdir>/etc/istio/proxy/envoy-rev.json", "-l", "warning"]

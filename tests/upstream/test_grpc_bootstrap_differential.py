"""The proxyless gRPC bootstrap (GRPC_XDS_BOOTSTRAP) against upstream's agent, on generated pods.

Each case is a pod as the injection template leaves it: environment (POD_*, INSTANCE_IP, SERVICE_ACCOUNT,
ISTIO_META_* with free and well-known keys, ISTIO_METAJSON_*, PROXY_CONFIG, OUTPUT_CERTS, TRUST_DOMAIN, DNS
capture), the downward-API labels and annotations files (locality labels, `pod-template-hash`,
`proxy.istio.io/config`), `--domain`, and the pod's interface addresses (a named network namespace: none but
loopback, IPv4, IPv6, both). Upstream's `pilot-agent proxy sidecar` runs in proxyless mode
(ISTIO_META_GENERATOR=grpc, DISABLE_ENVOY=true) in that namespace and its own work directory until the
bootstrap file appears (it needs no istiod for that: only the CA's root file, which each work directory has).

Ours resolves the same pod through the agent's own option loading (`load_agent_options`, run in that namespace
on a throwaway thread, so it reads the same interfaces) and the bootstrap writer: a process start per case
would make a case cost a second. One case in PROCESS_EVERY also runs our real `pilot-agent proxy sidecar` and
its file must be byte for byte the in-process one, which ties the two paths together.

Compared: whether each side wrote a bootstrap (a pod either refuses is refused by both), and the documented
normalisation of the JSON text: each side's work directory becomes `<workdir>`; ISTIO_VERSION, when the pod
does not set it, is the release each was built as (upstream's module build has no linker stamp: "unknown").
The file's mode is compared too.

Deliberate difference (docs/UPSTREAM.md): node metadata whose value does not fit the field
upstream's NodeMetadata types it as (`ISTIO_METAJSON_X={"NETWORK": 5}`, `ISTIO_META_DNS_CAPTURE=yes`) makes
upstream's agent exit ("failed generating node metadata"); ours logs it and keeps the value as written.
Counted as deliberate only when upstream said exactly that and ours wrote a bootstrap.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from needs import need_file
from support import VENV_BIN, poll
from upstream_peers import (
    DIFF_EXAMPLES,
    NamedNetns,
    Tally,
    base_env,
    describe,
    differential,
    downward_file,
    in_netns,
    named_netns,
    need_upstream,
)

from istio_agent.agent.loader import load_agent_options
from istio_agent.agent.options import AgentFlags
from istio_agent.config import env
from istio_agent.grpcxds.writer import write_bootstrap_file
from istio_agent.version import ISTIO_COMPAT_VERSION

HOSTS: dict[str, tuple[str, ...]] = {
    "loopback": (),
    "v4": ("10.244.1.9/24",),
    "v6": ("fd00:10:244:1::9/64",),
    "dual": ("10.244.1.9/24", "fd00:10:244:1::9/64"),
}
BOOTSTRAP = "etc/istio/proxy/grpc-bootstrap.json"
PROCESS_EVERY = 25  # one case in this many also runs our pilot-agent as a process
TEMPLATE_ENV = {"ISTIO_META_GENERATOR": "grpc", "DISABLE_ENVOY": "true", "GRPC_XDS_BOOTSTRAP": BOOTSTRAP}

LABEL = st.from_regex(r"\A[a-z0-9]([a-z0-9.-]{0,10}[a-z0-9])?\Z", fullmatch=True)
NAME = st.from_regex(r"\A[a-z]([a-z0-9-]{0,12}[a-z0-9])?\Z", fullmatch=True)
META_KEY = st.from_regex(r"\A[A-Z][A-Z0-9_]{0,12}\Z", fullmatch=True).filter(
    lambda k: k not in ("GENERATOR",) and not k.startswith("ISTIO"))
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12)
META_VALUE = st.one_of(TEXT, st.sampled_from(["true", "false", "1", "0", "", "a,b", '{"a":1}', "[1,2]", "null"]))
# Keys upstream's NodeMetadata types (booleans, lists, numbers, maps), with their own value shapes.
KNOWN_META: dict[str, st.SearchStrategy[str]] = {
    "CLUSTER_ID": NAME, "NETWORK": NAME, "MESH_ID": NAME, "WORKLOAD_NAME": NAME, "OWNER": TEXT,
    "DNS_CAPTURE": st.sampled_from(["true", "false", "True", "1", "yes", ""]),
    "DNS_AUTO_ALLOCATE": st.sampled_from(["true", "false", "0"]),
    "ENABLE_HBONE": st.sampled_from(["true", "false", "maybe"]),
    "REQUESTED_NETWORK_VIEW": st.lists(NAME, max_size=3).map(",".join),
    "APP_CONTAINERS": st.lists(NAME, max_size=3).map(",".join),
    "INTERCEPTION_MODE": st.sampled_from(["REDIRECT", "TPROXY", "NONE", "bogus"]),
    "SERVICE_ACCOUNT": NAME, "NAMESPACE": NAME, "NAME": NAME, "LABELS": st.just('{"x":"y"}'),
    "ISTIO_VERSION": st.sampled_from(["1.28.0", "1.30.0-dev"]),
    "HTTP10": st.sampled_from(["1", "0"]), "SIDECAR_LISTEN_ALL": st.sampled_from(["true", "false"]),
    "STS_PORT": st.sampled_from(["15463", "0", "x"]), "PROXY_VIEW": NAME,
}
META_JSON = st.one_of(
    st.dictionaries(META_KEY, st.one_of(TEXT, st.integers(-5, 5), st.booleans(), st.lists(TEXT, max_size=2)),
                    max_size=3).map(json.dumps),
    st.sampled_from(["{", "[]", "1", '{"LABELS": {"a": "b"}}', '{"NETWORK": 5}']))
PROXY_CONFIG = st.fixed_dictionaries({}, optional={
    "discoveryAddress": st.sampled_from(["istiod.istio-system.svc:15012", "localhost:15010", "10.0.0.1:15012",
                                         "istiod-canary.istio-system.svc:15012"]),
    "controlPlaneAuthPolicy": st.sampled_from(["MUTUAL_TLS", "NONE"]),
    "proxyMetadata": st.dictionaries(st.sampled_from(["ISTIO_META_FOO", "ISTIO_META_NETWORK", "BAR"]), NAME,
                                     max_size=2),
    "clusterName": NAME, "statusPort": st.sampled_from([15020, 15021]),
    "meshId": NAME,
}).map(json.dumps)
LOCALITY_LABELS = st.fixed_dictionaries({}, optional={
    "topology.kubernetes.io/region": NAME, "topology.kubernetes.io/zone": NAME,
    "topology.istio.io/subzone": NAME, "istio-locality": st.sampled_from(["r1.z1.s1", "r1.z1", "r1"]),
})


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    environment: dict[str, str] = dict(TEMPLATE_ENV)
    optional: dict[str, st.SearchStrategy[str]] = {
        "POD_NAME": NAME, "POD_NAMESPACE": NAME, "SERVICE_ACCOUNT": NAME,
        "INSTANCE_IP": st.sampled_from(["10.244.1.9", "fd00:10:244:1::9", "10.1.2.3", "bogus"]),
        "TRUST_DOMAIN": st.sampled_from(["cluster.local", "example.org"]),
        "ISTIO_META_CLUSTER_ID": NAME, "OUTPUT_CERTS": st.sampled_from(["./etc/certs", "out"]),
        "PROXY_CONFIG": PROXY_CONFIG, "ISTIO_META_DNS_CAPTURE": st.sampled_from(["true", "false"]),
        "ISTIO_METAJSON_ANNOTATIONS": st.just('{"extra": "x"}')}
    for key, strategy in optional.items():
        if draw(st.booleans()):
            environment[key] = draw(strategy)
    for key in draw(st.lists(st.sampled_from(sorted(KNOWN_META)), max_size=3, unique=True)):
        environment[f"ISTIO_META_{key}"] = draw(KNOWN_META[key])
    for key, text in draw(st.dictionaries(META_KEY, META_VALUE, max_size=3)).items():
        environment[f"ISTIO_META_{key}"] = text
    for key, text in draw(st.dictionaries(META_KEY, META_JSON, max_size=2)).items():
        environment[f"ISTIO_METAJSON_{key}"] = text
    labels = {**draw(st.dictionaries(LABEL, NAME, max_size=3)), **draw(LOCALITY_LABELS)}
    if draw(st.booleans()):
        labels["pod-template-hash"] = "5d8f9c7b6"
    annotations = draw(st.dictionaries(LABEL, TEXT, max_size=2))
    if draw(st.integers(0, 4)) == 0:
        annotations["proxy.istio.io/config"] = draw(st.sampled_from([
            "discoveryAddress: istiod-rev.istio-system.svc:15012", "proxyMetadata:\n  ISTIO_META_X: y",
            "{bad", "clusterName: c9"]))
    domain = draw(st.sampled_from(["", "", "", "example.svc.cluster.local"]))
    return {"env": environment, "labels": labels if draw(st.integers(0, 5)) else None,
            "annotations": annotations if draw(st.integers(0, 5)) else None, "domain": domain,
            "host": draw(st.sampled_from(sorted(HOSTS)))}


# --- running both ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hosts() -> Iterator[dict[str, NamedNetns]]:
    tag = f"gbdiff{os.getpid() % 100000}"
    with contextlib.ExitStack() as stack:
        yield {key: stack.enter_context(named_netns(f"{tag}-{key}", addresses)) for key, addresses in HOSTS.items()}


@pytest.fixture(scope="module")
def root_cert() -> bytes:
    """A CA certificate for the pods' var/run/secrets/istio/root-cert.pem (upstream's CA client wants one)."""
    return self_signed()


def self_signed() -> bytes:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "cluster.local")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


@contextlib.contextmanager
def pod_directory(pod: dict[str, Any], root_cert: bytes) -> Iterator[Path]:
    """A work directory as a pod's: the downward-API files and the CA root (short: the XDS socket lives in it)."""
    workdir = Path(tempfile.mkdtemp(prefix="gb-", dir="/tmp"))
    try:
        (workdir / "var/run/secrets/istio").mkdir(parents=True)
        (workdir / "var/run/secrets/istio/root-cert.pem").write_bytes(root_cert)
        (workdir / "etc/istio/pod").mkdir(parents=True)
        if pod["labels"] is not None:
            (workdir / "etc/istio/pod/labels").write_text(downward_file(pod["labels"]))
        if pod["annotations"] is not None:
            (workdir / "etc/istio/pod/annotations").write_text(downward_file(pod["annotations"]))
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


FATAL = re.compile(r"^Error: ", re.M)


def agent_argv(agent: Path, pod: dict[str, Any]) -> list[str]:
    return [str(agent), "proxy", "sidecar", *([f"--domain={pod['domain']}"] if pod["domain"] else [])]


def run_agent(netns: NamedNetns, argv: list[str], pod: dict[str, Any], workdir: Path) -> tuple[bytes | None, str]:
    """Start an agent in `workdir` inside the namespace; the bootstrap's bytes once written (None if the agent
    exited first) and its output. The agent is killed as soon as the file is complete JSON."""
    target = workdir / BOOTSTRAP
    log = workdir / "agent.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["ip", "netns", "exec", netns.name, *argv], cwd=workdir, env=base_env(pod["env"]),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def written() -> tuple[bytes | None] | None:
            if target.exists():
                data = target.read_bytes()
                with contextlib.suppress(ValueError):
                    json.loads(data)
                    return (data,)
            # Exited, or said why it stops (upstream's agent may linger in its shutdown after cobra's "Error:").
            if proc.poll() is not None or FATAL.search(log.read_text()):
                return (None,)
            return None

        (data,) = poll(written, "the bootstrap file or the agent's exit", timeout=30, interval=0.01,
                       on_timeout=lambda: log.read_text()[-2000:])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return data, log.read_text()


def ours_in_process(netns: NamedNetns, pod: dict[str, Any], workdir: Path) -> tuple[bytes | None, str]:
    """Our agent's options for the pod, loaded in the namespace, and the bootstrap written from them."""
    def load() -> bytes | None:
        options = load_agent_options(AgentFlags(domain=pod["domain"]), env.Environment(pod["env"]), workdir)
        if options.grpc_bootstrap is None:
            return None
        return write_bootstrap_file(options.grpc_bootstrap.path, options.grpc_bootstrap.content)

    try:
        return in_netns(f"/var/run/netns/{netns.name}", load), ""
    except Exception as exc:  # a pod we refuse: compared with upstream refusing it
        return None, f"{type(exc).__name__}: {exc}"


def normalised(data: bytes, workdir: Path, pod: dict[str, Any], version: str) -> str:
    text = data.decode().replace(str(workdir), "<workdir>")
    if "ISTIO_META_ISTIO_VERSION" not in pod["env"]:
        text = text.replace(f'"ISTIO_VERSION": "{version}"', '"ISTIO_VERSION": "<release>"')
    return text


def file_mode(workdir: Path) -> int:
    return (workdir / BOOTSTRAP).stat().st_mode & 0o7777


@pytest.mark.timeout(120 + 3 * DIFF_EXAMPLES)  # one pytest test runs every generated case
def test_grpc_bootstrap_differential(hosts: dict[str, NamedNetns], root_cert: bytes) -> None:
    upstream = need_upstream("pilot-agent")
    ours_agent = need_file(VENV_BIN / "pilot-agent", "our pilot-agent")
    tally = Tally("grpc-bootstrap")

    @differential
    @given(pod=pods(), process=st.sampled_from([False] * (PROCESS_EVERY - 1) + [True]))
    def compare(pod: dict[str, Any], process: bool) -> None:
        netns = hosts[pod["host"]]
        with pod_directory(pod, root_cert) as theirs_dir, pod_directory(pod, root_cert) as ours_dir:
            theirs, theirs_log = run_agent(netns, agent_argv(upstream, pod), pod, theirs_dir)
            ours, ours_error = ours_in_process(netns, pod, ours_dir)
            where = f"pod {describe(pod)}\nupstream said:\n{theirs_log[-1500:]}\nours said: {ours_error}"
            if theirs is None and ours is not None and "failed generating node metadata" in theirs_log:
                tally.count("deliberate: metadata not fitting upstream's typed field is kept, not fatal")
                return
            assert (ours is None) == (theirs is None), f"one side wrote no bootstrap\n{where}"
            if theirs is None:
                tally.count("both refused")
                return
            assert ours is not None
            mine = normalised(ours, ours_dir, pod, ISTIO_COMPAT_VERSION)
            theirs_text = normalised(theirs, theirs_dir, pod, "unknown")
            assert mine == theirs_text, f"bootstraps differ\n{where}"
            assert file_mode(ours_dir) == file_mode(theirs_dir), where
            if process:
                (ours_dir / BOOTSTRAP).unlink()
                from_process, log = run_agent(netns, agent_argv(ours_agent, pod), pod, ours_dir)
                assert from_process == ours, f"our pilot-agent wrote another bootstrap\n{where}\n{log[-1500:]}"
                tally.count("equal (and our pilot-agent process too)")
            else:
                tally.count("equal")

    compare()
    print(tally.report())
    assert tally.counts["cases"] >= 1


def test_normalisation_leaves_what_differs_visible(tmp_path: Path) -> None:
    """The normalisation rewrites only the work directory and an ISTIO_VERSION the pod did not set."""
    data = json.dumps({"a": f"{tmp_path}/x", "ISTIO_VERSION": "1.2.3", "b": "unknown"}).encode()
    text = normalised(data, tmp_path, {"env": {}}, "1.2.3")
    assert text == '{"a": "<workdir>/x", "ISTIO_VERSION": "<release>", "b": "unknown"}'
    assert '"1.2.3"' in normalised(data, tmp_path, {"env": {"ISTIO_META_ISTIO_VERSION": "1.2.3"}}, "1.2.3")
    assert '"1.2.3"' in normalised(data, tmp_path, {"env": {}}, "9.9.9")

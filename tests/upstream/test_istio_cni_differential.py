"""istio-cni ADD against upstream's Go plugin, on generated pods and plugin configurations.

Each case is a pod as istiod-local's Kubernetes API serves it (a registry workload: its namespace, labels and
annotations, the injection template it was rendered with, `sidecar.istio.io/status` or not, and an overlay:
the istio-proxy container's env, securityContext and arguments, extra containers and init containers with
ports) plus the ADD call: the istio-cni entry of the conflist (cniVersion, prevResult, plugin_log_level,
exclude_namespaces, pod_namespace, ambient_enabled false or true without selectors, keys neither plugin reads),
CNI_ARGS (the Kubernetes keys, IgnoreUnknown, an unknown key, a missing name, the CNI agent's own pod), the
plugin's environment (istio-iptables' environment-only settings) and the pod's network namespace (a named one
per address shape: none, IPv4, IPv6, both in either order).

Upstream's `istio-cni` and ours run the same ADD, side by side, in dry-run mode (`DRY_RUN_FILE_PATH`: both
record the rules instead of applying them, after reading the pod's addresses inside CNI_NETNS) against the
same API (one `istiod-local serve` for the module; each batch of cases is one registry write, and the API
serves every pod of the batch before either plugin runs). Each side has its own `cni_agent_run_dir` holding
the same kubeconfig (the only difference in their inputs).

Compared: the exit status; on success the result on stdout (as parsed JSON) and the recording byte for byte
(or that neither wrote one: the pod is not captured); on failure the CNI error object's `code` (the messages
are each implementation's own words, and only ours names `cniVersion`, the spec's field skel leaves out).

Deliberate differences (docs/UPSTREAM.md), each recognised only under its own conditions:
- CNI_ARGS that do not parse are code 4 in ours, 999 in upstream's ("failed to load args").
- an annotation value upstream copies into its rules unchecked (`excludeInboundPorts: "*"`, port 0 or `080`)
  is refused by ours (999): counted only when upstream's recording is refused by iptables-restore --test in
  the pod's netns, or the port item ours names is 0 or has a leading zero.
- ` 80` in a port list: upstream writes `--dport  80`, ours `--dport 80` (the same rule once iptables-restore
  splits it): counted only when the recordings are equal with runs of spaces inside a line made one.
"""

from __future__ import annotations

import difflib
import functools
import itertools
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from launchers import IstiodLocal, RegistryFile
from needs import need_file, need_root, need_tool
from support import VENV_BIN
from upstream_peers import (
    DIFF_EXAMPLES,
    POD_HOSTS,
    NamedNetns,
    Tally,
    base_env,
    describe,
    differential,
    need_upstream,
    pod_hosts,
)

from istio_agent.kube.client import ApiError, get_pod, load_kubeconfig

HOSTS = POD_HOSTS
BATCH = 20  # cases per registry write (one Hypothesis example)
WORKERS = 4  # plugin runs at once

# --- pods, from upstream's annotation grammar -------------------------------------------------------------------
PORT = st.one_of(st.sampled_from(["80", "443", "8080", "15001", "15020", "1", "65535"]),
                 st.integers(1, 65535).map(str))
ODD_PORT = st.sampled_from(["0", "65536", "abc", " 80", "80 ", "-1", "+80", "0x50", "080", ""])
PORT_LIST = st.one_of(
    st.sampled_from(["*", "", " ", " * "]),
    st.lists(PORT, min_size=1, max_size=4).map(",".join),
    st.lists(st.one_of(PORT, PORT, ODD_PORT), min_size=1, max_size=3).map(",".join),
    st.lists(PORT, min_size=1, max_size=3).map(", ".join),  # spaces around items
    st.lists(PORT, min_size=1, max_size=3).map(lambda ps: ",".join(ps) + ","),  # a trailing comma
)
CIDR = st.one_of(
    st.builds(lambda a, n: f"{a}/{n}", st.ip_addresses(v=4), st.integers(0, 32)),
    st.builds(lambda a, n: f"{a}/{n}", st.ip_addresses(v=6), st.integers(0, 128)),
    st.sampled_from(["10.0.0.0/8", "127.0.0.1/32", "0.0.0.0/0", "::/0", "fd00::/8", "10.96.0.99/32"]))
ODD_CIDR = st.sampled_from(["10.0.0.0/33", "10.0.0.1", "abc", " 10.0.0.0/8", "10.0.0.0/08", "*", "", "::/129"])
CIDR_LIST = st.one_of(st.sampled_from(["*", ""]), st.lists(CIDR, min_size=1, max_size=3).map(",".join),
                      st.lists(st.one_of(CIDR, CIDR, ODD_CIDR), min_size=1, max_size=3).map(",".join))
IFACE = st.one_of(st.from_regex(r"\A[a-z][a-z0-9]{0,6}\Z", fullmatch=True), st.sampled_from(["eth0", "net1", "veth+"]))
ODD_IFACE = st.sampled_from(["", " eth1", "eth0 -j ACCEPT", "averyveryverylongname", "1eth", "a_b.c-d"])
IFACE_LIST = st.one_of(st.just(""), st.lists(IFACE, min_size=1, max_size=3).map(",".join),
                       st.lists(st.one_of(IFACE, ODD_IFACE), min_size=1, max_size=3).map(",".join))
MODE = st.sampled_from(["REDIRECT", "REDIRECT", "TPROXY", "TPROXY", "redirect", "NONE", ""])
BOOL_TEXT = st.sampled_from(["true", "false", "1", "0", "t", "F", "TRUE", "False", "yes", "", "maybe"])
PROXY_CONFIG = st.sampled_from(["", "holdApplicationUntilProxyStarts: true\n", "{\"concurrency\": 2}",
                                "interceptionMode: TPROXY\n", "not: [valid"])

ANNOTATIONS: dict[str, st.SearchStrategy[str]] = {
    "sidecar.istio.io/interceptionMode": MODE,
    "traffic.sidecar.istio.io/includeOutboundIPRanges": CIDR_LIST,
    "traffic.sidecar.istio.io/excludeOutboundIPRanges": CIDR_LIST,
    "traffic.sidecar.istio.io/includeInboundPorts": PORT_LIST,
    "traffic.sidecar.istio.io/excludeInboundPorts": PORT_LIST,
    "traffic.sidecar.istio.io/includeOutboundPorts": PORT_LIST,
    "traffic.sidecar.istio.io/excludeOutboundPorts": PORT_LIST,
    "traffic.sidecar.istio.io/excludeInterfaces": IFACE_LIST,
    "traffic.sidecar.istio.io/kubevirtInterfaces": IFACE_LIST,
    "istio.io/reroute-virtual-interfaces": IFACE_LIST,
    "sidecar.istio.io/inject": BOOL_TEXT,
    "proxy.istio.io/config": PROXY_CONFIG,
    "status.sidecar.istio.io/port": st.sampled_from(["15020", "0"]),
}
PROXY_ENV = ("ISTIO_META_DNS_CAPTURE", "ISTIO_DUAL_STACK", "INVALID_DROP", "DISABLE_ENVOY")
IDENTITY = st.one_of(st.none(), st.sampled_from([0, 1337, 1000670000, 65534]), st.integers(1, 2**31 - 1))
PROXY_ARGS = st.sampled_from([None, None, None, ["proxy", "router"], ["proxy"], ["proxy", "sidecar"],
                              ["proxy", "waypoint", "--domain", "x"], ["router"], []])
NAMESPACES = ["default", "default", "shop", "kube-system", "istio-system"]
LABEL_VALUE = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?\Z", fullmatch=True)


@st.composite
def workloads(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """A registry workload (rendered by the API as the injector would have written its pod)."""
    sidecar = draw(st.sampled_from(["envoy"] * 9 + ["none", "none", "router", "proxyless"]))
    labels = {"app": draw(LABEL_VALUE)}
    if draw(st.integers(0, 5)) == 0:
        labels["sidecar.istio.io/inject"] = draw(st.sampled_from(["true", "false", "0", "1", "False", "yes"]))
    annotations = {key: draw(ANNOTATIONS[key]) for key in draw(
        st.lists(st.sampled_from(sorted(ANNOTATIONS)), max_size=5, unique=True))}
    proxy: dict[str, Any] = {"name": "istio-proxy"}
    env = [{"name": var, "value": draw(BOOL_TEXT)} for var in draw(
        st.lists(st.sampled_from(PROXY_ENV), max_size=3, unique=True))]
    if env:
        proxy["env"] = env
    context = {key: draw(IDENTITY) for key in draw(
        st.lists(st.sampled_from(["runAsUser", "runAsGroup"]), max_size=2, unique=True))}
    if context:
        proxy["securityContext"] = context  # None removes the template's value (a merge patch's null)
    args = draw(PROXY_ARGS)
    if args is not None:
        proxy["args"] = args
    containers: list[dict[str, Any]] = []
    init_containers: list[dict[str, Any]] = []
    if sidecar == "none":
        if draw(st.booleans()):  # a proxy container the injector did not add
            proxy.setdefault("image", "docker.io/istio/proxyv2:1.0")
            containers.append(proxy)
        if draw(st.booleans()):
            annotations["sidecar.istio.io/status"] = draw(st.sampled_from(['{"containers":["istio-proxy"]}', ""]))
    elif len(proxy) > 1:
        containers.append(proxy)
    extras = st.sampled_from(["istio-init", "istio-validation", "setup", "istio-proxy"])
    for extra in draw(st.lists(extras, max_size=2, unique=True)) if draw(st.integers(0, 2)) == 0 else []:
        init_containers.append({"name": extra, "image": "busybox"})
    if draw(st.integers(0, 3)) == 0:
        containers.append({"name": "sidecar-app", "image": "busybox", "ports": [
            {"containerPort": int(draw(PORT)), "protocol": draw(st.sampled_from(["TCP", "UDP"]))}]})
    workload: dict[str, Any] = {"name": name, "namespace": draw(st.sampled_from(NAMESPACES)), "labels": labels,
                                "sidecar": sidecar, "captureInit": draw(st.sampled_from(["cni"] * 5 + ["init"]))}
    if annotations:
        workload["annotations"] = annotations
    spec: dict[str, Any] = {}
    if containers:
        spec["containers"] = containers
    if init_containers:
        spec["initContainers"] = init_containers
    if spec:
        workload["pod"] = {"spec": spec}
    return workload


# --- the ADD call -----------------------------------------------------------------------------------------------
def prev_result(version: str, v6: bool) -> dict[str, Any]:
    """The previous plugin's result in `version`'s own layout (0.3/0.4 name each address's IP version)."""
    address = "fd00:10:244::7/64" if v6 else "10.244.0.7/24"
    ip: dict[str, Any] = {"address": address, "interface": 0}
    if version != "1.0.0":
        ip["version"] = "6" if v6 else "4"
    return {"cniVersion": version, "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff",
                                                   "sandbox": "/var/run/netns/x"}],
            "ips": [ip], "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.96.0.10"]}}


@st.composite
def plugin_conf(draw: st.DrawFn) -> dict[str, Any]:
    """The istio-cni entry of the conflist as the runtime hands it to the plugin (minus cni_agent_run_dir)."""
    version = draw(st.sampled_from(["1.0.0", "1.0.0", "0.4.0", "0.3.1"]))
    conf: dict[str, Any] = {"cniVersion": version, "name": "k8s-pod-network", "type": "istio-cni"}
    optional: dict[str, st.SearchStrategy[Any]] = {
        "plugin_log_level": st.sampled_from(["debug", "info", "warn", "error", "none", "bogus", ""]),
        "exclude_namespaces": st.lists(st.sampled_from(["kube-system", "istio-system", "shop"]), max_size=2,
                                       unique=True),
        "pod_namespace": st.sampled_from(["istio-system", "kube-system", ""]),
        "ambient_enabled": st.sampled_from([False, False, True]),
        "log_level": st.just("debug"),  # keys neither plugin reads
        "dns_redirect": st.booleans(),
        "redirect_dns": st.booleans(),
        "kubernetes": st.just({"kubeconfig": "/etc/cni/net.d/ZZZ-istio-cni-kubeconfig",
                               "cni_bin_dir": "/opt/cni/bin"}),
    }
    for key in draw(st.lists(st.sampled_from(sorted(optional)), max_size=5, unique=True)):
        conf[key] = draw(optional[key])
    if draw(st.integers(0, 4)):
        conf["prevResult"] = prev_result(version, draw(st.booleans()))
    return conf


def cni_args(draw: st.DrawFn, namespace: str, name: str) -> str:
    shape = draw(st.sampled_from(["k8s"] * 12 + ["no-ignore", "unknown-key", "ignore-true", "ignore-bad",
                                                 "no-name", "no-namespace", "cni-pod"]))
    pairs = [("K8S_POD_NAMESPACE", namespace), ("K8S_POD_NAME", name), ("K8S_POD_INFRA_CONTAINER_ID", "c0ffee"),
             ("K8S_POD_UID", "0d7c1a5e-1111-2222-3333-444455556666")]
    if shape == "no-name":
        pairs = [p for p in pairs if p[0] != "K8S_POD_NAME"]
    elif shape == "no-namespace":
        pairs = [p for p in pairs if p[0] != "K8S_POD_NAMESPACE"]
    elif shape == "cni-pod":  # the pod itself is named as the CNI agent's pods are (see `cases`)
        pairs = pairs[:2]
    ignore = {"no-ignore": [], "unknown-key": [], "ignore-true": [("IgnoreUnknown", "true")],
              "ignore-bad": [("IgnoreUnknown", "maybe")]}.get(shape, [("IgnoreUnknown", "1")])
    extra = [("FOO", "bar")] if shape in ("unknown-key", "k8s") and draw(st.booleans()) else []
    return ";".join(f"{k}={v}" for k, v in [*ignore, *pairs, *extra])


PLUGIN_ENV: dict[str, st.SearchStrategy[str]] = {
    "ISTIO_OUTBOUND_OWNER_GROUPS": st.sampled_from(["java", "1337,java", "*", ""]),
    "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": st.sampled_from(["java", "1337", ""]),
    "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": st.sampled_from(["127.0.0.1/32", "127.0.0.0/8"]),
}
CASE_NAMES = itertools.count()


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    number = next(CASE_NAMES)
    agent_like = draw(st.integers(0, 15)) == 0
    name = f"istio-cni-node-{number}" if agent_like else f"pod-{number}"
    workload = draw(workloads(name))
    env = {var: draw(PLUGIN_ENV[var]) for var in draw(st.lists(st.sampled_from(sorted(PLUGIN_ENV)), max_size=2,
                                                               unique=True))} if draw(st.integers(0, 5)) == 0 else {}
    conf = draw(plugin_conf())
    if agent_like and draw(st.booleans()):
        conf["pod_namespace"] = workload["namespace"]
    return {"workload": workload, "conf": conf, "args": cni_args(draw, workload["namespace"], name),
            "host": draw(st.sampled_from([*sorted(set(HOSTS) - {"bare"}) * 4, "bare"])), "env": env}


# --- running both -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hosts() -> Iterator[dict[str, NamedNetns]]:
    need_root()
    need_tool("iptables-restore")  # the kernel's verdict on upstream's recorded rules
    with pod_hosts(f"iacni{os.getpid() % 100000}") as hosts:
        yield hosts


class Api:
    """istiod-local's Kubernetes API for the module: the registry each batch rewrites, the admin kubeconfig."""

    def __init__(self, root: Path) -> None:
        self.registry = RegistryFile(root / "registry.yaml", {"workloads": []})
        self.istiod = IstiodLocal(root / "state", registry=self.registry, kube_api_addr="127.0.0.1:0",
                                  args=["--monitoring-addr", "off"])
        self.istiod.start()
        self.kubeconfig = self.istiod.kubeconfig(root / "admin.kubeconfig")
        self.config = load_kubeconfig(str(self.kubeconfig))

    def serve(self, batch: list[dict[str, Any]], timeout: float = 30.0) -> None:
        """Replace the registry's workloads with the batch's; return once the API serves every one of them."""
        self.registry.write({"workloads": [case["workload"] for case in batch]})
        deadline = time.monotonic() + timeout
        for case in batch:
            workload = case["workload"]
            while True:
                try:
                    get_pod(self.config, workload["namespace"], workload["name"])
                    break
                except ApiError:
                    assert time.monotonic() < deadline, f"the API never served {workload['name']}:\n" \
                                                       f"{self.istiod.log_text()[-3000:]}"
                    time.sleep(0.05)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    served = Api(tmp_path_factory.mktemp("cnidiff"))
    try:
        yield served
    finally:
        served.istiod.stop()


# A side's exit status, its stdout (parsed JSON, or the raw text), its recording (None: none written) and stderr.
Side = tuple[int, Any, "str | None", str]


def run_side(binary: Path, case: dict[str, Any], netns: NamedNetns, run_dir: Path, kubeconfig: Path) -> Side:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "istio-cni-kubeconfig").write_bytes(kubeconfig.read_bytes())
    recording = run_dir / "rules.txt"
    recording.unlink(missing_ok=True)
    conf = {**case["conf"], "cni_agent_run_dir": str(run_dir)}
    env = base_env({**case["env"], "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c0ffee",
                    "CNI_NETNS": f"/var/run/netns/{netns.name}", "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
                    "CNI_ARGS": case["args"], "DRY_RUN_FILE_PATH": str(recording)})
    done = subprocess.run([str(binary)], input=json.dumps(conf).encode(), env=env, capture_output=True, timeout=60,
                          check=False)
    text = done.stdout.decode(errors="replace")
    try:
        answer: Any = json.loads(text) if text.strip() else None
    except ValueError:
        answer = text
    rules = recording.read_text() if recording.exists() else None
    return done.returncode, answer, rules, done.stderr.decode(errors="replace")


def error_code(answer: Any) -> Any:
    """A CNI error object's code (the message is each side's own words; ours also names `cniVersion`)."""
    return answer.get("code") if isinstance(answer, dict) else answer


def spaces_collapsed(rules: str | None) -> str | None:
    """A recording with runs of spaces inside a line made one: iptables-restore splits a rule on whitespace, so
    `--dport  80` (upstream hands an annotation's ` 80` item on as written) is the rule `--dport 80`."""
    return None if rules is None else re.sub(r"(?<=\S) {2,}(?=\S)", " ", rules)


RESTORE_BLOCK = re.compile(r"^\* ?(\w+)\n(.*?^COMMIT)$", re.M | re.S)  # the dry run writes `* nat`
OUR_REFUSAL = re.compile(r"invalid annotation (\S+) ")


def refused_by_kernel(netns: NamedNetns, recording: str) -> bool:
    """Whether some restore block of a recording is refused by both iptables-restore and ip6tables-restore
    (--test: parsed and checked by the kernel, nothing committed) in the pod's namespace."""
    for table, body in RESTORE_BLOCK.findall(recording):
        verdicts = [subprocess.run(["ip", "netns", "exec", netns.name, tool, "--test", "--noflush"],
                                   input=f"*{table}\n{body}\n", capture_output=True, text=True, check=False).returncode
                    for tool in ("iptables-restore", "ip6tables-restore")]
        if all(code != 0 for code in verdicts):
            return True
    return False


def outside_strict_grammar(case: dict[str, Any], ours: Side) -> bool:
    """Ours refused a port-list annotation for an item upstream's ParseUint takes and the capture code's
    grammar does not: port 0, or a leading zero (`080`)."""
    named = OUR_REFUSAL.search(str(ours[1]))
    value = case["workload"].get("annotations", {}).get(named.group(1)) if named else None
    if value is None or not named or not named.group(1).endswith("Ports"):
        return False
    items = [item.strip() for item in value.split(",")]
    return any(item.isdigit() and (int(item) == 0 or item.startswith("0")) for item in items)


def compare_case(case: dict[str, Any], netns: NamedNetns, theirs: Side, ours: Side) -> str:
    """The case's outcome for the tally (docs/UPSTREAM.md's deliberate differences each recognised only under
    its own conditions); AssertionError naming any other difference."""
    where = (f"case {describe(case)}\nupstream said ({theirs[0]}):\n{theirs[1]}\n{theirs[3][-2500:]}\n"
             f"ours said ({ours[0]}):\n{ours[1]}\n{ours[3][-2500:]}")
    if theirs[0] == ours[0] == 1 and error_code(theirs[1]) == 999 and error_code(ours[1]) == 4 and str(
            theirs[1].get("msg", "")).startswith("failed to load args:"):
        return "deliberate: CNI_ARGS that do not parse are code 4"
    if (theirs[0], ours[0]) == (0, 1) and error_code(ours[1]) == 999 and (
            (theirs[2] is not None and refused_by_kernel(netns, theirs[2])) or outside_strict_grammar(case, ours)):
        return "deliberate: an annotation value upstream copies into a broken or odd rule is refused"
    assert ours[0] == theirs[0], f"exit statuses differ: upstream {theirs[0]}, ours {ours[0]}\n{where}"
    if theirs[0] != 0:
        assert error_code(ours[1]) == error_code(theirs[1]), f"error codes differ\n{where}"
        return f"both refused (code {error_code(theirs[1])})"
    assert ours[1] == theirs[1], f"results differ\n{where}"
    if ours[2] != theirs[2] and spaces_collapsed(ours[2]) == spaces_collapsed(theirs[2]):
        return "deliberate: spaces around list items trimmed"
    assert ours[2] == theirs[2], ("recorded rules differ:\n" + "\n".join(difflib.unified_diff(
        (theirs[2] or "(none)").splitlines(), (ours[2] or "(none)").splitlines(), "upstream", "ours",
        lineterm="")) + f"\n{where}")
    return "equal rules" if theirs[2] is not None else "equal, not captured"


@pytest.mark.timeout(180 + 1 * DIFF_EXAMPLES)  # one pytest test runs every generated case
def test_istio_cni_add_differential(api: Api, hosts: dict[str, NamedNetns], tmp_path: Path) -> None:
    theirs_binary = need_upstream("istio-cni")
    ours_binary = need_file(VENV_BIN / "istio-cni", "our istio-cni")
    tally = Tally("istio-cni ADD")

    def both(index: int, case: dict[str, Any]) -> tuple[Side, Side]:
        netns = hosts[case["host"]]
        run = functools.partial(run_side, case=case, netns=netns, kubeconfig=api.kubeconfig)
        return (run(theirs_binary, run_dir=tmp_path / f"upstream-{index}"),
                run(ours_binary, run_dir=tmp_path / f"ours-{index}"))

    @differential(cases_per_example=BATCH)
    @given(batch=st.lists(cases(), min_size=BATCH, max_size=BATCH))
    def compare(batch: list[dict[str, Any]]) -> None:
        api.serve(batch)
        with ThreadPoolExecutor(WORKERS) as pool:
            outcomes = list(pool.map(both, range(len(batch)), batch))
        for case, (theirs, ours) in zip(batch, outcomes, strict=True):
            tally.count(compare_case(case, hosts[case["host"]], theirs, ours))

    compare()
    print(tally.report())
    assert tally.counts["cases"] >= 1

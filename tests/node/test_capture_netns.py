"""Traffic capture proven in real network namespaces (root).

Each test builds a fresh pod namespace wired by a veth pair to a peer
namespace, applies rules with the installed `istio-iptables` (through
`--network-namespace`), and sends real connections from small Python
children running inside the namespaces. Listeners report which namespace
and port accepted a connection and what `SO_ORIGINAL_DST` says, so a test
can tell "redirected to the sidecar" from "went where it was addressed".

Every check runs with iptables-nft, iptables-legacy and native nftables.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from needs import need, need_root, need_tool
from support import VENV_BIN, LineCollector, poll

POD_V4, PEER_V4 = "10.77.0.2", "10.77.0.1"
POD_V6, PEER_V6 = "fd77::2", "fd77::1"
REMOTE_V4, REMOTE_V6 = "198.51.100.7", "2001:db8::7"  # also owned by the peer, behind the "router"
DNS_V4 = "10.77.0.53"  # routed to the peer, which does not answer DNS
APP_UID = 1000
PROXY_UID = 1337
# What Istio's injector passes to istio-init.
DEFAULT_ARGS = ["-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*",
                "-d", "15090,15021,15020"]  # fmt: skip
BACKENDS = ["iptables-nft", "iptables-legacy", "nftables"]

SERVER = r"""
import json, os, select, socket, struct, sys
spec = json.loads(sys.argv[1])
def orig(c):
    try:
        if c.family == socket.AF_INET6:
            raw = c.getsockopt(socket.IPPROTO_IPV6, 80, 28)
            return [socket.inet_ntop(socket.AF_INET6, raw[8:24]), struct.unpack_from("!H", raw, 2)[0]]
        raw = c.getsockopt(socket.SOL_IP, 80, 16)
        return [socket.inet_ntop(socket.AF_INET, raw[4:8]), struct.unpack_from("!H", raw, 2)[0]]
    except OSError:
        return None
socks = {}
for kind, ports in (("tcp", spec["tcp"]), ("udp", spec.get("udp", []))):
    for port in ports:
        # UDP binds loopback like the agent's DNS server, so replies leave from the redirect target.
        hosts = ("0.0.0.0", "::") if kind == "tcp" else ("127.0.0.1", "::1")
        for fam, host in zip((socket.AF_INET, socket.AF_INET6), hosts):
            uid = spec.get("udp_uid") if kind == "udp" else None
            if uid is not None:
                os.setegid(uid); os.seteuid(uid)
            s = socket.socket(fam, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
            if uid is not None:
                os.seteuid(0); os.setegid(0)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if fam == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if spec.get("transparent") and kind == "tcp":
                s.setsockopt(socket.SOL_IP if fam == socket.AF_INET else socket.IPPROTO_IPV6,
                             19 if fam == socket.AF_INET else 75, 1)
            s.bind((host, port))
            if kind == "tcp":
                s.listen(64)
            socks[s] = (kind, port)
print("READY", flush=True)
while True:
    ready, _, _ = select.select(list(socks), [], [])
    for s in ready:
        kind, port = socks[s]
        info = {"ns": spec["name"], "listener": port, "proto": kind}
        if kind == "tcp":
            c, peer = s.accept()
            with c:
                info.update(local=list(c.getsockname()[:2]), orig=orig(c), peer=list(peer[:2]))
                c.sendall(json.dumps(info).encode())
        else:
            data, peer = s.recvfrom(2048)
            info.update(local=list(s.getsockname()[:2]), peer=list(peer[:2]))
            s.sendto(json.dumps(info).encode(), peer)
"""

CLIENT = r"""
import json, os, socket, sys
spec = json.loads(sys.argv[1])
if spec.get("uid") is not None:
    os.setgroups([]); os.setgid(spec["uid"]); os.setuid(spec["uid"])
fam = socket.AF_INET6 if ":" in spec["host"] else socket.AF_INET
try:
    if spec["proto"] == "tcp":
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect((spec["host"], spec["port"]))
        chunks = []
        while data := s.recv(4096):
            chunks.append(data)
        print(b"".join(chunks).decode())
    else:
        s = socket.socket(fam, socket.SOCK_DGRAM)
        s.settimeout(3)
        s.connect((spec["host"], spec["port"]))
        s.send(b"query")
        print(s.recv(4096).decode())
except OSError as err:
    print(json.dumps({"error": type(err).__name__}))
"""


def sh(*argv: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, check=check, timeout=60)


class Topology:
    """A pod namespace and a peer namespace joined by a veth pair, plus their listeners."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.pod = f"cap-pod-{tag}"
        self.peer = f"cap-peer-{tag}"
        self.servers: list[subprocess.Popen[str]] = []

    @property
    def pod_path(self) -> str:
        return f"/run/netns/{self.pod}"

    def create(self) -> None:
        sh("ip", "netns", "add", self.pod)
        sh("ip", "netns", "add", self.peer)
        for ns in (self.pod, self.peer):
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.pod, "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", self.peer)
        for ns, dev, v4, v6 in ((self.pod, "v0", POD_V4, POD_V6), (self.peer, "v1", PEER_V4, PEER_V6)):
            sh("ip", "-n", ns, "addr", "add", f"{v4}/24", "dev", dev)
            sh("ip", "-n", ns, "addr", "add", f"{v6}/64", "dev", dev, "nodad")
            sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", self.pod, "route", "add", "default", "via", PEER_V4)
        sh("ip", "-n", self.pod, "-6", "route", "add", "default", "via", PEER_V6)
        sh("ip", "-n", self.peer, "addr", "add", f"{REMOTE_V4}/32", "dev", "lo")
        sh("ip", "-n", self.peer, "addr", "add", f"{REMOTE_V6}/128", "dev", "lo")

    def destroy(self) -> None:
        for proc in self.servers:
            proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
        for ns in (self.pod, self.peer):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)

    def serve(self, ns: str, **spec: object) -> None:
        """Start a listener process in `ns` and wait until it is bound."""
        proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{ns}", sys.executable, "-c", SERVER, json.dumps({"name": ns, **spec})],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.servers.append(proc)
        out = LineCollector(proc.stdout)

        def bound() -> bool:
            if proc.poll() is not None:
                out.join(5)
                raise AssertionError(f"the listener in {ns} exited with {proc.returncode}:\n{out.text()}")
            return "READY\n" in out.lines

        poll(bound, f"the listener in {ns} to bind", 20, out.text)

    def connect(self, ns: str, host: str, port: int, uid: int | None = None, proto: str = "tcp") -> dict[str, Any]:
        spec = json.dumps({"host": host, "port": port, "uid": uid, "proto": proto})
        out = sh("nsenter", f"--net=/run/netns/{ns}", sys.executable, "-c", CLIENT, spec).stdout
        result: dict[str, Any] = json.loads(out)
        return result

    def capture(self, *args: str, backend: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = sh(str(VENV_BIN / "istio-iptables"), "--network-namespace", self.pod_path,
                    *backend_args(backend), *args, check=False)  # fmt: skip
        if check:
            assert result.returncode == 0, result.stderr
        return result

    def ruleset(self, backend: str) -> str:
        """The backend's full ruleset dump for the pod, counters and comments removed."""
        if backend == "nftables":
            return sh("ip", "netns", "exec", self.pod, "nft", "list", "ruleset").stdout
        text = ""
        for family in ("iptables", "ip6tables"):
            variant = backend.split("-")[1]
            raw = sh("ip", "netns", "exec", self.pod, f"{family}-{variant}-save").stdout
            text += "".join(
                line.split(" [")[0] + "\n" for line in raw.splitlines() if line and not line.startswith("#")
            )
        return text


def args_with(**overrides: str) -> list[str]:
    """DEFAULT_ARGS with some short flags (given without the dash) set to other values."""
    args = list(DEFAULT_ARGS)
    for flag, value in overrides.items():
        args[args.index(f"-{flag}") + 1] = value
    return args


def backend_args(backend: str) -> list[str]:
    return ["--native-nftables"] if backend == "nftables" else ["--force-iptables-binary", backend.split("-")[1]]


@pytest.fixture
def topo() -> Iterator[Topology]:
    need_root()
    for tool in ("ip", "nsenter", "iptables-nft-restore", "iptables-legacy-restore", "nft"):
        need_tool(tool)
    need((VENV_BIN / "istio-iptables").exists(), "istio-iptables console script not installed")
    t = Topology()
    try:
        t.create()
        yield t
    finally:
        t.destroy()


def standard_listeners(t: Topology, transparent: bool = False) -> None:
    t.serve(t.pod, tcp=[15001, 15006, 15020, 15053, 8080], udp=[15053], udp_uid=PROXY_UID, transparent=transparent)
    t.serve(t.peer, tcp=[80, 8080, 9999])


@pytest.mark.parametrize("backend", BACKENDS)
def test_outbound_is_redirected_with_original_destination(topo: Topology, backend: str) -> None:
    standard_listeners(topo)
    topo.capture(*DEFAULT_ARGS, "--dual-stack", backend=backend)
    got = topo.connect(topo.pod, REMOTE_V4, 80, uid=APP_UID)
    assert (got["ns"], got["listener"], got["orig"]) == (topo.pod, 15001, [REMOTE_V4, 80])
    got = topo.connect(topo.pod, REMOTE_V6, 443, uid=APP_UID)
    assert (got["ns"], got["listener"], got["orig"]) == (topo.pod, 15001, [REMOTE_V6, 443])
    # The proxy's own uid is never captured: it reaches the real destination.
    got = topo.connect(topo.pod, REMOTE_V4, 80, uid=PROXY_UID)
    assert (got["ns"], got["listener"], got["local"]) == (topo.peer, 80, [REMOTE_V4, 80])
    got = topo.connect(topo.pod, REMOTE_V6, 80, uid=PROXY_UID)
    assert (got["ns"], got["listener"]) == (topo.peer, 80)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inbound_lands_on_15006_except_excluded_ports(topo: Topology, backend: str) -> None:
    standard_listeners(topo)
    topo.capture(*DEFAULT_ARGS, backend=backend)
    got = topo.connect(topo.peer, POD_V4, 8080)
    assert (got["ns"], got["listener"], got["orig"]) == (topo.pod, 15006, [POD_V4, 8080])
    got = topo.connect(topo.peer, POD_V4, 15020)  # -d 15090,15021,15020
    assert (got["ns"], got["listener"], got["local"]) == (topo.pod, 15020, [POD_V4, 15020])


@pytest.mark.parametrize("backend", BACKENDS)
def test_excluded_ports_and_cidrs_bypass(topo: Topology, backend: str) -> None:
    standard_listeners(topo)
    topo.capture(*args_with(x=f"{PEER_V4}/32"), "-o", "9999", backend=backend)
    got = topo.connect(topo.pod, PEER_V4, 8080, uid=APP_UID)  # excluded CIDR
    assert (got["ns"], got["listener"]) == (topo.peer, 8080)
    got = topo.connect(topo.pod, REMOTE_V4, 9999, uid=APP_UID)  # excluded port
    assert (got["ns"], got["listener"]) == (topo.peer, 9999)
    got = topo.connect(topo.pod, REMOTE_V4, 8080, uid=APP_UID)  # neither: captured
    assert (got["ns"], got["listener"], got["orig"]) == (topo.pod, 15001, [REMOTE_V4, 8080])


@pytest.mark.parametrize("backend", BACKENDS)
def test_dns_udp_and_tcp_reach_the_agent(topo: Topology, backend: str) -> None:
    standard_listeners(topo)
    topo.capture(*DEFAULT_ARGS, "--redirect-dns", f"--dns-servers={DNS_V4}", backend=backend)
    got = topo.connect(topo.pod, DNS_V4, 53, uid=APP_UID, proto="udp")
    assert (got["ns"], got["listener"], got["proto"]) == (topo.pod, 15053, "udp")
    got = topo.connect(topo.pod, DNS_V4, 53, uid=APP_UID)
    assert (got["ns"], got["listener"], got["orig"]) == (topo.pod, 15053, [DNS_V4, 53])


@pytest.mark.parametrize("backend", BACKENDS)
def test_tproxy_keeps_the_original_destination_inbound(topo: Topology, backend: str) -> None:
    standard_listeners(topo, transparent=True)
    topo.capture(*args_with(m="TPROXY"), backend=backend)
    got = topo.connect(topo.peer, POD_V4, 8080)
    assert (got["ns"], got["listener"], got["local"]) == (topo.pod, 15006, [POD_V4, 8080])
    assert got["peer"][0] == PEER_V4
    rules = sh("ip", "-n", topo.pod, "rule", "show").stdout
    assert "fwmark 0x539 lookup 133" in rules


@pytest.mark.parametrize("backend", BACKENDS)
def test_cleanup_restores_the_ruleset_exactly(topo: Topology, backend: str) -> None:
    _preexisting_rules(topo, backend)
    before = topo.ruleset(backend)
    rich = ["-m", "TPROXY", "-b", "*", "-i", "*", "-c", "v0", "-k", "v9", "--redirect-dns",
            f"--dns-servers={DNS_V4},fd77::53", "--drop-invalid", "--dual-stack"]  # fmt: skip
    topo.capture(*rich, backend=backend)
    assert topo.ruleset(backend) != before
    # Cleanup with the flags used to apply (as upstream runs it) restores the ruleset exactly.
    topo.capture(*rich, "--cleanup-only", backend=backend)
    assert topo.ruleset(backend) == before
    # Without them, every ISTIO chain and every jump into one still goes.
    topo.capture(*rich, backend=backend)
    topo.capture("--cleanup-only", backend=backend)
    assert not [line for line in topo.ruleset(backend).splitlines() if "ISTIO" in line or "istio" in line]


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_is_idempotent_and_reconciles_on_request(topo: Topology, backend: str) -> None:
    topo.capture(*DEFAULT_ARGS, backend=backend)
    first = topo.ruleset(backend)
    again = topo.capture(*DEFAULT_ARGS, backend=backend)
    assert topo.ruleset(backend) == first
    if backend != "nftables":
        assert "already in place" in again.stderr
        conflict = topo.capture(*DEFAULT_ARGS, "--redirect-dns", "--dns-servers=10.0.0.1", backend=backend, check=False)
        assert conflict.returncode == 1 and "--reconcile" in conflict.stderr
    topo.capture(*DEFAULT_ARGS, "--redirect-dns", "--dns-servers=10.0.0.1", "--reconcile", backend=backend)
    reconciled = _istio_lines(topo.ruleset(backend))
    topo.capture("--cleanup-only", backend=backend)
    topo.capture(*DEFAULT_ARGS, "--redirect-dns", "--dns-servers=10.0.0.1", backend=backend)
    assert reconciled == _istio_lines(topo.ruleset(backend))
    assert any("10.0.0.1" in line for line in reconciled)


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_validation_passes_only_when_redirection_works(topo: Topology, backend: str) -> None:
    ok = topo.capture(*DEFAULT_ARGS, "--run-validation", "--probe-timeout=5s", backend=backend)
    assert "validation passed" in ok.stderr
    topo.capture("--cleanup-only", backend=backend)
    # Without the rules the probe never arrives: the tool gives up (how fast is bench_capture's figure).
    failed = topo.capture("--skip-rule-apply", "--run-validation", "--probe-timeout=1s", backend=backend, check=False)
    assert failed.returncode == 126, failed.stderr
    assert "validation failed: no redirected connection" in failed.stderr


def test_injected_interface_name_is_rejected_before_touching_the_kernel(topo: Topology) -> None:
    before = topo.ruleset("iptables-nft")
    result = topo.capture(*DEFAULT_ARGS, "-c", "eth0 -j ACCEPT", backend="iptables-nft", check=False)
    assert result.returncode == 1
    assert "--istio-exclude-interfaces" in result.stderr and "eth0 -j ACCEPT" in result.stderr
    assert topo.ruleset("iptables-nft") == before


def test_ip_netns_exec_without_namespace_flag(topo: Topology) -> None:
    """The rules land in whatever namespace the tool runs in (as istio-init does)."""
    standard_listeners(topo)
    sh("ip", "netns", "exec", topo.pod, str(VENV_BIN / "istio-iptables"), *DEFAULT_ARGS)
    got = topo.connect(topo.pod, REMOTE_V4, 80, uid=APP_UID)
    assert (got["ns"], got["listener"]) == (topo.pod, 15001)


def _istio_lines(ruleset: str) -> list[str]:
    return sorted(line for line in ruleset.splitlines() if "ISTIO" in line or "istio" in line or "15053" in line)


def _preexisting_rules(t: Topology, backend: str) -> None:
    """Rules a pod might already have, in every table we touch (they must survive cleanup)."""
    if backend == "nftables":
        script = "table inet user {\n chain out {\n  type filter hook output priority 0;\n  tcp dport 7 accept\n }\n}\n"
        sh("ip", "netns", "exec", t.pod, "nft", "-f", "-", stdin=script)
        return
    variant = backend.split("-")[1]
    text = "".join(
        f"*{table}\n-N USER_{table.upper()}\n-A {chain} -p tcp --dport 7 -j USER_{table.upper()}\n"
        f"-A USER_{table.upper()} -j RETURN\nCOMMIT\n"
        for table, chain in (("filter", "INPUT"), ("nat", "OUTPUT"), ("mangle", "PREROUTING"), ("raw", "OUTPUT"))
    )
    for family in ("iptables", "ip6tables"):
        sh("ip", "netns", "exec", t.pod, f"{family}-{variant}-restore", "--noflush", stdin=text)


def test_kernel_table_probe_sees_what_the_tools_create(topo: Topology) -> None:
    """The iptables-save probe is skipped only when the kernel really has no tables."""
    probe = (
        "import json; from istio_agent.capture.kernelstate import nft_table_names, legacy_table_names;"
        "print(json.dumps([sorted(nft_table_names(False)), sorted(nft_table_names(True)),"
        " sorted(legacy_table_names(False))]))"
    )

    def tables() -> list[list[str]]:
        out = sh("nsenter", f"--net={topo.pod_path}", sys.executable, "-c", probe).stdout
        result: list[list[str]] = json.loads(out)
        return result

    assert tables() == [[], [], []]
    sh("ip", "netns", "exec", topo.pod, "iptables-nft", "-t", "nat", "-N", "X")
    sh("ip", "netns", "exec", topo.pod, "ip6tables-nft", "-t", "raw", "-N", "Y")
    sh("ip", "netns", "exec", topo.pod, "iptables-legacy", "-t", "mangle", "-N", "Z")
    assert tables() == [["nat"], ["raw"], ["mangle"]]


def test_ipv6_pods_get_the_inbound_address_as_ip_adds_it(topo: Topology) -> None:
    """`::6/128` on lo, added over rtnetlink (no `ip` process), is the address `ip -6 addr add` makes."""

    def lo_v6(ns: str) -> list[dict[str, Any]]:
        shown = json.loads(sh("ip", "-n", ns, "-d", "-j", "-6", "addr", "show", "dev", "lo").stdout)
        return [a for a in shown[0]["addr_info"] if a.get("local") == "::6"]

    probe = ("from istio_agent.capture.loopback import add_address; six = bytes(15) + b'\\x06';"
             "print(add_address('lo', six, 128), add_address('lo', six, 128))")
    assert lo_v6(topo.pod) == []
    added = sh("nsenter", f"--net={topo.pod_path}", sys.executable, "-c", probe).stdout.split()
    assert added == ["True", "False"]  # added, then already there
    sh("ip", "-n", topo.peer, "-6", "addr", "add", "::6/128", "dev", "lo")  # the way upstream adds it
    assert lo_v6(topo.pod) == lo_v6(topo.peer) and len(lo_v6(topo.pod)) == 1
    for _ in range(2):  # istio-iptables with IPv6, on a lo that has it already
        topo.capture(*DEFAULT_ARGS, "--enable-ipv6=true", backend="iptables-nft")
    assert lo_v6(topo.pod) == lo_v6(topo.peer)

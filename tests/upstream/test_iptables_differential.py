"""istio-iptables against upstream's `pilot-agent istio-iptables`, on generated flag and environment combinations.

Each case is a command line and an environment drawn from upstream's flag grammar (ports, port lists, CIDR
lists with IPv6, modes, uid/gid lists, interfaces, marks, tables, booleans as flags and through their
variables, `*`, empty and invalid values, repeated flags, unknown flags, positional words) plus host facts:
which addresses the pod's interfaces hold (none, IPv4, IPv6, both in either order) and the resolv.conf body.
Both commands run in dry-run mode (`-n`) in the same named network namespace through `ip netns exec`, which
mounts that namespace's resolv.conf over /etc/resolv.conf for both.

Compared, with no normalisation: the exit codes, and when both succeed the `DRY_RUN_FILE_PATH` recordings
byte for byte (or that neither wrote one). When both fail, the exit code is the error's class: 255 for a
command line pflag refuses, 1 for a value or host fact the run refuses.

Deliberate differences (docs/UPSTREAM.md), each recognised only under its own conditions:
- ours refuses (exit 1, naming the flag and the value) a value outside its flag's grammar that upstream copies
  into its rules unchecked or ignores in that mode (`-p 0`, `-m FOO`, a uid `x`, a mark used only by TPROXY):
  upstream's dry run succeeds. Counted as deliberate only when the value ours names is one the generator drew
  as invalid, or when upstream's recorded rules are refused by `iptables-restore --test` (both families) in
  that namespace; ours refusing a valid value fails the test.
- `--cleanup-only` on a pod with no address but loopback: upstream refuses (it looks for the pod's address
  before it looks at the mode), ours carries the cleanup out (removing rules needs no address).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from needs import need_file, need_tool
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

HOSTS = POD_HOSTS  # on "bare" (loopback only) upstream finds no pod address and refuses

# --- values, from upstream's flag grammar ---------------------------------------------------------------------
# Every value is drawn with a tag: True when it is valid by the flag's documented grammar (a port is 1-65535, a
# uid a number, a mode REDIRECT or TPROXY, a CIDR one netip.ParsePrefix takes, an interface name one the kernel
# takes), False otherwise. Ours may refuse a case only when a False value is in it (see `deliberate_difference`).
Tagged = tuple[str, bool]


def ok(values: st.SearchStrategy[str]) -> st.SearchStrategy[Tagged]:
    return values.map(lambda v: (v, True))


def bad(*values: str) -> st.SearchStrategy[Tagged]:
    return st.sampled_from(values).map(lambda v: (v, False))


def comma_list(items: st.SearchStrategy[Tagged], max_size: int = 4) -> st.SearchStrategy[Tagged]:
    return st.lists(items, min_size=1, max_size=max_size).map(
        lambda xs: (",".join(v for v, _ in xs), all(good for _, good in xs)))


PORT = ok(st.one_of(st.sampled_from(["15001", "15006", "15008", "80", "443", "53", "1", "65535"]),
                    st.integers(1, 65535).map(str)))
BAD_PORT = bad("0", "65536", "abc", "15001x", "-1", "+80", " 80", "0x50", "1e3", "99999999999", "080")
PORT_VALUE = st.one_of(PORT, PORT, PORT, BAD_PORT)
PORT_LIST = st.one_of(ok(st.sampled_from(["*", ""])), comma_list(PORT),
                      comma_list(st.one_of(PORT, BAD_PORT, ok(st.just("")), bad("*")), 3))
PLAIN_PORT_LIST = st.one_of(ok(st.just("")), comma_list(PORT), comma_list(st.one_of(PORT, BAD_PORT, bad("*")), 3))


CIDR = ok(st.one_of(
    st.builds(lambda a, n: f"{a}/{n}", st.ip_addresses(v=4), st.integers(0, 32)),
    st.builds(lambda a, n: f"{a}/{n}", st.ip_addresses(v=6), st.integers(0, 128)),
    st.sampled_from([
    "10.0.0.0/8", "127.0.0.1/32", "127.0.0.0/8", "::1/128", "0.0.0.0/0", "::/0", "169.254.0.0/16", "fe80::/10",
    "192.168.1.1/24", "::ffff:10.0.0.1/128"])))
BAD_CIDR = bad("10.0.0.0/33", "::/129", "10.0.0.1", "abc", "10.0.0.0/-1", "fe80::1%eth0/64", "10.0.0.0/8/8",
               "1.2.3/24", "10.0.0.0/08")
CIDR_LIST = st.one_of(ok(st.sampled_from(["*", ""])), comma_list(CIDR),
                      comma_list(st.one_of(CIDR, BAD_CIDR, ok(st.just(""))), 3))
EXCLUDE_CIDR_LIST = st.one_of(ok(st.just("")), bad("*"), comma_list(CIDR),
                              comma_list(st.one_of(CIDR, BAD_CIDR, ok(st.just(""))), 3))
ID = ok(st.one_of(st.sampled_from(["1337", "0", "1000", "65534"]), st.integers(0, 2**32 - 2).map(str)))
ID_LIST = st.one_of(ID, comma_list(ID, 3), ok(st.just("")), bad("x", "-1", "root", "4294967296", "1337 ", "0x10"))
MODE = st.one_of(ok(st.sampled_from(["REDIRECT", "TPROXY", ""])), bad("redirect", "tproxy", "FOO"))
MARK = st.one_of(ok(st.integers(1, 2**32 - 1).map(str)), ok(st.just("1337")), bad("0", "abc", "0x539", "-1", ""))
TABLE = st.one_of(ok(st.integers(1, 252).map(str)), ok(st.integers(256, 2**32 - 1).map(str)),
                  bad("0", "253", "254", "255", "abc", "main", "-1", ""))
IFACE = ok(st.from_regex(r"\A[a-z][a-z0-9]{0,6}\Z", fullmatch=True) | st.sampled_from(["eth0", "lo", "veth+"]))
IFACE_LIST = st.one_of(ok(st.just("")), comma_list(IFACE, 3), ok(st.sampled_from(["eth0,", ",eth0"])),
                       bad("a b", "eth0 -j ACCEPT", "averyveryverylongname", "-x"))
GROUP = st.one_of(ID, ok(st.from_regex(r"\A[a-z][a-z0-9]{0,5}\Z", fullmatch=True)))
GROUPS = st.one_of(ok(st.sampled_from(["", "java", "1337,java"])), comma_list(GROUP, 3), bad("1337 ,java", "a b"))
GROUPS_INCLUDE = st.one_of(GROUPS, ok(st.just("*")))
GROUPS_EXCLUDE = st.one_of(GROUPS, bad("*"))
LOOPBACK_CIDR = st.one_of(ok(st.sampled_from(["127.0.0.1/32", "127.0.0.0/8", "127.0.0.6/32", "127.1.2.3/16"])),
                          bad("10.0.0.0/8", "127.0.0.1/33", "abc", "", "::1/128", "127.0.0.0/7"))
BOOL_TEXT = st.sampled_from(["true", "false", "1", "0", "t", "f", "T", "F", "TRUE", "False", "yes", "", "maybe"])
PROBE_PORT = st.one_of(PORT, bad("70000", "abc", "0", "-1", "0x3a9a"))
DURATION = st.one_of(ok(st.sampled_from(["5s", "1m", "100ms", "1h2m3s", "0", "1.5s"])), bad("5", "abc", "-1s", ""))

# One value in VALID_ODDS + 1 is drawn from outside its grammar.
VALID_ODDS = 7

# long name -> (short, value strategy, environment variables upstream binds to it)
VALUED: dict[str, tuple[str, st.SearchStrategy[Tagged], tuple[str, ...]]] = {
    "envoy-port": ("p", PORT_VALUE, ()),
    "inbound-capture-port": ("z", PORT_VALUE, ("INBOUND_CAPTURE_PORT",)),
    "inbound-tunnel-port": ("e", PORT_VALUE, ("INBOUND_TUNNEL_PORT",)),
    "proxy-uid": ("u", ID_LIST, ("PROXY_UID",)),
    "proxy-gid": ("g", ID_LIST, ("PROXY_GID",)),
    "istio-inbound-interception-mode": ("m", MODE, ("ISTIO_INBOUND_INTERCEPTION_MODE",)),
    "istio-inbound-ports": ("b", PORT_LIST, ("ISTIO_INBOUND_PORTS",)),
    "istio-local-exclude-ports": ("d", PLAIN_PORT_LIST, ("ISTIO_LOCAL_EXCLUDE_PORTS",)),
    "istio-exclude-interfaces": ("c", IFACE_LIST, ("ISTIO_EXCLUDE_INTERFACES",)),
    "istio-service-cidr": ("i", CIDR_LIST, ("ISTIO_SERVICE_CIDR",)),
    "istio-service-exclude-cidr": ("x", EXCLUDE_CIDR_LIST, ("ISTIO_SERVICE_EXCLUDE_CIDR",)),
    "istio-outbound-ports": ("q", PLAIN_PORT_LIST, ("ISTIO_OUTBOUND_PORTS",)),
    "istio-local-outbound-ports-exclude": ("o", PLAIN_PORT_LIST, ("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE",)),
    "kube-virt-interfaces": ("k", IFACE_LIST, ("KUBE_VIRT_INTERFACES",)),
    "istio-inbound-tproxy-mark": ("t", MARK, ("ISTIO_INBOUND_TPROXY_MARK",)),
    "istio-inbound-tproxy-route-table": ("r", TABLE, ("ISTIO_INBOUND_TPROXY_ROUTE_TABLE",)),
    "iptables-probe-port": ("", PROBE_PORT, ("IPTABLES_PROBE_PORT",)),
    "probe-timeout": ("", DURATION, ("PROBE_TIMEOUT",)),
}
BOOLS: dict[str, tuple[str, ...]] = {
    "redirect-dns": ("REDIRECT_DNS", "ISTIO_META_DNS_CAPTURE"),
    "capture-all-dns": ("CAPTURE_ALL_DNS",),
    "drop-invalid": ("DROP_INVALID", "INVALID_DROP"),
    "dual-stack": ("DUAL_STACK", "ISTIO_DUAL_STACK"),
    "cleanup-only": ("CLEANUP_ONLY",),
    "reconcile": ("RECONCILE",),
    "force-apply": ("FORCE_APPLY",),
    "cni-mode": ("CNI_MODE",),
    "skip-rule-apply": ("SKIP_RULE_APPLY",),
}
ENV_ONLY: dict[str, st.SearchStrategy[Tagged]] = {
    "ISTIO_OUTBOUND_OWNER_GROUPS": GROUPS_INCLUDE,
    "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE": GROUPS_EXCLUDE,
    "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": LOOPBACK_CIDR,
    "ENVOY_USER": ok(st.sampled_from(["istio-proxy", "root", "nobody", "no-such-user", ""])),
}
NAMESERVER = st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str), st.sampled_from([
    "10.96.0.10", "127.0.0.53", "::127.0.0.53", "fd00::10", "::1", "fe80::1%eth0", "bogus", "::ffff:10.0.0.1"]))
RESOLV_LINE = st.one_of(
    NAMESERVER.map(lambda a: f"nameserver {a}"), NAMESERVER.map(lambda a: f"nameserver\t{a}  "),
    st.sampled_from(["search default.svc.cluster.local svc.cluster.local", "options ndots:5", "# nameserver 1.2.3.4",
                     "; nameserver 1.2.3.5", "nameserver", "domain cluster.local", ""]))


def tagged_as(valid: bool, value: Tagged) -> bool:
    return value[1] == valid


def _valued_arg(draw: st.DrawFn, name: str) -> tuple[list[str], dict[str, str], Tagged]:
    short, values, envs = VALUED[name]
    valid = draw(st.integers(0, VALID_ODDS)) < VALID_ODDS  # shrinks towards valid
    tagged = draw(values.filter(functools.partial(tagged_as, valid)))
    value = tagged[0]
    styles = ["--long=v", "--long v"] + (["-s v", "-sv", "-s=v"] if short else []) + (["env"] if envs else [])
    style = draw(st.sampled_from(styles))
    if style == "env":
        return [], {draw(st.sampled_from(envs)): value}, tagged
    if style == "--long=v":
        return [f"--{name}={value}"], {}, tagged
    if style == "--long v":
        return [f"--{name}", value], {}, tagged
    if style == "-s v":
        return [f"-{short}", value], {}, tagged
    if style == "-sv" and value:
        return [f"-{short}{value}"], {}, tagged
    if value:
        return [f"-{short}={value}"], {}, tagged
    return [f"-{short}="], {}, ("=", False)  # pflag reads `-p=` as `-p` with the value "="


def _bool_arg(draw: st.DrawFn, name: str) -> tuple[list[str], dict[str, str]]:
    style = draw(st.sampled_from(["--flag", "--flag=v", "env", "env"]))
    if style == "--flag":
        return [f"--{name}"], {}
    if style == "--flag=v":
        return [f"--{name}={draw(BOOL_TEXT)}"], {}
    return [], {draw(st.sampled_from(BOOLS[name])): draw(BOOL_TEXT)}


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    """One invocation: argv after `-n`, environment, host, resolv.conf body, which of our entry points, and the
    values outside their flag's grammar (`invalid`)."""
    args: list[str] = []
    env: dict[str, str] = {}
    invalid: list[str] = []
    for name in draw(st.lists(st.sampled_from(sorted(VALUED)), max_size=7)):  # repeats allowed: the last wins
        more_args, more_env, (value, good) = _valued_arg(draw, name)
        args += more_args
        env.update(more_env)
        if not good:
            invalid.append(value)
    for name in draw(st.lists(st.sampled_from(sorted(BOOLS)), max_size=4)):
        more_args, more_env = _bool_arg(draw, name)
        args += more_args
        env.update(more_env)
    for var in draw(st.lists(st.sampled_from(sorted(ENV_ONLY)), max_size=2, unique=True)):
        valid = var == "ENVOY_USER" or draw(st.integers(0, VALID_ODDS)) < VALID_ODDS
        env[var], good = draw(ENV_ONLY[var].filter(functools.partial(tagged_as, valid)))
        if not good:
            invalid.append(env[var])
    oddity = draw(st.sampled_from([None] * 12 + ["unknown-long", "unknown-short", "positional", "dash-dash",
                                                 "missing-value", "log-flags", "help"]))
    if oddity == "unknown-long":
        args.append("--no-such-flag=1")
    elif oddity == "unknown-short":
        args.append("-Z")
    elif oddity == "positional":
        args.insert(draw(st.integers(0, len(args))), "extra")
    elif oddity == "dash-dash":
        args += ["--", "-p", "1"]
    elif oddity == "missing-value":
        args.append(draw(st.sampled_from(["-p", "--istio-service-cidr", "-b"])))
    elif oddity == "log-flags":
        args += ["--log_output_level=default:debug", "--log_as_json"]
    elif oddity == "help":
        args.append(draw(st.sampled_from(["-h", "--help"])))
    resolv = "\n".join(draw(st.lists(RESOLV_LINE, max_size=5))) + "\n"
    host = draw(st.sampled_from([*sorted(set(HOSTS) - {"bare"}) * 3, "bare"]))
    return {"args": ["-n", *args], "env": env, "host": host, "resolv_conf": resolv,
            "via_pilot_agent": draw(st.integers(0, 9)) == 0, "invalid": invalid}


# --- running both ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hosts() -> Iterator[dict[str, NamedNetns]]:
    """One named network namespace per host shape, for the whole module (each run only reads them)."""
    need_tool("iptables-restore")
    with pod_hosts(f"iadiff{os.getpid() % 100000}") as hosts:
        yield hosts


# A side's exit code, its dry-run recording (None when it wrote none) and its output.
Side = tuple[int, "str | None", str]
# Our refusal names the flag, then the value as Python writes it.
REFUSED_VALUE = re.compile(r"^istio-iptables: invalid value for [^:]*: ('.*?'): ", re.M)


def run_side(netns: NamedNetns, argv: list[str], env: dict[str, str], recording: Path) -> Side:
    """Exit code, the dry-run recording (None when none was written) and the output of one side."""
    recording.unlink(missing_ok=True)
    done = netns.run(argv, base_env({**env, "DRY_RUN_FILE_PATH": str(recording)}))
    text = recording.read_text() if recording.exists() else None
    return done.returncode, text, done.stdout + done.stderr


RESTORE_BLOCK = re.compile(r"^\*\w+\n.*?^COMMIT$", re.M | re.S)


def refused_by_kernel(netns: NamedNetns, recording: str) -> bool:
    """Whether some restore block of a recording is refused by both iptables-restore and ip6tables-restore
    (--test: parsed and checked by the kernel, nothing committed)."""
    for block in RESTORE_BLOCK.findall(recording):
        verdicts = [subprocess.run(["ip", "netns", "exec", netns.name, tool, "--test", "--noflush"],
                                   input=block + "\n", capture_output=True, text=True, check=False).returncode
                    for tool in ("iptables-restore", "ip6tables-restore")]
        if all(code != 0 for code in verdicts):
            return True
    return False


def error_class(output: str) -> str:
    """Upstream's error, as a class: its message up to the first quote or digit (`netip.ParsePrefix(`, `no valid
    local IP address found`, `unknown flag`), for the tally."""
    match = re.search(r"^(?:Error: |\S+\terror\t)(.*)$", output, re.M)
    if not match:
        return "?"
    return re.split(r"[\"'0-9:]", match.group(1))[0].strip() or match.group(1)[:40]


def deliberate_difference(case: dict[str, Any], netns: NamedNetns, theirs: Side, ours: Side) -> str:
    """The name of the README's deliberate difference this case shows, or "" when it shows none."""
    if theirs[0] == 0 and ours[0] == 1:
        if theirs[1] is not None and refused_by_kernel(netns, theirs[1]):
            return "refused up front what iptables-restore refuses"
        named = REFUSED_VALUE.search(ours[2])
        if named and any(repr(value) == named.group(1) for value in case["invalid"]):
            return "refused a value outside its flag's grammar that upstream copies or ignores"
    if (case["host"] == "bare" and theirs[0] == 1 and "no valid local IP address found" in theirs[2]
            and ours[0] == 0 and (ours[1] is None or "-X ISTIO_OUTPUT" in ours[1])):  # None: --skip-rule-apply
        return "cleanup-only needs no pod address"
    return ""


@pytest.mark.timeout(120 + 1 * DIFF_EXAMPLES)  # one pytest test runs every generated case
def test_istio_iptables_differential(hosts: dict[str, NamedNetns], tmp_path: Path) -> None:
    upstream = need_upstream("pilot-agent")
    ours_script = need_file(VENV_BIN / "istio-iptables", "our istio-iptables")
    ours_agent = need_file(VENV_BIN / "pilot-agent", "our pilot-agent")
    tally = Tally("istio-iptables")

    @differential
    @given(case=cases())
    def compare(case: dict[str, Any]) -> None:
        netns = hosts[case["host"]]
        netns.resolv_conf(case["resolv_conf"])
        theirs = run_side(netns, [str(upstream), "istio-iptables", *case["args"]], case["env"],
                          tmp_path / "upstream.txt")
        ours_argv = [str(ours_agent), "istio-iptables"] if case["via_pilot_agent"] else [str(ours_script)]
        ours = run_side(netns, [*ours_argv, *case["args"]], case["env"], tmp_path / "ours.txt")
        where = f"case {describe(case)}\nupstream said:\n{theirs[2][-1500:]}\nours said:\n{ours[2][-3000:]}"
        deliberate = deliberate_difference(case, netns, theirs, ours)
        if deliberate:
            tally.count(f"deliberate: {deliberate}")
            return
        assert ours[0] == theirs[0], f"exit codes differ: upstream {theirs[0]}, ours {ours[0]}\n{where}"
        if theirs[0] == 0:
            assert ours[1] == theirs[1], (f"recordings differ\nupstream:\n{theirs[1]}\nours:\n{ours[1]}\n{where}")
            tally.count("equal recording")
        else:
            assert ours[2].strip(), f"ours failed silently\n{where}"
            tally.count(f"both refused (exit {theirs[0]}: {error_class(theirs[2])})")

    compare()
    print(tally.report())
    assert tally.counts["cases"] >= 1

"""`istio-iptables`' table: upstream's flags, the variables bound to each, and the settings read from the
environment only (the shape is `config/settings.py`'s).

It lives in the capture library rather than beside the command line because
two programs read it: `istio-iptables` (and `pilot-agent istio-iptables`)
parse their command lines from it (`cli/iptables.py`), and the `istio-cni`
plugin applies the same environment-only settings to the rules it writes
(`cni/plugin/podinfo.py`). A flag's default is `CaptureConfig`'s.

Precedence is upstream's: the default, then the flag's own variable
(`--foo-bar` <- `FOO_BAR`), then its additional variables (e.g.
`ISTIO_META_DNS_CAPTURE`), then the command line. Two flags are ours, to pin
host facts for reproducible dry runs: `--enable-ipv6` and `--dns-servers`.

On the per-pod path: it imports only `config.settings` and `capture.config`,
and the parsers import what they need when a value comes.
"""

from __future__ import annotations

from istio_agent.capture.config import FIELDS
from istio_agent.config.settings import ACCEPTED, Command, EnvVar, Flag, Program, go_bool, text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_DEFAULT: dict[str, Any] = {name: default for name, _, default in FIELDS}
_COMPATIBILITY = "istio-iptables logs only its errors, to stderr"


def dns_servers(value: str) -> dict[str, list[str]]:
    """`--dns-servers`: a comma list, used verbatim, into CaptureConfig's IPv4 and IPv6 lists."""
    from istio_agent.capture.hostfacts import split_servers

    v4, v6 = split_servers([server for server in value.split(",") if server])
    return {"dns_servers_v4": v4, "dns_servers_v6": v6}


def _flag(name: str, short: str, dest: str, env: tuple[str, ...], description: str) -> Flag[str]:
    return Flag(name, _DEFAULT[dest], description, short=short, dest=dest, env=env)


def _bool(name: str, dest: str, env: tuple[str, ...], description: str, short: str = "") -> Flag[bool]:
    return Flag(name, _DEFAULT[dest], description, go_bool, "bool", short=short, dest=dest, env=env)


FLAGS: tuple[Flag[Any], ...] = (
    _flag("envoy-port", "p", "proxy_port", (), "Envoy port to which all outbound TCP traffic is redirected (15001)."),
    _flag("inbound-capture-port", "z", "inbound_capture_port", ("INBOUND_CAPTURE_PORT",),
          "Port to which all inbound TCP traffic is redirected (15006)."),
    _flag("inbound-tunnel-port", "e", "inbound_tunnel_port", ("INBOUND_TUNNEL_PORT",),
          "Istio tunnel port for inbound TCP traffic, never redirected (15008)."),
    _flag("proxy-uid", "u", "proxy_uid", ("PROXY_UID",),
          "Comma list of UIDs whose traffic is not redirected (default: uid of $ENVOY_USER, else 1337)."),
    _flag("proxy-gid", "g", "proxy_gid", ("PROXY_GID",),
          "Comma list of GIDs whose traffic is not redirected (default: -u)."),
    _flag("istio-inbound-interception-mode", "m", "inbound_interception_mode", ("ISTIO_INBOUND_INTERCEPTION_MODE",),
          "Inbound redirection mode: REDIRECT or TPROXY."),
    _flag("istio-inbound-ports", "b", "inbound_ports_include", ("ISTIO_INBOUND_PORTS",),
          "Comma list of inbound ports to redirect, '*' for all, empty for none."),
    _flag("istio-local-exclude-ports", "d", "inbound_ports_exclude", ("ISTIO_LOCAL_EXCLUDE_PORTS",),
          "Comma list of inbound ports not redirected (only with -b '*')."),
    _flag("istio-exclude-interfaces", "c", "exclude_interfaces", ("ISTIO_EXCLUDE_INTERFACES",),
          "Comma list of interfaces whose traffic is never captured."),
    _flag("istio-service-cidr", "i", "outbound_ip_ranges_include", ("ISTIO_SERVICE_CIDR",),
          "Comma list of CIDRs to redirect outbound, '*' for all, empty for none."),
    _flag("istio-service-exclude-cidr", "x", "outbound_ip_ranges_exclude", ("ISTIO_SERVICE_EXCLUDE_CIDR",),
          "Comma list of CIDRs never redirected outbound."),
    _flag("istio-outbound-ports", "q", "outbound_ports_include", ("ISTIO_OUTBOUND_PORTS",),
          "Comma list of outbound ports always redirected."),
    _flag("istio-local-outbound-ports-exclude", "o", "outbound_ports_exclude", ("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE",),
          "Comma list of outbound ports never redirected."),
    _flag("kube-virt-interfaces", "k", "reroute_virtual_interfaces", ("KUBE_VIRT_INTERFACES",),
          "Comma list of virtual interfaces whose inbound traffic is treated as outbound."),
    _flag("istio-inbound-tproxy-mark", "t", "inbound_tproxy_mark", ("ISTIO_INBOUND_TPROXY_MARK",),
          "Packet mark used in TPROXY mode (1337)."),
    _flag("istio-inbound-tproxy-route-table", "r", "inbound_tproxy_route_table", ("ISTIO_INBOUND_TPROXY_ROUTE_TABLE",),
          "Routing table used in TPROXY mode (133)."),
    _bool("dry-run", "dry_run", ("DRY_RUN",), "Touch nothing; record the commands to $DRY_RUN_FILE_PATH or stdout.",
          short="n"),
    _flag("iptables-probe-port", "", "iptables_probe_port", ("IPTABLES_PROBE_PORT",), "Validation probe port (15002)."),
    _flag("probe-timeout", "", "probe_timeout", ("PROBE_TIMEOUT",), "Validation timeout, a Go duration (5s)."),
    _bool("skip-rule-apply", "skip_rule_apply", ("SKIP_RULE_APPLY",), "Do not apply rules (validation only)."),
    _bool("run-validation", "run_validation", ("RUN_VALIDATION",),
          "After applying, prove that redirection works; exit 126 if not."),
    _bool("redirect-dns", "redirect_dns", ("REDIRECT_DNS", "ISTIO_META_DNS_CAPTURE"),
          "Redirect DNS to the agent on port 15053."),
    _bool("drop-invalid", "drop_invalid", ("DROP_INVALID", "INVALID_DROP"), "Drop packets in conntrack state INVALID."),
    _bool("dual-stack", "dual_stack", ("DUAL_STACK", "ISTIO_DUAL_STACK"), "Enable IPv4 and IPv6 redirection together."),
    _bool("capture-all-dns", "capture_all_dns", ("CAPTURE_ALL_DNS",),
          "With --redirect-dns, capture all port-53 traffic, not only to resolv.conf servers."),
    _flag("network-namespace", "", "network_namespace", ("NETWORK_NAMESPACE",),
          "Network namespace (a path such as /var/run/netns/x) to apply the rules in."),
    _bool("cni-mode", "cni_mode", ("CNI_MODE",), "Run as part of the CNI plugin."),
    _bool("reconcile", "reconcile", ("RECONCILE",), "Replace pre-existing, different Istio rules."),
    _bool("cleanup-only", "cleanup_only", ("CLEANUP_ONLY",), "Only remove Istio chains and rules."),
    _bool("force-apply", "force_apply", ("FORCE_APPLY",), "Apply even when the rules seem to be in place."),
    _bool("native-nftables", "native_nftables", ("NATIVE_NFTABLES",), "Use native nftables instead of iptables."),
    _flag("force-iptables-binary", "", "force_iptables_binary", ("FORCE_IPTABLES_BINARY",),
          "Choose the iptables backend: legacy or nft."),
    Flag("enable-ipv6", None, "Pin IPv6 on or off (true|false) instead of detecting it.", go_bool, "bool",
         takes_value=True, upstream=False),
    Flag("dns-servers", None, "Pin the DNS servers (comma list, used verbatim) instead of resolv.conf.", dns_servers,
         "list", upstream=False),
    Flag("log_output_level", "", "Accepted for compatibility.", dest="", support=ACCEPTED, note=_COMPATIBILITY),
    Flag("log_as_json", False, "Accepted for compatibility.", go_bool, "bool", dest="", support=ACCEPTED,
         note=_COMPATIBILITY),
    Flag("log_caller", "", "Accepted for compatibility.", dest="", support=ACCEPTED, note=_COMPATIBILITY),
    Flag("log_stacktrace_level", "", "Accepted for compatibility.", dest="", support=ACCEPTED, note=_COMPATIBILITY),
    Flag("log_target", "", "Accepted for compatibility.", dest="", support=ACCEPTED, note=_COMPATIBILITY),
)  # fmt: skip

# Settings upstream reads only from the environment (always, with these defaults): CaptureConfig attribute, variable.
ENV_ONLY: tuple[tuple[str, EnvVar[str]], ...] = (
    ("owner_groups_include", EnvVar("ISTIO_OUTBOUND_OWNER_GROUPS", "*",
                                    "Comma list of groups (names or gids) whose outbound traffic is redirected, "
                                    "'*' for all.", text, "string")),
    ("owner_groups_exclude", EnvVar("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "",
                                    "Comma list of groups whose outbound traffic is never redirected.", text,
                                    "string")),
    ("host_ipv4_loopback_cidr", EnvVar("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/32",
                                       "The IPv4 loopback range whose outbound traffic is the app's own, kept off "
                                       "the redirection.", text, "string")),
)
DRY_RUN_FILE_PATH = EnvVar("DRY_RUN_FILE_PATH", "",
                           "With --dry-run, the file the commands are recorded to (unset: stdout).", text, "string")
ENVOY_USER = EnvVar("ENVOY_USER", "istio-proxy", "The user whose uid is --proxy-uid's default (1337 when there is no "
                    "such user).", text, "string")

ISTIO_IPTABLES = Program(
    "istio-iptables",
    "Set up iptables (or nftables) rules that redirect a pod's traffic through the Istio sidecar. "
    "`pilot-agent istio-iptables` is the same command. Exit codes: 0, 1 for a bad flag, value or failure, "
    "126 when `--run-validation` finds redirection not working.",
    (Command("", "Set up iptables (or nftables) rules that redirect a pod's traffic through the Istio sidecar.",
             FLAGS),),
    "src/istio_agent/capture/flags.py",
    variables=(*(var for _, var in ENV_ONLY), DRY_RUN_FILE_PATH, ENVOY_USER),
)

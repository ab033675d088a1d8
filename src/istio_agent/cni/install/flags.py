"""install-cni's table: upstream's flags, each bound to its environment variable, and the variables read from
the environment only (the shape is `config/settings.py`'s).

Each flag can also come from its variable, the flag name upper-cased with `-`
as `_` (`--mounted-cni-net-dir` <- `MOUNTED_CNI_NET_DIR`), which is how
upstream's viper binding reads them; a flag on the command line wins over the
variable. Booleans are Go's strconv.ParseBool spellings and integers Go's
base-0 syntax (`0600` is octal, as pflag reads `--kubeconfig-mode`).

Some of upstream's settings are read by viper from the environment only (they
have no registered flag: `EXCLUDE_NAMESPACES`, `POD_NAMESPACE`,
`NATIVE_NFTABLES`, the ambient ones, `REPAIR_REPAIR_PODS`); here each is a
flag too. Ours, not upstream's: `--cni-bin-dir`, `--service-account-dir`,
`--readiness-port`, `--repair-host-proc-dir`. The repair controller's defaults are its options'
(`cni/repair/options.py`). `main.py` builds the command line from this table,
`options.py` resolves it into `InstallOptions`, and
`docs/reference/install-cni.md` is generated from it.
"""

from __future__ import annotations

from typing import Any

from istio_agent.cni.repair.options import RepairOptions
from istio_agent.config.gobool import parse_bool
from istio_agent.config.settings import ACCEPTED, PARTIAL, Command, EnvVar, Flag, Program, go_bool, text
from istio_agent.kube.access import SERVICE_ACCOUNT_DIR

DEFAULT_KUBECONFIG_MODE = 0o600
_REPAIR = RepairOptions()
_AMBIENT = "ambient mode is not provided: pods are handled as sidecar pods"


def env_name(flag: str) -> str:
    return flag.upper().replace("-", "_")


def parse_go_int(text: str) -> int:
    """strconv.ParseInt(text, 0, 64): 0x/0o/0b prefixes, a leading 0 for octal, `_` only after a prefix."""
    body = text.strip()
    sign = -1 if body.startswith("-") else 1
    digits = body[1:] if body[:1] in "+-" else body
    if not digits:
        raise ValueError("empty")
    lowered = digits.lower()
    if lowered.startswith(("0x", "0o", "0b")):
        return sign * int(digits, 0)
    if "_" in digits:
        raise ValueError("underscores need a base prefix")
    if len(digits) > 1 and digits.startswith("0"):
        return sign * int(digits[1:], 8)
    return sign * int(digits, 10)


def parse_trimmed_bool(text: str) -> bool:
    """Go's strconv.ParseBool of the value without surrounding blanks."""
    return parse_bool(text.strip())


def _flag(name: str, default: Any, description: str, *, dest: str | None = None, upstream: bool = True,
          support: Any = "honoured", note: str = "") -> Flag[Any]:
    if isinstance(default, bool):
        parse: Any = parse_trimmed_bool
        type_name = "bool"
    elif isinstance(default, int):
        parse, type_name = parse_go_int, "int"
    else:
        parse, type_name = text, "string"
    return Flag(name, default, description, parse, type_name, env=(env_name(name),), dest=dest,
                takes_value=True, upstream=upstream, support=support, note=note)


def _repair(name: str, field: str, description: str, *, upstream: bool = True) -> Flag[Any]:
    return _flag(name, getattr(_REPAIR, field), description, dest=field, upstream=upstream)


# Settings that go to InstallOptions' field of the same name (but `log-level`, the plugin's level's fallback).
INSTALL_FLAGS: tuple[Flag[Any], ...] = (
    _flag("mounted-cni-net-dir", "/host/etc/cni/net.d", "Directory on the container where CNI networks are installed"),
    _flag("cni-conf-name", "", "Name of the CNI configuration file"),
    _flag("chained-cni-plugin", True, "Whether to install CNI plugin as a chained or standalone"),
    _flag("cni-network-config", "", "CNI configuration template as a string (accepted, unused: as upstream)"),
    _flag("cni-network-config-file", "", "CNI config template as a file (accepted, unused: as upstream)"),
    _flag("istio-owned-cni-config", False, "Whether an Istio owned CNI configuration is enabled"),
    _flag("istio-owned-cni-config-filename", "", "Filename for Istio owned CNI configuration"),
    _flag("log-level", "warn", "Fallback value for log level in CNI config file, if not specified otherwise",
          support="accepted", note="upstream declares it and never reads it: the plugin's level comes from "
          "--log_output_level's cni-plugin scope, else info"),
    _flag("cni-agent-run-dir", "/var/run/istio-cni",
          "Location of the node agent writable path on the node (used for sockets, etc)"),
    _flag("kubeconfig-mode", DEFAULT_KUBECONFIG_MODE, "File mode of the kubeconfig file"),
    _flag("cni-conf-group-read", False,
          "Whether to enable group read on the CNI config file (0640 instead of default 0600)"),
    _flag("kube-ca-file", "", "CA file for kubeconfig. Defaults to the same as install-cni pod"),
    _flag("skip-tls-verify", False, "Whether to use insecure TLS in kubeconfig file"),
    _flag("monitoring-port", 15014, "HTTP port to serve prometheus metrics"),
    _flag("log-uds-socket", "",
          "Unix socket the CNI plugin posts its logs to (default <cni-agent-run-dir>/log.sock)"),
    _flag("ztunnel-uds-address", "/var/run/ztunnel/ztunnel.sock",
          "The UDS server address which ztunnel will connect to (ambient: accepted, unused)", support=ACCEPTED,
          note=_AMBIENT),
    _flag("exclude-namespaces", "", "Comma-separated list of namespaces the CNI plugin ignores"),
    _flag("pod-namespace", "", "The namespace install-cni runs in"),
    _flag("ambient-enabled", False, "Whether ambient controller is enabled (ambient itself is not provided)",
          support=PARTIAL, note="written to the plugin's configuration and, as upstream, it decides whether the "
          "Istio-owned configuration file is written; " + _AMBIENT),
    _flag("ambient-enablement-selector", "", "YAML list of ambient enablement selectors (written to the entry)",
          support=ACCEPTED, note=_AMBIENT + " (the selectors are written to the plugin's configuration)"),
    _flag("ambient-dns-capture", False, "Ambient DNS capture (accepted, unused)", support=ACCEPTED, note=_AMBIENT),
    _flag("ambient-ipv6", False, "Ambient IPv6 capture (accepted, unused)", support=ACCEPTED, note=_AMBIENT),
    _flag("ambient-disable-safe-upgrade", False, "Ambient safe upgrade off (accepted, unused)", support=ACCEPTED,
          note=_AMBIENT),
    _flag("ambient-reconcile-pod-rules-on-startup", False, "Ambient rule reconciliation (accepted, unused)",
          support=ACCEPTED, note=_AMBIENT),
    _flag("enable-ambient-detection-retry", False,
          "Whether or not is ambient check is retried on error in the cni plugin", support=ACCEPTED,
          note=_AMBIENT + " (the flag is written to the plugin's configuration)"),
    _flag("native-nftables", False, "Use native nftables instead of iptables rules for traffic redirection"),
)
# Settings of the repair controller: `dest` is the RepairOptions field.
REPAIR_FLAGS: tuple[Flag[Any], ...] = (
    _repair("repair-enabled", "enabled", "Whether to enable race condition repair or not"),
    _repair("repair-delete-pods", "delete_pods",
            "Controller will delete pods when detecting pod broken by race condition"),
    _repair("repair-repair-pods", "repair_pods", "Controller will repair pods broken by race condition"),
    _repair("repair-label-pods", "label_pods",
            "Controller will label pods when detecting pod broken by race condition"),
    _repair("repair-broken-pod-label-key", "label_key",
            "The key portion of the label which will be set by the race repair if label pods is true"),
    _repair("repair-broken-pod-label-value", "label_value",
            "The value portion of the label which will be set by the race repair if label pods is true"),
    _repair("repair-node-name", "node_name", "The name of the managed node (will manage all nodes if unset)"),
    _repair("repair-sidecar-annotation", "sidecar_annotation",
            "An annotation key that indicates this pod contains an istio sidecar"),
    _repair("repair-init-container-name", "init_container_name",
            "The name of the istio init container (will crash-loop if CNI is not configured for the pod)"),
    _repair("repair-init-container-termination-message", "init_container_termination_message",
            "The expected termination message for the init container when crash-looping because of CNI "
            "misconfiguration"),
    _repair("repair-init-container-exit-code", "init_container_exit_code",
            "Expected exit code for the init container when crash-looping because of CNI misconfiguration"),
    _repair("repair-label-selectors", "label_selectors",
            "A set of label selectors in label=value format that will be added to the pod list filters"),
    _repair("repair-field-selectors", "field_selectors",
            "A set of field selectors in label=value format that will be added to the pod list filters"),
    _repair("repair-host-proc-dir", "host_proc_dir",
            "Where the host's /proc is mounted: in-place repair finds pods' network namespaces there "
            "(not upstream: upstream hard-codes /host/proc)", upstream=False),
)
# Ours (upstream hard-codes these for its container image); InstallOptions' fields of the same name.
OUR_FLAGS: tuple[Flag[Any], ...] = (
    _flag("cni-bin-dir", "/host/opt/cni/bin", "Where the istio-cni plugin executable is installed (not upstream)",
          upstream=False),
    _flag("service-account-dir", SERVICE_ACCOUNT_DIR,
          "The service-account directory: token, ca.crt, namespace (not upstream)", upstream=False),
    _flag("readiness-port", 8000, "Port of /healthz and /readyz (not upstream: upstream fixes 8000)", upstream=False),
)
FLAGS: tuple[Flag[Any], ...] = (*INSTALL_FLAGS, *REPAIR_FLAGS, *OUR_FLAGS)

# Istio's logging flags (no variable).
LOG_FLAGS: tuple[Flag[Any], ...] = (
    Flag("log_output_level", "default:info",
         "Comma-separated scope:level pairs (scopes: default, cni-agent, cni-plugin, all)."),
    Flag("log_as_json", False, "Log lines as JSON objects.", go_bool, "bool"),
)

# Read from the environment only, as upstream does.
KUBERNETES_ENV: tuple[EnvVar[str], ...] = (
    EnvVar("KUBERNETES_SERVICE_PROTOCOL", "", "The API server's scheme (unset: https).", text, "string"),
    EnvVar("KUBERNETES_SERVICE_HOST", "", "The API server's host, as Kubernetes sets it in every pod; written into "
           "the plugin's kubeconfig.", text, "string"),
    EnvVar("KUBERNETES_SERVICE_PORT", "", "The API server's port, as Kubernetes sets it in every pod.", text,
           "string"),
    EnvVar("KUBERNETES_NODE_NAME", "", "The node's name, whose pods are repaired (unset: the host name).", text,
           "string"),
)

# `install-cni version`, upstream's (istio's common version subcommand).
VERSION = Command("version", "Prints out build version information", (
    Flag("short", False, "Use --short=false to generate full version information", go_bool, "bool", short="s",
         takes_value=True),
    Flag("output", "", "One of 'yaml' or 'json'.", short="o"),
))

INSTALL_CNI = Program(
    "install-cni",
    "The Istio CNI node agent: installs the `istio-cni` plugin (its binary and its entry in the node's CNI "
    "configuration), keeps it installed, answers the plugin's calls on its fast path, serves health and metrics, "
    "and repairs pods broken by the race between the CNI and the pod's start. It runs until SIGTERM or SIGINT. "
    "Every flag can also be given by its variable; the command line wins.",
    (Command("", "Install and configure the Istio CNI plugin on a node, keep it installed, repair pods broken by "
             "the race.", (*LOG_FLAGS, *FLAGS)),
     VERSION),
    "src/istio_agent/cni/install/flags.py",
    variables=KUBERNETES_ENV,
)

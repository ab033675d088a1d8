"""install-cni's flags and environment -> one frozen `InstallOptions` (pure: values come in, nothing is read).

Every upstream flag is declared once in `FLAGS` with its default; each can also
come from its environment variable, the flag name upper-cased with `-` as `_`
(`--mounted-cni-net-dir` <- `MOUNTED_CNI_NET_DIR`), which is how upstream's
viper binding reads them; a flag on the command line wins over the variable.
Booleans are Go's strconv.ParseBool spellings and integers Go's base-0 syntax
(`0600` is octal, as pflag reads `--kubeconfig-mode`). A bad value fails here,
naming the flag, its variable and the value (upstream's viper would silently
read it as false or 0).

Some of upstream's settings are read by viper from the environment only (they
have no registered flag: `EXCLUDE_NAMESPACES`, `POD_NAMESPACE`, `NATIVE_NFTABLES`,
the ambient ones, `REPAIR_REPAIR_PODS`); here each is a flag too. Ours, not
upstream's (`OURS`): `--cni-bin-dir`, `--service-account-dir`, `--readiness-port`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from istio_agent.cni.kubeaccess import SERVICE_ACCOUNT_DIR
from istio_agent.cni.plugin.log import SOCKET_NAME
from istio_agent.cni.repair.options import RepairOptions
from istio_agent.config.gobool import parse_bool

STR, BOOL, INT = "str", "bool", "int"

DEFAULT_ISTIO_OWNED_CNI_CONFIG_FILENAME = "02-istio-cni.conflist"
LOG_SOCKET_NAME = SOCKET_NAME  # the plugin posts its logs to <run dir>/log.sock
DEFAULT_KUBECONFIG_MODE = 0o600
CNI_CONF_MODE = 0o600
CNI_CONF_MODE_GROUP_READ = 0o640
LOG_LEVELS = ("debug", "info", "warn", "error", "fatal", "none")

_REPAIR = RepairOptions()

# (flag, kind, default, help)
FLAGS: tuple[tuple[str, str, str, str], ...] = (
    ("mounted-cni-net-dir", STR, "/host/etc/cni/net.d", "Directory on the container where CNI networks are installed"),
    ("cni-conf-name", STR, "", "Name of the CNI configuration file"),
    ("chained-cni-plugin", BOOL, "true", "Whether to install CNI plugin as a chained or standalone"),
    ("cni-network-config", STR, "", "CNI configuration template as a string (accepted, unused: as upstream)"),
    ("cni-network-config-file", STR, "", "CNI config template as a file (accepted, unused: as upstream)"),
    ("istio-owned-cni-config", BOOL, "false", "Whether an Istio owned CNI configuration is enabled"),
    ("istio-owned-cni-config-filename", STR, "", "Filename for Istio owned CNI configuration"),
    ("log-level", STR, "warn", "Fallback value for log level in CNI config file, if not specified otherwise"),
    ("cni-agent-run-dir", STR, "/var/run/istio-cni",
     "Location of the node agent writable path on the node (used for sockets, etc)"),
    ("kubeconfig-mode", INT, str(DEFAULT_KUBECONFIG_MODE), "File mode of the kubeconfig file"),
    ("cni-conf-group-read", BOOL, "false",
     "Whether to enable group read on the CNI config file (0640 instead of default 0600)"),
    ("kube-ca-file", STR, "", "CA file for kubeconfig. Defaults to the same as install-cni pod"),
    ("skip-tls-verify", BOOL, "false", "Whether to use insecure TLS in kubeconfig file"),
    ("monitoring-port", INT, "15014", "HTTP port to serve prometheus metrics"),
    ("log-uds-socket", STR, "", "Unix socket the CNI plugin posts its logs to (default <cni-agent-run-dir>/log.sock)"),
    ("ztunnel-uds-address", STR, "/var/run/ztunnel/ztunnel.sock",
     "The UDS server address which ztunnel will connect to (ambient: accepted, unused)"),
    ("exclude-namespaces", STR, "", "Comma-separated list of namespaces the CNI plugin ignores"),
    ("pod-namespace", STR, "", "The namespace install-cni runs in"),
    ("ambient-enabled", BOOL, "false", "Whether ambient controller is enabled (ambient itself is not provided)"),
    ("ambient-enablement-selector", STR, "", "YAML list of ambient enablement selectors (written to the entry)"),
    ("ambient-dns-capture", BOOL, "false", "Ambient DNS capture (accepted, unused)"),
    ("ambient-ipv6", BOOL, "false", "Ambient IPv6 capture (accepted, unused)"),
    ("ambient-disable-safe-upgrade", BOOL, "false", "Ambient safe upgrade off (accepted, unused)"),
    ("ambient-reconcile-pod-rules-on-startup", BOOL, "false", "Ambient rule reconciliation (accepted, unused)"),
    ("enable-ambient-detection-retry", BOOL, "false",
     "Whether or not is ambient check is retried on error in the cni plugin"),
    ("native-nftables", BOOL, "false", "Use native nftables instead of iptables rules for traffic redirection"),
    ("repair-enabled", BOOL, str(_REPAIR.enabled).lower(), "Whether to enable race condition repair or not"),
    ("repair-delete-pods", BOOL, str(_REPAIR.delete_pods).lower(),
     "Controller will delete pods when detecting pod broken by race condition"),
    ("repair-repair-pods", BOOL, str(_REPAIR.repair_pods).lower(),
     "Controller will repair pods broken by race condition"),
    ("repair-label-pods", BOOL, str(_REPAIR.label_pods).lower(),
     "Controller will label pods when detecting pod broken by race condition"),
    ("repair-broken-pod-label-key", STR, _REPAIR.label_key,
     "The key portion of the label which will be set by the race repair if label pods is true"),
    ("repair-broken-pod-label-value", STR, _REPAIR.label_value,
     "The value portion of the label which will be set by the race repair if label pods is true"),
    ("repair-node-name", STR, _REPAIR.node_name, "The name of the managed node (will manage all nodes if unset)"),
    ("repair-sidecar-annotation", STR, _REPAIR.sidecar_annotation,
     "An annotation key that indicates this pod contains an istio sidecar"),
    ("repair-init-container-name", STR, _REPAIR.init_container_name,
     "The name of the istio init container (will crash-loop if CNI is not configured for the pod)"),
    ("repair-init-container-termination-message", STR, _REPAIR.init_container_termination_message,
     "The expected termination message for the init container when crash-looping because of CNI misconfiguration"),
    ("repair-init-container-exit-code", INT, str(_REPAIR.init_container_exit_code),
     "Expected exit code for the init container when crash-looping because of CNI misconfiguration"),
    ("repair-label-selectors", STR, _REPAIR.label_selectors,
     "A set of label selectors in label=value format that will be added to the pod list filters"),
    ("repair-field-selectors", STR, _REPAIR.field_selectors,
     "A set of field selectors in label=value format that will be added to the pod list filters"),
    # Ours (upstream hard-codes these for its container image).
    ("cni-bin-dir", STR, "/host/opt/cni/bin", "Where the istio-cni plugin executable is installed (not upstream)"),
    ("service-account-dir", STR, SERVICE_ACCOUNT_DIR,
     "The service-account directory: token, ca.crt, namespace (not upstream)"),
    ("readiness-port", INT, "8000", "Port of /healthz and /readyz (not upstream: upstream fixes 8000)"),
)
OURS = ("cni-bin-dir", "service-account-dir", "readiness-port")
# Read from the environment only, as upstream does.
KUBERNETES_ENV = ("KUBERNETES_SERVICE_PROTOCOL", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
                  "KUBERNETES_NODE_NAME")


def env_name(flag: str) -> str:
    return flag.upper().replace("-", "_")


class OptionsError(ValueError):
    """A flag or variable with a value install-cni cannot use (the message names both and the value)."""


@dataclass(frozen=True)
class InstallOptions:
    """Everything install-cni runs with, resolved once before anything starts."""

    mounted_cni_net_dir: str = "/host/etc/cni/net.d"
    cni_conf_name: str = ""
    chained_cni_plugin: bool = True
    cni_network_config: str = ""
    cni_network_config_file: str = ""
    istio_owned_cni_config: bool = False
    istio_owned_cni_config_filename: str = ""
    plugin_log_level: str = "info"
    cni_agent_run_dir: str = "/var/run/istio-cni"
    kubeconfig_mode: int = DEFAULT_KUBECONFIG_MODE
    cni_conf_group_read: bool = False
    kube_ca_file: str = ""
    skip_tls_verify: bool = False
    monitoring_port: int = 15014
    log_uds_socket: str = "/var/run/istio-cni/log.sock"
    ztunnel_uds_address: str = "/var/run/ztunnel/ztunnel.sock"
    exclude_namespaces: str = ""
    pod_namespace: str = ""
    ambient_enabled: bool = False
    ambient_enablement_selector: str = ""
    ambient_dns_capture: bool = False
    ambient_ipv6: bool = False
    ambient_disable_safe_upgrade: bool = False
    ambient_reconcile_pod_rules_on_startup: bool = False
    enable_ambient_detection_retry: bool = False
    native_nftables: bool = False
    cni_bin_dir: str = "/host/opt/cni/bin"
    service_account_dir: str = SERVICE_ACCOUNT_DIR
    readiness_port: int = 8000
    k8s_service_protocol: str = ""
    k8s_service_host: str = ""
    k8s_service_port: str = ""
    k8s_node_name: str = ""
    repair: RepairOptions = field(default_factory=RepairOptions)

    @property
    def cni_conf_mode(self) -> int:
        return CNI_CONF_MODE_GROUP_READ if self.cni_conf_group_read else CNI_CONF_MODE


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


def plugin_log_level(log_output_level: str) -> str:
    """The entry's plugin_log_level: the `cni-plugin` (or `all`) level of `--log_output_level`, as upstream
    takes it, else the scope's default, info. `--log-level`/`LOG_LEVEL` is accepted and not used: upstream
    declares it as the fallback and never reads it (its chart sets only --log_output_level)."""
    chosen = ""
    for part in filter(None, (p.strip() for p in log_output_level.split(","))):
        scope, sep, level = part.rpartition(":")
        if sep and scope in ("cni-plugin", "all"):
            chosen = level
    level = (chosen or "info").lower()
    if level not in LOG_LEVELS:
        raise OptionsError(f"invalid log level {level!r} for the CNI plugin (one of {', '.join(LOG_LEVELS)})")
    return level


def resolve_install_options(values: Mapping[str, str], env: Mapping[str, str], hostname: str,
                            log_output_level: str = "") -> InstallOptions:
    """Flag name -> raw text (from the command line or its variable; absent: the default), plus the
    KUBERNETES_* variables, into InstallOptions. `hostname` is KUBERNETES_NODE_NAME's default (upstream's)."""
    known = {name for name, *_ in FLAGS}
    unknown = sorted(set(values) - known)
    if unknown:
        raise OptionsError(f"unknown settings: {', '.join(unknown)}")
    parsed: dict[str, object] = {}
    for name, kind, default, _ in FLAGS:
        raw = values.get(name, default)
        where = f"--{name} (${env_name(name)})"
        try:
            if kind == BOOL:
                parsed[name] = parse_bool(raw.strip())
            elif kind == INT:
                parsed[name] = parse_go_int(raw)
            else:
                parsed[name] = raw
        except ValueError as exc:
            expected = "a boolean (true or false)" if kind == BOOL else "an integer"
            raise OptionsError(f"{where}: {raw!r} is not {expected} ({exc})") from None

    def text(name: str) -> str:
        return str(parsed[name])

    def flag(name: str) -> bool:
        return bool(parsed[name])

    def number(name: str) -> int:
        value = parsed[name]
        assert isinstance(value, int)
        return value

    mode = number("kubeconfig-mode")
    if not 0 <= mode <= 0o7777:
        raise OptionsError(f"--kubeconfig-mode ($KUBECONFIG_MODE): {values.get('kubeconfig-mode')!r} "
                           "is not a file mode")
    for port_flag in ("monitoring-port", "readiness-port"):
        if number(port_flag) > 65535:
            raise OptionsError(f"--{port_flag} (${env_name(port_flag)}): {number(port_flag)} is not a port")
    if number("readiness-port") < 0:
        raise OptionsError(f"--readiness-port: {number('readiness-port')} is not a port (0 disables it)")
    for dir_flag in ("mounted-cni-net-dir", "cni-agent-run-dir", "cni-bin-dir", "service-account-dir"):
        if not text(dir_flag):
            raise OptionsError(f"--{dir_flag} (${env_name(dir_flag)}) must not be empty")
    for name_flag in ("cni-conf-name", "istio-owned-cni-config-filename"):
        if "/" in text(name_flag):
            raise OptionsError(f"--{name_flag} (${env_name(name_flag)}): {text(name_flag)!r} must be a file name "
                               "inside the CNI net dir, not a path")
    istio_owned_name = text("istio-owned-cni-config-filename")
    if flag("istio-owned-cni-config") and not istio_owned_name:
        istio_owned_name = DEFAULT_ISTIO_OWNED_CNI_CONFIG_FILENAME
    run_dir = text("cni-agent-run-dir")
    repair = RepairOptions(
        enabled=flag("repair-enabled"), node_name=text("repair-node-name"),
        label_key=text("repair-broken-pod-label-key"), label_value=text("repair-broken-pod-label-value"),
        repair_pods=flag("repair-repair-pods"), delete_pods=flag("repair-delete-pods"),
        label_pods=flag("repair-label-pods"), sidecar_annotation=text("repair-sidecar-annotation"),
        init_container_name=text("repair-init-container-name"),
        init_container_termination_message=text("repair-init-container-termination-message"),
        init_container_exit_code=number("repair-init-container-exit-code"),
        label_selectors=text("repair-label-selectors"), field_selectors=text("repair-field-selectors"),
    )
    return InstallOptions(
        mounted_cni_net_dir=text("mounted-cni-net-dir"),
        cni_conf_name=text("cni-conf-name"),
        chained_cni_plugin=flag("chained-cni-plugin"),
        cni_network_config=text("cni-network-config"),
        cni_network_config_file=text("cni-network-config-file"),
        istio_owned_cni_config=flag("istio-owned-cni-config"),
        istio_owned_cni_config_filename=istio_owned_name,
        plugin_log_level=plugin_log_level(log_output_level),
        cni_agent_run_dir=run_dir,
        kubeconfig_mode=mode,
        cni_conf_group_read=flag("cni-conf-group-read"),
        kube_ca_file=text("kube-ca-file"),
        skip_tls_verify=flag("skip-tls-verify"),
        monitoring_port=number("monitoring-port"),
        log_uds_socket=text("log-uds-socket") or run_dir.rstrip("/") + "/" + LOG_SOCKET_NAME,
        ztunnel_uds_address=text("ztunnel-uds-address"),
        exclude_namespaces=text("exclude-namespaces"),
        pod_namespace=text("pod-namespace"),
        ambient_enabled=flag("ambient-enabled"),
        ambient_enablement_selector=text("ambient-enablement-selector"),
        ambient_dns_capture=flag("ambient-dns-capture"),
        ambient_ipv6=flag("ambient-ipv6"),
        ambient_disable_safe_upgrade=flag("ambient-disable-safe-upgrade"),
        ambient_reconcile_pod_rules_on_startup=flag("ambient-reconcile-pod-rules-on-startup"),
        enable_ambient_detection_retry=flag("enable-ambient-detection-retry"),
        native_nftables=flag("native-nftables"),
        cni_bin_dir=text("cni-bin-dir"),
        service_account_dir=text("service-account-dir"),
        readiness_port=number("readiness-port"),
        k8s_service_protocol=env.get("KUBERNETES_SERVICE_PROTOCOL", ""),
        k8s_service_host=env.get("KUBERNETES_SERVICE_HOST", ""),
        k8s_service_port=env.get("KUBERNETES_SERVICE_PORT", ""),
        k8s_node_name=env.get("KUBERNETES_NODE_NAME", "") or hostname,
        repair=repair,
    )

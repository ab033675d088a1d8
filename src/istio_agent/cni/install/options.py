"""install-cni's flags and environment -> one frozen `InstallOptions` (pure: values come in, nothing is read).

The flags, their variables and defaults are the program's table (`flags.py`);
here the raw text each was given (on the command line or by its variable) is
parsed and checked, and `InstallOptions` takes its defaults from the same
table. A bad value fails here, naming the flag, its variable and the value
(upstream's viper would silently read it as false or 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from istio_agent.cni.install.flags import (
    DEFAULT_KUBECONFIG_MODE,
    FLAGS,
    INSTALL_FLAGS,
    OUR_FLAGS,
    REPAIR_FLAGS,
    env_name,
    parse_go_int,
)
from istio_agent.cni.plugin.log import SOCKET_NAME
from istio_agent.cni.repair.options import RepairOptions
from istio_agent.config.settings import defaults

__all__ = ["DEFAULT_KUBECONFIG_MODE", "FLAGS", "InstallOptions", "OptionsError", "env_name", "parse_go_int",
           "plugin_log_level", "resolve_install_options"]

DEFAULT_ISTIO_OWNED_CNI_CONFIG_FILENAME = "02-istio-cni.conflist"
LOG_SOCKET_NAME = SOCKET_NAME  # the plugin posts its logs to <run dir>/log.sock
CNI_CONF_MODE = 0o600
CNI_CONF_MODE_GROUP_READ = 0o640
LOG_LEVELS = ("debug", "info", "warn", "error", "fatal", "none")
DEFAULT_PLUGIN_LOG_LEVEL = "info"  # the cni-plugin scope's default level

_DEFAULT = defaults((*INSTALL_FLAGS, *OUR_FLAGS))  # by InstallOptions field


def log_socket(run_dir: str) -> str:
    """Where the plugin posts its logs when `--log-uds-socket` is not given."""
    return run_dir.rstrip("/") + "/" + LOG_SOCKET_NAME


class OptionsError(ValueError):
    """A flag or variable with a value install-cni cannot use (the message names both and the value)."""


@dataclass(frozen=True)
class InstallOptions:
    """Everything install-cni runs with, resolved once before anything starts (defaults: the table's)."""

    mounted_cni_net_dir: str = _DEFAULT["mounted_cni_net_dir"]
    cni_conf_name: str = _DEFAULT["cni_conf_name"]
    chained_cni_plugin: bool = _DEFAULT["chained_cni_plugin"]
    cni_network_config: str = _DEFAULT["cni_network_config"]
    cni_network_config_file: str = _DEFAULT["cni_network_config_file"]
    istio_owned_cni_config: bool = _DEFAULT["istio_owned_cni_config"]
    istio_owned_cni_config_filename: str = _DEFAULT["istio_owned_cni_config_filename"]
    plugin_log_level: str = DEFAULT_PLUGIN_LOG_LEVEL
    cni_agent_run_dir: str = _DEFAULT["cni_agent_run_dir"]
    kubeconfig_mode: int = _DEFAULT["kubeconfig_mode"]
    cni_conf_group_read: bool = _DEFAULT["cni_conf_group_read"]
    kube_ca_file: str = _DEFAULT["kube_ca_file"]
    skip_tls_verify: bool = _DEFAULT["skip_tls_verify"]
    monitoring_port: int = _DEFAULT["monitoring_port"]
    log_uds_socket: str = _DEFAULT["log_uds_socket"] or log_socket(_DEFAULT["cni_agent_run_dir"])
    ztunnel_uds_address: str = _DEFAULT["ztunnel_uds_address"]
    exclude_namespaces: str = _DEFAULT["exclude_namespaces"]
    pod_namespace: str = _DEFAULT["pod_namespace"]
    ambient_enabled: bool = _DEFAULT["ambient_enabled"]
    ambient_enablement_selector: str = _DEFAULT["ambient_enablement_selector"]
    ambient_dns_capture: bool = _DEFAULT["ambient_dns_capture"]
    ambient_ipv6: bool = _DEFAULT["ambient_ipv6"]
    ambient_disable_safe_upgrade: bool = _DEFAULT["ambient_disable_safe_upgrade"]
    ambient_reconcile_pod_rules_on_startup: bool = _DEFAULT["ambient_reconcile_pod_rules_on_startup"]
    enable_ambient_detection_retry: bool = _DEFAULT["enable_ambient_detection_retry"]
    native_nftables: bool = _DEFAULT["native_nftables"]
    cni_bin_dir: str = _DEFAULT["cni_bin_dir"]
    service_account_dir: str = _DEFAULT["service_account_dir"]
    readiness_port: int = _DEFAULT["readiness_port"]
    k8s_service_protocol: str = ""
    k8s_service_host: str = ""
    k8s_service_port: str = ""
    k8s_node_name: str = ""
    repair: RepairOptions = field(default_factory=RepairOptions)

    @property
    def cni_conf_mode(self) -> int:
        return CNI_CONF_MODE_GROUP_READ if self.cni_conf_group_read else CNI_CONF_MODE


def plugin_log_level(log_output_level: str) -> str:
    """The entry's plugin_log_level: the `cni-plugin` (or `all`) level of `--log_output_level`, as upstream
    takes it, else the scope's default, info. `--log-level`/`LOG_LEVEL` is accepted and not used: upstream
    declares it as the fallback and never reads it (its chart sets only --log_output_level)."""
    chosen = ""
    for part in filter(None, (p.strip() for p in log_output_level.split(","))):
        scope, sep, level = part.rpartition(":")
        if sep and scope in ("cni-plugin", "all"):
            chosen = level
    level = (chosen or DEFAULT_PLUGIN_LOG_LEVEL).lower()
    if level not in LOG_LEVELS:
        raise OptionsError(f"invalid log level {level!r} for the CNI plugin (one of {', '.join(LOG_LEVELS)})")
    return level


def resolve_install_options(values: Mapping[str, str], env: Mapping[str, str], hostname: str,
                            log_output_level: str = "") -> InstallOptions:
    """Flag name -> raw text (from the command line or its variable; absent: the default), plus the
    KUBERNETES_* variables, into InstallOptions. `hostname` is KUBERNETES_NODE_NAME's default (upstream's)."""
    known = {flag.name for flag in FLAGS}
    unknown = sorted(set(values) - known)
    if unknown:
        raise OptionsError(f"unknown settings: {', '.join(unknown)}")
    parsed: dict[str, Any] = {}
    for flag in FLAGS:
        if flag.name not in values:
            parsed[flag.name] = flag.default
            continue
        raw = values[flag.name]
        try:
            parsed[flag.name] = flag.parse(raw)
        except ValueError as exc:
            expected = "a boolean (true or false)" if flag.type_name == "bool" else "an integer"
            raise OptionsError(f"--{flag.name} (${env_name(flag.name)}): {raw!r} is not {expected} ({exc})") from None

    def text(name: str) -> str:
        return str(parsed[name])

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
    settings = {flag.dest: parsed[flag.name] for flag in (*INSTALL_FLAGS, *OUR_FLAGS)}
    del settings["log_level"]  # accepted, unused: upstream declares it as the plugin level's fallback, never reads it
    if settings["istio_owned_cni_config"] and not settings["istio_owned_cni_config_filename"]:
        settings["istio_owned_cni_config_filename"] = DEFAULT_ISTIO_OWNED_CNI_CONFIG_FILENAME
    settings["log_uds_socket"] = settings["log_uds_socket"] or log_socket(settings["cni_agent_run_dir"])
    repair = RepairOptions(**{flag.dest: parsed[flag.name] for flag in REPAIR_FLAGS})
    return InstallOptions(
        **settings,
        plugin_log_level=plugin_log_level(log_output_level),
        k8s_service_protocol=env.get("KUBERNETES_SERVICE_PROTOCOL", ""),
        k8s_service_host=env.get("KUBERNETES_SERVICE_HOST", ""),
        k8s_service_port=env.get("KUBERNETES_SERVICE_PORT", ""),
        k8s_node_name=env.get("KUBERNETES_NODE_NAME", "") or hostname,
        repair=repair,
    )


def _check_table() -> None:
    """Every flag of the table lands in a field (a flag added to `flags.py` without one fails at import)."""
    names = {f.name for f in fields(InstallOptions)} | {"log_level"}
    missing = [flag.name for flag in (*INSTALL_FLAGS, *OUR_FLAGS) if flag.dest not in names]
    missing += [flag.name for flag in REPAIR_FLAGS if flag.dest not in {f.name for f in fields(RepairOptions)}]
    if missing:
        raise RuntimeError(f"install-cni flags without an option field: {', '.join(missing)}")


_check_table()

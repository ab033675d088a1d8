"""The plugin's own fields of the network config (upstream's `plugin.Config`), type-checked, naming the field.

Field names, types and zero values are upstream's; JSON `null` reads as the
zero value, as Go's decoder does. A value of the wrong type is an invalid
network config (code 7) naming the field, rather than upstream's generic
decoding error.
"""

from __future__ import annotations

import json

from istio_agent.cni.plugin.protocol import ERR_INVALID_NETWORK_CONFIG, CniError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

LOG_LEVELS = ("none", "error", "warn", "info", "debug")  # an unknown level logs at info, with a warning


class PluginConfig:
    """Istio's settings in the chained plugin's entry (install-cni writes them into the conflist)."""

    __slots__ = ("ambient_enabled", "cni_agent_run_dir", "enable_ambient_detection_retry", "enablement_selectors",
                 "exclude_namespaces", "native_nftables", "plugin_log_level", "pod_namespace")

    def __init__(self, plugin_log_level: str = "", cni_agent_run_dir: str = "", ambient_enabled: bool = False,
                 enablement_selectors: list[object] | None = None, exclude_namespaces: list[str] | None = None,
                 pod_namespace: str = "", native_nftables: bool = False,
                 enable_ambient_detection_retry: bool = False) -> None:
        self.plugin_log_level = plugin_log_level
        self.cni_agent_run_dir = cni_agent_run_dir
        self.ambient_enabled = ambient_enabled
        self.enablement_selectors = enablement_selectors or []
        self.exclude_namespaces = exclude_namespaces or []
        self.pod_namespace = pod_namespace
        self.native_nftables = native_nftables
        self.enable_ambient_detection_retry = enable_ambient_detection_retry


def _bad(field: str, value: object, expected: str) -> CniError:
    return CniError(ERR_INVALID_NETWORK_CONFIG,
                    f"invalid network config: {field} must be {expected}, got {json.dumps(value)[:200]}")


def _str(config: Mapping[str, object], field: str) -> str:
    value = config.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _bad(field, value, "a string")
    return value


def _bool(config: Mapping[str, object], field: str) -> bool:
    value = config.get(field)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(field, value, "true or false")
    return value


def parse_plugin_config(config: Mapping[str, object]) -> PluginConfig:
    """Upstream's fields of `config`; CniError(7) naming the first one of the wrong type."""
    if not isinstance(config.get("type", ""), str):
        raise _bad("type", config["type"], "a string")
    namespaces = config.get("exclude_namespaces")
    if namespaces is None:
        namespaces = []
    if not isinstance(namespaces, list) or not all(isinstance(n, str) for n in namespaces):
        raise _bad("exclude_namespaces", namespaces, "a list of strings")
    selectors = config.get("enablement_selectors")
    if selectors is None:
        selectors = []
    if not isinstance(selectors, list) or not all(isinstance(s, dict) for s in selectors):
        raise _bad("enablement_selectors", selectors, "a list of objects")
    return PluginConfig(
        plugin_log_level=_str(config, "plugin_log_level"),
        cni_agent_run_dir=_str(config, "cni_agent_run_dir"),
        ambient_enabled=_bool(config, "ambient_enabled"),
        enablement_selectors=list(selectors),
        exclude_namespaces=list(namespaces),
        pod_namespace=_str(config, "pod_namespace"),
        native_nftables=_bool(config, "native_nftables"),
        enable_ambient_detection_retry=_bool(config, "enable_ambient_detection_retry"),
    )

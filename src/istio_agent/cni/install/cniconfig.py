"""The CNI network-config rules of install-cni, as pure functions on text and dicts (no I/O).

What upstream's installer decides, stated once (SPEC.md "Istio CNI" and the
`cni-install` conformance kit):

- the `istio-cni` plugin entry is built from the settings, in a fixed key order
  (`plugin_entry`);
- the primary file in chained mode is the configured name (or the same name
  with the other CNI extension), else the lexically first `.conf`/`.conflist`
  that parses as a network config the way libcni loads it (`primary_candidates`,
  `resolve_primary`);
- the entry is merged into it: a single-plugin file is wrapped in a list, an
  old `istio-cni` entry is replaced, the entry loses its `cniVersion`
  (`insert_plugin_entry`); a `.conf` target becomes a `.conflist`;
- with Istio-owned mode (chained + ambient + istio-owned) the merge goes to a
  separate file and the primary is left alone;
- cleanup removes our entry from a file we merged into, or deletes a file that
  is ours (`remove_plugin_entry`, `cleanup_deletes_file`);
- every merged file is Go's indented JSON with sorted keys and a trailing
  newline (`gojson`).

The file edge (`installer.py`) reads the directory into a `Listing` and
performs the `ConfigWrite` that `plan_config_write` returns. Every text is
read with limits (the edge's size limit, `jsonlimits.MAX_DEPTH` for nesting):
a file past them is a problem named in the error, never a crash. A file too
large to read that sorts before every valid one may be what the runtime
loads, so install-cni waits (not ready, the reason logged) rather than merge
into another file the runtime would not use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from istio_agent.cni.jsonlimits import loads as load_json
from istio_agent.gojson import dumps as go_marshal_indent

PLUGIN_TYPE = "istio-cni"
STANDALONE_DEFAULT_NAME = "YYY-istio-cni.conf"
WRAPPED_LIST_NAME = "k8s-pod-network"
ENTRY_CNI_VERSION = "0.3.1"
CNI_EXTENSIONS = (".conf", ".conflist")


class CniConfigError(ValueError):
    """A network config (ours or the node's) that cannot be used; the message names the file or the field."""


@dataclass(frozen=True)
class PluginSettings:
    """The install options that end up in the `istio-cni` entry (upstream's plugin.Config fields)."""

    plugin_log_level: str = "info"
    cni_agent_run_dir: str = "/var/run/istio-cni"
    ambient_enabled: bool = False
    enablement_selectors: tuple[Any, ...] = ()
    exclude_namespaces: str = ""
    pod_namespace: str = ""
    native_nftables: bool = False
    enable_ambient_detection_retry: bool = False


@dataclass(frozen=True)
class ConfigSettings:
    """Where the entry goes: the install options that choose and shape the CNI config file."""

    cni_conf_name: str = ""
    chained_cni_plugin: bool = True
    ambient_enabled: bool = False
    istio_owned_cni_config: bool = False
    istio_owned_cni_config_filename: str = ""

    @property
    def istio_owned(self) -> bool:
        """Upstream's useIstioOwnedCNIConfig: the separate file is used only when chained, ambient and asked for."""
        return self.istio_owned_cni_config and self.chained_cni_plugin and self.ambient_enabled


def split_exclude_namespaces(text: str) -> list[str] | None:
    """Comma-split, trimmed, empties dropped; nothing gives None (JSON null, as Go's nil slice)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    return names or None


def _label_selector(value: Any, where: str) -> dict[str, Any]:
    """A metav1.LabelSelector as Go marshals it: matchLabels (sorted) and matchExpressions, both omitted if empty."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CniConfigError(f"{where}: a label selector must be a mapping, got {type(value).__name__}")
    out: dict[str, Any] = {}
    labels = value.get("matchLabels") or {}
    if not isinstance(labels, dict):
        raise CniConfigError(f"{where}.matchLabels must be a mapping")
    if labels:
        out["matchLabels"] = {str(k): str(labels[k]) for k in sorted(labels, key=str)}
    expressions = value.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise CniConfigError(f"{where}.matchExpressions must be a list")
    converted = []
    for index, expression in enumerate(expressions):
        if not isinstance(expression, dict):
            raise CniConfigError(f"{where}.matchExpressions[{index}] must be a mapping")
        item: dict[str, Any] = {"key": str(expression.get("key", "")), "operator": str(expression.get("operator", ""))}
        values = expression.get("values") or []
        if values:
            item["values"] = [str(v) for v in values]
        converted.append(item)
    if converted:
        out["matchExpressions"] = converted
    return out


def parse_enablement_selectors(text: str) -> tuple[Any, ...]:
    """`--ambient-enablement-selector` (a YAML list of {podSelector, namespaceSelector}) as the entry carries it."""
    if not text.strip():
        return ()
    import yaml  # only when a selector is set (ambient)

    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CniConfigError(f"ambient-enablement-selector: not YAML: {exc}") from None
    if loaded is None:
        return ()
    if not isinstance(loaded, list):
        raise CniConfigError(f"ambient-enablement-selector: expected a list, got {type(loaded).__name__}")
    selectors = []
    for index, item in enumerate(loaded):
        where = f"ambient-enablement-selector[{index}]"
        if not isinstance(item, dict):
            raise CniConfigError(f"{where}: expected a mapping, got {type(item).__name__}")
        selectors.append({"podSelector": _label_selector(item.get("podSelector"), where + ".podSelector"),
                          "namespaceSelector": _label_selector(item.get("namespaceSelector"),
                                                               where + ".namespaceSelector")})
    return tuple(selectors)


def plugin_entry(settings: PluginSettings) -> dict[str, Any]:
    """The `istio-cni` entry, keys in upstream's struct order."""
    return {
        "cniVersion": ENTRY_CNI_VERSION,
        "name": PLUGIN_TYPE,
        "type": PLUGIN_TYPE,
        "ipam": {},
        "dns": {},
        "plugin_log_level": settings.plugin_log_level,
        "cni_agent_run_dir": settings.cni_agent_run_dir,
        "ambient_enabled": settings.ambient_enabled,
        "enablement_selectors": list(settings.enablement_selectors),
        "exclude_namespaces": split_exclude_namespaces(settings.exclude_namespaces),
        "pod_namespace": settings.pod_namespace,
        "native_nftables": settings.native_nftables,
        "enable_ambient_detection_retry": settings.enable_ambient_detection_retry,
    }


def standalone_text(entry: Mapping[str, Any]) -> str:
    """The entry as the standalone file (struct order kept)."""
    return go_marshal_indent(dict(entry), sort_keys=False) + "\n"


def marshal_config(config: Mapping[str, Any]) -> str:
    """A merged config file's text: Go's MarshalIndent of a map (sorted keys) plus a newline."""
    return go_marshal_indent(dict(config), sort_keys=True) + "\n"


def _load_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = load_json(text)  # nesting limited: a deep file is a JSON error naming the limit, not a crash
    except ValueError as exc:
        raise CniConfigError(f"error loading {what} (JSON error): {exc}") from None
    if not isinstance(value, dict):
        raise CniConfigError(f"error loading {what} (JSON error): expected an object, got {type(value).__name__}")
    return value


def _plugins(config: Mapping[str, Any], what: str) -> list[Any]:
    plugins = config.get("plugins")
    if not isinstance(plugins, list):
        raise CniConfigError(f"{what}: error reading plugin list from CNI config")
    for plugin in plugins:
        if not isinstance(plugin, dict):
            raise CniConfigError(f"{what}: error reading plugin from CNI config plugin list")
    return plugins


def insert_plugin_entry(entry: Mapping[str, Any] | str, existing_text: str) -> dict[str, Any]:
    """Merge our entry into an existing network config (upstream's insertCNIConfig); the result as a dict."""
    istio = dict(entry) if isinstance(entry, Mapping) else _load_object(entry, "Istio CNI config")
    existing = _load_object(existing_text, "existing CNI config")
    istio.pop("cniVersion", None)
    if "type" in existing:
        existing.pop("cniVersion", None)
        return {"cniVersion": ENTRY_CNI_VERSION, "name": WRAPPED_LIST_NAME, "plugins": [existing, istio]}
    plugins = list(_plugins(existing, "existing CNI config"))
    for index, plugin in enumerate(plugins):
        if plugin.get("type") == PLUGIN_TYPE:
            del plugins[index]
            break
    existing["plugins"] = [*plugins, istio]
    return existing


def remove_plugin_entry(text: str, what: str = "CNI config") -> dict[str, Any]:
    """The config without its (first) `istio-cni` entry (upstream's Cleanup of a chained file)."""
    config = _load_object(text, what)
    plugins = list(_plugins(config, what))
    for index, plugin in enumerate(plugins):
        if plugin.get("type") == PLUGIN_TYPE:
            del plugins[index]
            break
    config["plugins"] = plugins
    return config


def cleanup_deletes_file(settings: ConfigSettings, written: str) -> bool:
    """Whether cleanup deletes the file we wrote rather than taking our entry out of it.

    Standalone: the file is ours. Istio-owned: the separate file is ours. Upstream decides the latter
    from the istio-owned flag alone, which would delete the node's primary file when the flag is set
    without ambient (the merge then went into the primary); here the written file must also be the
    Istio-owned one.
    """
    if not settings.chained_cni_plugin:
        return True
    return settings.istio_owned_cni_config and written == settings.istio_owned_cni_config_filename


def plugin_types(text: str) -> list[str] | None:
    """The plugin types of a list config, None when it is no usable list."""
    try:
        config = _load_object(text, "CNI config")
        plugins = _plugins(config, "CNI config")
    except CniConfigError:
        return None
    return [str(plugin.get("type")) for plugin in plugins]


def has_plugin_entry(text: str) -> bool:
    return PLUGIN_TYPE in (plugin_types(text) or [])


def _string_field(config: Mapping[str, Any], key: str, where: str) -> str:
    value = config.get(key, "")
    if not isinstance(value, str):
        raise CniConfigError(f"{where}: '{key}' must be a string, got {type(value).__name__}")
    return value


def _check_network(config: Mapping[str, Any], where: str) -> None:
    """libcni's ConfFromBytes: the NetConf fields it types, and a non-empty `type`."""
    for key in ("cniVersion", "name", "type"):
        _string_field(config, key, where)
    if not _string_field(config, "type", where):
        raise CniConfigError(f"{where}: missing 'type'")


def validate_network_file(name: str, text: str) -> str | None:
    """Why libcni (and so the runtime) would not load this file as a network config; None when it would."""
    try:
        config = _load_object(text, name)
        if name.endswith(".conflist"):
            if not isinstance(config.get("name"), str):
                return f"{name}: error parsing configuration list: no name"
            version = config.get("cniVersion", "")
            if not isinstance(version, str):
                return f"{name}: error parsing configuration list: invalid cniVersion type"
            plugins = config.get("plugins")
            if plugins is None:
                return f"{name}: error parsing configuration list: no 'plugins' key"
            if not isinstance(plugins, list):
                return f"{name}: error parsing configuration list: invalid 'plugins' type"
            if not plugins:
                return f"{name}: error parsing configuration list: no plugins in list"
            for index, plugin in enumerate(plugins):
                if not isinstance(plugin, dict):
                    return f"{name}: plugin {index} is not an object"
                _check_network(plugin, f"{name}: plugin {index}")
        else:
            if not config.get("type"):
                return f"{name}: no 'type'; perhaps this is a .conflist?"
            _check_network(config, name)
    except CniConfigError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class Listing:
    """What the edge read of the net dir: file name -> text, for regular files (None: present but not read).

    `problems` says why a file was not read (default: unreadable); `oversized` names those too large to read.
    """

    files: Mapping[str, str | None] = field(default_factory=dict)
    problems: Mapping[str, str] = field(default_factory=dict)
    oversized: frozenset[str] = frozenset()

    def exists(self, name: str) -> bool:
        return name in self.files

    def text(self, name: str) -> str | None:
        return self.files.get(name)

    def problem(self, name: str) -> str:
        """Why `name` has no text: `name: reason`."""
        return f"{name}: {self.problems.get(name, 'unreadable')}"


def primary_candidates(listing: Listing, exclude: str = "") -> tuple[list[str], list[str]]:
    """Valid network files in lexical order (what the runtime would load first), and why the others are not."""
    valid: list[str] = []
    problems: list[str] = []
    for name in sorted(listing.files):
        if not name.endswith(CNI_EXTENSIONS) or name == exclude:
            continue
        text = listing.text(name)
        reason = listing.problem(name) if text is None else validate_network_file(name, text)
        if reason is None:
            valid.append(name)
        else:
            problems.append(reason)
    return valid, problems


def resolve_named(listing: Listing, name: str) -> str | None:
    """A configured name, or the same name with the other CNI extension, whichever exists."""
    if listing.exists(name):
        return name
    if name.endswith(".conf") and listing.exists(name + "list"):
        return name + "list"
    if name.endswith(".conflist") and listing.exists(name[: -len("list")]):
        return name[: -len("list")]
    return None


@dataclass(frozen=True)
class Waiting:
    """Chained mode and no primary config yet: install waits for the directory to change.

    `unread` names a file too large to read that may be the runtime's choice: an entry merged elsewhere
    before it appeared is then not in effect either.
    """

    reason: str
    unread: str | None = None


@dataclass(frozen=True)
class ConfigWrite:
    """One write the edge performs: `text` to `target`, then (for a merged `.conf`) a rename to `rename_to`.

    `source` is the primary file read for the merge (None in standalone mode); `keep_source_mode` says
    the written file takes the source's permissions (a merge in place) rather than the configured mode.
    `source_had_entry` tells cleanup the original bytes already held an `istio-cni` entry.
    """

    target: str
    text: str
    source: str | None
    rename_to: str | None
    keep_source_mode: bool
    source_had_entry: bool = False

    @property
    def final_name(self) -> str:
        return self.rename_to or self.target


def resolve_primary(settings: ConfigSettings, listing: Listing) -> str | Waiting:
    """The primary config to merge into (chained mode), or why we wait."""
    owned = settings.istio_owned_cni_config_filename if settings.istio_owned else ""
    if settings.cni_conf_name:
        found = resolve_named(listing, settings.cni_conf_name)
        if found is None or (owned and found == owned):
            return Waiting(f"CNI config file {settings.cni_conf_name} does not exist")
        return found
    valid, problems = primary_candidates(listing, exclude=owned)
    unread = sorted(n for n in listing.oversized if n.endswith(CNI_EXTENSIONS) and n != owned)
    if unread and (not valid or unread[0] < valid[0]):  # it may be the file the runtime loads first
        return Waiting(f"{listing.problem(unread[0])}; the runtime may load it before any file install-cni can "
                       "merge into", unread[0])
    if not valid:
        detail = f" ({'; '.join(problems)})" if problems else ""
        return Waiting(f"no valid networks found{detail}")
    return valid[0]


def plan_config_write(settings: ConfigSettings, listing: Listing, entry: Mapping[str, Any]) -> ConfigWrite | Waiting:
    """What to write for our entry to be in effect (upstream's createCNIConfigFile/writeCNIConfig)."""
    if not settings.chained_cni_plugin:
        return ConfigWrite(settings.cni_conf_name or STANDALONE_DEFAULT_NAME, standalone_text(entry), None, None,
                           keep_source_mode=False)
    primary = resolve_primary(settings, listing)
    if isinstance(primary, Waiting):
        return primary
    existing = listing.text(primary)
    if existing is None:
        raise CniConfigError(listing.problem(primary))
    merged = marshal_config(insert_plugin_entry(entry, existing))
    if settings.istio_owned:
        target = settings.istio_owned_cni_config_filename
        rename = target + "list" if target.endswith(".conf") else None
        return ConfigWrite(target, merged, primary, rename, keep_source_mode=False)
    rename = primary + "list" if primary.endswith(".conf") else None
    return ConfigWrite(primary, merged, primary, rename, keep_source_mode=True,
                       source_had_entry=has_plugin_entry(existing) or _is_single_istio(existing))


def _is_single_istio(text: str) -> bool:
    try:
        return _load_object(text, "CNI config").get("type") == PLUGIN_TYPE
    except CniConfigError:
        return False


def check_installed(settings: ConfigSettings, listing: Listing, written: str | None) -> str | None:
    """Why our config is not (or no longer) in effect; None when it is (upstream's checkValidCNIConfig).

    `written` is the file our last write produced (None before the first one: the first check
    always asks for a write, as upstream's does).
    """
    if written is None:
        return "initial installation"
    if not listing.exists(written):
        return f"CNI config file removed: {written}"
    text = listing.text(written) or ""
    if not primary_candidates(listing)[0]:  # e.g. our file under a name no runtime loads (`x.json`, or a standalone
        return "no valid networks found in the CNI net dir"  # body named `.conflist`): upstream's first check
    if not settings.chained_cni_plugin:
        try:
            if _load_object(text, written).get("type") != PLUGIN_TYPE:
                return f"istio-cni CNI config file modified: {written}"
        except CniConfigError as exc:
            return str(exc)
        return None
    types = plugin_types(text)
    if types is None:
        return f"{written}: not a CNI config list any more"
    if PLUGIN_TYPE not in types:
        return f"istio-cni plugin not found in CNI config at {written}"
    owned = settings.istio_owned_cni_config_filename if settings.istio_owned else ""
    primary = resolve_primary(settings, listing)
    if isinstance(primary, Waiting):
        return None if not owned and primary.unread is None else primary.reason
    if owned:
        valid, _ = primary_candidates(listing)
        if valid and valid[0] != owned:
            return f"istio owned CNI config does not exist or is not the highest priority. Got {valid[0]} instead"
        primary_types = plugin_types(listing.text(primary) or "") or _single_type(listing.text(primary) or "")
        missing = [t for t in primary_types if t not in types]
        if missing:
            return f"plugin of type {missing[0]} from primary CNI config is missing in Istio CNI config file"
        return None
    if not settings.cni_conf_name and primary != written:
        return f"CNI config file {written} preempted by {primary}"
    return None


def _single_type(text: str) -> list[str]:
    try:
        value = _load_object(text, "CNI config").get("type")
    except CniConfigError:
        return []
    return [str(value)] if value else []

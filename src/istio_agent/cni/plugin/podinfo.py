"""From the Pod object to a decision (skip, and why) and to the capture settings, sans-IO.

Upstream's rules (`cni/pkg/plugin/plugin.go`, `kubernetes.go`,
`sidecar_redirect.go`):

- skip a pod with an `istio-init` container (it captures itself), with
  `DISABLE_ENVOY=true` on `istio-proxy`, without an `istio-proxy` container,
  whose proxy is not a sidecar (`proxy router` ...), with the inject label
  (preferred) or annotation set to false, or without `sidecar.istio.io/status`;
- otherwise each redirect setting comes from its annotation or upstream's
  default, the uid/gid from the proxy's securityContext (0 counts as unset),
  DNS capture / invalid drop / dual stack from the proxy's env.

Every value is then checked by the capture code's strict validation; a
rejected value is reported under the annotation (or env, or securityContext
field) it came from, so `excludeInterfaces: "eth0 -j ACCEPT"` fails ADD
naming `traffic.sidecar.istio.io/excludeInterfaces` before any rule exists.
"""

from __future__ import annotations

from istio_agent.capture.config import CaptureConfig
from istio_agent.capture.flags import ENV_ONLY
from istio_agent.capture.validation import ConfigError, validate
from istio_agent.config.gobool import parse_bool

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

ISTIO_INIT = "istio-init"
ISTIO_PROXY = "istio-proxy"
INJECT = "sidecar.istio.io/inject"
STATUS = "sidecar.istio.io/status"
INTERCEPTION_MODE = "sidecar.istio.io/interceptionMode"
INCLUDE_OUTBOUND_IP_RANGES = "traffic.sidecar.istio.io/includeOutboundIPRanges"
EXCLUDE_OUTBOUND_IP_RANGES = "traffic.sidecar.istio.io/excludeOutboundIPRanges"
INCLUDE_INBOUND_PORTS = "traffic.sidecar.istio.io/includeInboundPorts"
EXCLUDE_INBOUND_PORTS = "traffic.sidecar.istio.io/excludeInboundPorts"
INCLUDE_OUTBOUND_PORTS = "traffic.sidecar.istio.io/includeOutboundPorts"
EXCLUDE_OUTBOUND_PORTS = "traffic.sidecar.istio.io/excludeOutboundPorts"
EXCLUDE_INTERFACES = "traffic.sidecar.istio.io/excludeInterfaces"
KUBEVIRT_INTERFACES = "traffic.sidecar.istio.io/kubevirtInterfaces"  # deprecated spelling
REROUTE_VIRTUAL_INTERFACES = "istio.io/reroute-virtual-interfaces"
ALWAYS_EXCLUDED_INBOUND = "15020,15021,15090"  # appended to every inbound exclusion, as upstream does
DEFAULT_UID = "1337"


class PodError(ValueError):
    """The pod cannot be captured as asked: names the annotation, env or field and the value."""

    def __init__(self, source: str, value: object, reason: str) -> None:
        super().__init__(f"invalid {source} {value!r}: {reason}; nothing was applied")
        self.source = source
        self.value = value
        self.reason = reason


class PodInfo:
    """What upstream's ExtractPodInfo keeps of a Pod."""

    __slots__ = ("annotations", "containers", "labels", "proxy_env", "proxy_gid", "proxy_type", "proxy_uid")

    def __init__(self, containers: set[str], labels: dict[str, str], annotations: dict[str, str],
                 proxy_type: str = "", proxy_env: dict[str, str] | None = None,
                 proxy_uid: int | None = None, proxy_gid: int | None = None) -> None:
        self.containers = containers
        self.labels = labels
        self.annotations = annotations
        self.proxy_type = proxy_type
        self.proxy_env = proxy_env or {}
        self.proxy_uid = proxy_uid
        self.proxy_gid = proxy_gid


def _str_map(obj: object, where: str) -> dict[str, str]:
    if obj is None:
        return {}
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items()):
        raise PodError(where, obj, "expected a map of strings")
    return dict(obj)


def _id(ctx: Mapping[str, object], key: str) -> int | None:
    value = ctx.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise PodError(f"istio-proxy securityContext.{key}", value, "expected an integer")
    return value


def extract_pod_info(pod: Mapping[str, object]) -> PodInfo:
    """Containers (init ones first, as upstream lists them), labels, annotations and the istio-proxy facts."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        raise PodError("pod", "metadata/spec", "expected objects")
    info = PodInfo(set(), _str_map(metadata.get("labels"), "metadata.labels"),
                   _str_map(metadata.get("annotations"), "metadata.annotations"))
    for kind in ("initContainers", "containers"):
        containers = spec.get(kind) or []
        if not isinstance(containers, list):
            raise PodError(f"spec.{kind}", containers, "expected a list")
        for container in containers:
            if not isinstance(container, dict) or not isinstance(container.get("name"), str):
                raise PodError(f"spec.{kind}", container, "expected containers with a name")
            name = container["name"]
            info.containers.add(name)
            if name != ISTIO_PROXY:
                continue
            for entry in container.get("env") or []:
                if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                    value = entry.get("value", "")
                    info.proxy_env[entry["name"]] = value if isinstance(value, str) else ""
            args = container.get("args") or []
            if isinstance(args, list) and len(args) >= 2 and args[0] == "proxy" and isinstance(args[1], str):
                info.proxy_type = args[1]
            ctx = container.get("securityContext")
            if isinstance(ctx, dict):
                info.proxy_uid = _id(ctx, "runAsUser")
                info.proxy_gid = _id(ctx, "runAsGroup")
    return info


def _go_bool(text: str) -> bool | None:
    try:
        return parse_bool(text)
    except ValueError:
        return None


def skip_reason(info: PodInfo) -> str | None:
    """Why upstream leaves this pod alone (None: it is an injected sidecar pod and gets capture)."""
    if ISTIO_INIT in info.containers:
        return "excluded due to being already injected with istio-init container"
    if _go_bool(info.proxy_env.get("DISABLE_ENVOY", "")):
        return "excluded due to DISABLE_ENVOY on istio-proxy"
    if ISTIO_PROXY not in info.containers:
        return f"excluded because it does not have istio-proxy container (have {sorted(info.containers)})"
    if info.proxy_type not in ("", "sidecar"):
        return f"excluded because it has proxy type {info.proxy_type}"
    inject = info.labels.get(INJECT, info.annotations.get(INJECT, ""))
    if inject and _go_bool(inject) is False:
        return "excluded due to inject-disabled annotation"
    if STATUS not in info.annotations:
        return "excluded due to not containing sidecar annotation"
    return None


def _ports(text: str) -> str:
    """Upstream parses port lists with spaces trimmed; the rules get the trimmed items."""
    text = text.strip()
    return text if text == "*" else _items(text)


def _items(text: str) -> str:
    """A comma list with spaces around items trimmed (upstream validates interface lists that way)."""
    return ",".join(item.strip() for item in text.split(",")) if text.strip() else ""


class Setting:
    """One capture setting, where it came from and, for an annotation, its text as written (for error messages:
    the user is shown what they wrote, not the trimmed or merged value the rules get)."""

    __slots__ = ("source", "value", "written")

    def __init__(self, value: str, source: str, written: str | None = None) -> None:
        self.value = value
        self.source = source
        self.written = value if written is None else written


def _annotation(info: PodInfo, key: str, default: str, clean: Callable[[str], str] | None = None) -> Setting:
    if key in info.annotations:
        value = info.annotations[key]
        return Setting(clean(value) if clean else value, f"annotation {key}", value)
    return Setting(default, f"default of {key}")


def _go_port(item: str) -> bool:
    """strconv.ParseUint(strings.TrimSpace(item), 10, 16) succeeds (a leading zero and 0 itself included)."""
    text = item.strip()
    return text.isascii() and text.isdigit() and int(text) <= 65535


def _upstream_port_list(value: str) -> str | None:
    """Why upstream's validatePortListWithWildcard refuses `value` (None: it does not): `*` exactly, or a list
    trimmed as a whole whose every item parses as a port once trimmed (so `80,` and ` * ` are refused)."""
    if value == "*" or not value.strip():
        return None
    for item in value.strip().split(","):
        if not _go_port(item):
            return f"{item!r} is not a port number (0-65535) or the list '*'"
    return None


def _upstream_cidr_list(value: str, wildcard: bool) -> str | None:
    """Why upstream's validateCIDRList(WithWildcard) refuses `value`: every item, untrimmed, a prefix
    netip.ParsePrefix takes (an empty item, `80,` or a bare address included, is refused)."""
    from istio_agent.capture.addr import parse_prefix

    if (wildcard and value == "*") or not value:
        return None
    for item in value.split(","):
        try:
            parse_prefix(item)
        except ValueError as err:
            return f"{item!r} is not a CIDR: {err}"
    return None


def _upstream_interfaces(value: str) -> str | None:
    """Why upstream's ValidateInterfaceNames refuses `value`: each trimmed item 1-15 characters, a letter then
    letters, digits, `_`, `.` or `-` (so neither iptables' `+` wildcard nor an empty item)."""
    if not value:
        return None
    for item in value.split(","):
        name = item.strip()
        if not name or len(name) > 15 or not (name[0].isascii() and name[0].isalpha()) or not all(
                c.isascii() and (c.isalnum() or c in "_.-") for c in name):
            return f"{name!r} is not an interface name upstream accepts ([a-zA-Z][a-zA-Z0-9_.-]*, at most 15)"
    return None


# Upstream's NewRedirect validates these annotations, in this order, before anything else (the capture code's
# stricter checks follow); a value it refuses fails ADD there, so it must here too.
_UPSTREAM_CHECKS: tuple[tuple[str, Callable[[str], str | None]], ...] = (
    (INCLUDE_OUTBOUND_IP_RANGES, lambda v: _upstream_cidr_list(v, wildcard=True)),
    (EXCLUDE_OUTBOUND_IP_RANGES, lambda v: _upstream_cidr_list(v, wildcard=False)),
    (EXCLUDE_INBOUND_PORTS, _upstream_port_list),
    (INCLUDE_INBOUND_PORTS, _upstream_port_list),
    (EXCLUDE_OUTBOUND_PORTS, _upstream_port_list),
    (INCLUDE_OUTBOUND_PORTS, _upstream_port_list),
    (EXCLUDE_INTERFACES, _upstream_interfaces),
)


def upstream_annotation_checks(info: PodInfo) -> None:
    """PodError for the first annotation upstream's validators refuse (the interception mode is checked first,
    by `redirect_settings`; the virtual interfaces last: `reroute-virtual-interfaces` when set, else the
    deprecated `kubevirtInterfaces`)."""
    virtual = REROUTE_VIRTUAL_INTERFACES if REROUTE_VIRTUAL_INTERFACES in info.annotations else KUBEVIRT_INTERFACES
    for key, check in (*_UPSTREAM_CHECKS, (virtual, _upstream_interfaces)):
        if key in info.annotations:
            reason = check(info.annotations[key])
            if reason is not None:
                raise PodError(f"annotation {key}", info.annotations[key], reason)


def redirect_settings(info: PodInfo, warn: Callable[[str], None]) -> dict[str, Setting]:
    """The CaptureConfig fields upstream's NewRedirect derives, each with its source."""
    mode = _annotation(info, INTERCEPTION_MODE, "REDIRECT")
    if mode.value not in ("REDIRECT", "TPROXY"):
        raise PodError(mode.source, mode.value, "interceptionMode must be REDIRECT or TPROXY")
    upstream_annotation_checks(info)
    for key in (INCLUDE_INBOUND_PORTS, EXCLUDE_OUTBOUND_PORTS, INCLUDE_OUTBOUND_PORTS):
        value = info.annotations.get(key, "")
        if value and not value.strip():  # upstream hands it on as written: `--dport  ` rules iptables refuses
            raise PodError(f"annotation {key}", value, "a blank port list (upstream's rules for it would not load)")
    settings = {
        "inbound_interception_mode": mode,
        "outbound_ip_ranges_include": _annotation(info, INCLUDE_OUTBOUND_IP_RANGES, "*"),
        "outbound_ip_ranges_exclude": _annotation(info, EXCLUDE_OUTBOUND_IP_RANGES, ""),
        "inbound_ports_include": _annotation(info, INCLUDE_INBOUND_PORTS, "*", _ports),
        "outbound_ports_exclude": _annotation(info, EXCLUDE_OUTBOUND_PORTS, "15020", _ports),
        "outbound_ports_include": _annotation(info, INCLUDE_OUTBOUND_PORTS, "", _ports),
        "exclude_interfaces": _annotation(info, EXCLUDE_INTERFACES, "", _items),
    }
    excluded = _annotation(info, EXCLUDE_INBOUND_PORTS, "15020", _ports)
    if excluded.value == "*":
        raise PodError(excluded.source, "*", "a wildcard cannot be combined with the always-excluded ports")
    merged: list[str] = []
    for port in [*excluded.value.split(","), *ALWAYS_EXCLUDED_INBOUND.split(",")]:
        if port and port not in merged:
            merged.append(port)
    settings["inbound_ports_exclude"] = Setting(",".join(merged), excluded.source, excluded.written)
    if REROUTE_VIRTUAL_INTERFACES in info.annotations:
        settings["reroute_virtual_interfaces"] = _annotation(info, REROUTE_VIRTUAL_INTERFACES, "", _items)
    else:
        settings["reroute_virtual_interfaces"] = _annotation(info, KUBEVIRT_INTERFACES, "", _items)
    for field, ident, key in (("proxy_uid", info.proxy_uid, "runAsUser"), ("proxy_gid", info.proxy_gid, "runAsGroup")):
        if ident:
            settings[field] = Setting(str(ident), f"istio-proxy securityContext.{key}")
        else:
            settings[field] = Setting(DEFAULT_UID, f"default of istio-proxy securityContext.{key}")
    return settings


def proxy_env_flags(info: PodInfo, warn: Callable[[str], None]) -> dict[str, bool]:
    """DNS capture (redirect *and* capture-all), invalid drop and dual stack; unparsable values warn, count false."""
    flags = {}
    for name, fields in (("ISTIO_META_DNS_CAPTURE", ("redirect_dns", "capture_all_dns")),
                         ("ISTIO_DUAL_STACK", ("dual_stack",)), ("INVALID_DROP", ("drop_invalid",))):
        value = False
        if name in info.proxy_env:
            parsed = _go_bool(info.proxy_env[name])
            if parsed is None:
                warn(f"cannot parse istio-proxy env {name}={info.proxy_env[name]!r} as a boolean; treating it as false")
            value = bool(parsed)
        for field in fields:
            flags[field] = value
    return flags


def capture_config(info: PodInfo, netns: str, *, dry_run: bool, native_nftables: bool, env: Mapping[str, str],
                   warn: Callable[[str], None]) -> CaptureConfig:
    """The validated istio-iptables configuration for this pod (PodError naming the source of a bad value)."""
    settings = redirect_settings(info, warn)
    for field, var in ENV_ONLY:  # istio-iptables' environment-only settings, read from the plugin's environment
        settings[field] = Setting(env.get(var.name, var.default), f"istio-cni environment variable {var.name}")
    values: dict[str, object] = {field: s.value for field, s in settings.items()}
    values.update(proxy_env_flags(info, warn))
    cfg = CaptureConfig(proxy_port="15001", dry_run=dry_run, network_namespace=netns, cni_mode=True,
                        native_nftables=native_nftables, **values)
    try:
        validate(cfg)
    except ConfigError as err:
        setting = settings.get(err.field)
        source = setting.source if setting else err.field
        value = setting.written if setting else err.value
        raise PodError(source, value, err.reason) from None
    return cfg

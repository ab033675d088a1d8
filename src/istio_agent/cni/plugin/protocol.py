"""The CNI protocol, sans-IO: environment + stdin in, a request (or a CNI error) out; results and errors to bytes.

The rules are those of containernetworking/cni's `skel` (what upstream's
plugin is built on) for spec versions 0.3.0 to 1.1.0:

- `CNI_COMMAND` is always required; `CNI_CONTAINERID` and `CNI_IFNAME` for
  ADD, CHECK and DEL; `CNI_NETNS` for ADD and CHECK (DEL tolerates a gone
  namespace); `CNI_PATH` for everything but VERSION. Missing ones are all
  named in one code-4 error.
- stdin must be a JSON object with a usable `name` (codes 6 and 7); a missing
  `cniVersion` means 0.1.0, which this plugin does not speak (code 1).
- CHECK needs a config version of at least 0.4.0, STATUS and GC 1.1.0.
- stdin nested deeper than `jsonlimits.MAX_DEPTH` is a decoding error (code 6), refused before it is
  parsed: every failure is answered with an error object, never a traceback.

Nothing here reads the environment or does I/O: `main.py` passes them in.
A plain class instead of dataclasses keeps `import dataclasses` (and
`inspect`) off the per-pod start-up path.
"""

from __future__ import annotations

import json

from istio_agent.cni.jsonlimits import loads as load_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST = SUPPORTED_VERSIONS[-1]
ABOUT = "CNI plugin istio-cni (istio_agent)"

ERR_INCOMPATIBLE_VERSION = 1
ERR_UNSUPPORTED_FIELD = 2
ERR_UNKNOWN_CONTAINER = 3
ERR_INVALID_ENVIRONMENT = 4
ERR_IO_FAILURE = 5
ERR_DECODING_FAILURE = 6
ERR_INVALID_NETWORK_CONFIG = 7
ERR_INVALID_NETNS = 8
ERR_TRY_AGAIN_LATER = 11
ERR_INTERNAL = 999

COMMANDS = ("ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC")
_REQUIRED: dict[str, tuple[str, ...]] = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"),
    "GC": ("CNI_PATH",),
    "STATUS": ("CNI_PATH",),
}
_MIN_VERSION = {"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}
_NAME_FIRST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_NAME_REST = _NAME_FIRST | frozenset("_.-")
MAX_IFNAME = 15
# CNI_ARGS keys upstream's K8sArgs knows (plus IgnoreUnknown from CommonArgs).
K8S_ARGS = ("K8S_POD_NAME", "K8S_POD_NAMESPACE", "K8S_POD_INFRA_CONTAINER_ID", "K8S_POD_UID")


class CniError(Exception):
    """A CNI error object: the spec's code, a message naming the field or value, optional details."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg if not details else f"{msg}; {details}")
        self.code = code
        self.msg = msg
        self.details = details


class Request:
    """One invocation: the command, the CNI_* values and (except for VERSION) the parsed network config."""

    __slots__ = ("args", "command", "config", "container_id", "ifname", "netns", "path", "version")

    def __init__(self, command: str, container_id: str, netns: str, ifname: str, args: str, path: str,
                 config: dict[str, object], version: str) -> None:
        self.command = command
        self.container_id = container_id
        self.netns = netns
        self.ifname = ifname
        self.args = args
        self.path = path
        self.config = config
        self.version = version


def valid_name(text: str) -> bool:
    """skel's name rule (network names, container ids): `[a-zA-Z0-9][a-zA-Z0-9_.-]*`."""
    return bool(text) and text[0] in _NAME_FIRST and set(text) <= _NAME_REST


def check_ifname(name: str) -> None:
    """skel's ValidateInterfaceName: 1-15 characters, not . or .., no `/`, `:` or whitespace."""
    if len(name) > MAX_IFNAME:
        raise CniError(ERR_INVALID_ENVIRONMENT, f"CNI_IFNAME {name!r}: interface name is too long",
                       f"interface name should be less than {MAX_IFNAME + 1} characters")
    if name in (".", ".."):
        raise CniError(ERR_INVALID_ENVIRONMENT, f"CNI_IFNAME {name!r}: interface name is . or ..")
    if any(ch in "/:" or ch.isspace() for ch in name):
        raise CniError(ERR_INVALID_ENVIRONMENT,
                       f"CNI_IFNAME {name!r}: interface name contains / or : or whitespace characters")


def parse_version(text: str) -> tuple[int, int, int]:
    """`major.minor.patch` (missing parts are 0) as skel's ParseVersion reads it; ValueError otherwise."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isascii() and p.isdigit() for p in parts):
        raise ValueError(f"invalid version {text!r}")
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return numbers[0], numbers[1], numbers[2]


def config_version(config: Mapping[str, object]) -> str:
    """The config's `cniVersion` (0.1.0 when absent, as skel decodes it)."""
    version = config.get("cniVersion", "")
    if not isinstance(version, str):
        raise CniError(ERR_DECODING_FAILURE, f"failed to parse cniVersion {json.dumps(version)}: not a string")
    return version or "0.1.0"


def _incompatible(version: str) -> CniError:
    supported = "[" + " ".join(f'"{v}"' for v in SUPPORTED_VERSIONS) + "]"
    details = f'config is "{version}", plugin supports {supported}'
    return CniError(ERR_INCOMPATIBLE_VERSION,
                    f"incompatible CNI versions: cniVersion {version!r} is not supported; this plugin supports "
                    f"{', '.join(SUPPORTED_VERSIONS)}", details)


def check_version(command: str, version: str) -> None:
    """skel's version gates: per-command minimum, then the supported list (code 1; 6 for an unparsable one)."""
    minimum = _MIN_VERSION.get(command)
    if minimum is not None:
        try:
            if parse_version(version) < parse_version(minimum):
                raise CniError(ERR_INCOMPATIBLE_VERSION,
                               f"config version {version} does not allow {command} (needs {minimum} or later)")
        except ValueError as err:
            raise CniError(ERR_DECODING_FAILURE, f"failed to parse cniVersion: {err}") from None
    if version not in SUPPORTED_VERSIONS:
        raise _incompatible(version)


def parse_network_config(stdin: bytes) -> dict[str, object]:
    """stdin as a network config object with a valid `name` (skel's validateConfig)."""
    try:
        config = load_json(stdin)  # nesting limited: a deep document is a decoding error, not a crash
    except (ValueError, UnicodeDecodeError) as err:
        raise CniError(ERR_DECODING_FAILURE, f"failed to parse the network configuration on stdin as JSON: {err}") \
            from None
    if not isinstance(config, dict):
        raise CniError(ERR_DECODING_FAILURE,
                       f"failed to parse the network configuration on stdin: expected a JSON object, "
                       f"got {type(config).__name__}")
    name = config.get("name", "")
    if not isinstance(name, str):
        raise CniError(ERR_INVALID_NETWORK_CONFIG, f"invalid network config: name {json.dumps(name)} is not a string")
    if not name:
        raise CniError(ERR_INVALID_NETWORK_CONFIG, "invalid network config: missing network name (field \"name\")")
    if not valid_name(name):
        raise CniError(ERR_INVALID_NETWORK_CONFIG,
                       f"invalid network config: invalid characters found in network name {name!r}", name)
    return config


def parse_request(env: Mapping[str, str], stdin: bytes) -> Request | None:
    """The request this invocation makes; None when CNI_COMMAND is unset (skel then prints its about text)."""
    command = env.get("CNI_COMMAND", "")
    if not command:
        return None
    required = _REQUIRED.get(command, ())
    missing = [name for name in required if not env.get(name, "")]
    if missing:
        raise CniError(ERR_INVALID_ENVIRONMENT, f"required env variables [{','.join(missing)}] missing")
    container_id = env.get("CNI_CONTAINERID", "")
    if "CNI_CONTAINERID" in required and not valid_name(container_id):
        raise CniError(ERR_INVALID_ENVIRONMENT, f"CNI_CONTAINERID {container_id!r}: invalid characters in containerID",
                       container_id)
    ifname = env.get("CNI_IFNAME", "")
    if "CNI_IFNAME" in required:
        check_ifname(ifname)
    if command == "VERSION":
        return Request(command, container_id, env.get("CNI_NETNS", ""), ifname, env.get("CNI_ARGS", ""),
                       env.get("CNI_PATH", ""), {}, "")
    config = parse_network_config(stdin)
    if command not in COMMANDS:
        raise CniError(ERR_INVALID_ENVIRONMENT, f"unknown CNI_COMMAND: {command}")
    version = config_version(config)
    check_version(command, version)
    return Request(command, container_id, env.get("CNI_NETNS", ""), ifname, env.get("CNI_ARGS", ""),
                   env.get("CNI_PATH", ""), config, version)


def parse_cni_args(text: str) -> dict[str, str]:
    """CNI_ARGS `K=V;K=V` as upstream's K8sArgs loads it: unknown keys fail unless IgnoreUnknown is true."""
    values: dict[str, str] = {}
    if not text:
        return values
    unknown: list[str] = []
    ignore_unknown = False
    for pair in text.split(";"):
        kv = pair.split("=")
        if len(kv) != 2:
            raise CniError(ERR_INVALID_ENVIRONMENT, f"CNI_ARGS: invalid pair {pair!r} (expected K=V)")
        key, value = kv
        if key == "IgnoreUnknown":
            if value.lower() in ("1", "true"):
                ignore_unknown = True
            elif value.lower() in ("0", "false"):
                ignore_unknown = False
            else:
                raise CniError(ERR_INVALID_ENVIRONMENT, f"CNI_ARGS: IgnoreUnknown={value!r} is not a boolean")
        elif key in K8S_ARGS:
            values[key] = value
        else:
            unknown.append(pair)
    if unknown and not ignore_unknown:
        raise CniError(ERR_INVALID_ENVIRONMENT,
                       f"CNI_ARGS: unknown args {unknown} (set IgnoreUnknown=1 to allow them)")
    return values


def _dump(obj: object) -> bytes:
    return (json.dumps(obj, indent=4) + "\n").encode()


def add_result(config: Mapping[str, object], version: str) -> bytes:
    """What a chained ADD prints: prevResult as given, labelled with the config's version; else an empty result.

    Nothing is converted: the runtime already handed prevResult over in the
    config's version. Only its version label is set (a pre-1.0 result may
    lack one; a key spelled in another case, which Go's decoder would also
    take for `cniVersion`, is replaced). The empty result is upstream's: an
    empty `dns` object in the 0.x layout, none from 1.0.0 on (the 1.x result
    leaves an empty `dns` out).
    """
    prev = config.get("prevResult")
    if prev is None:
        return _dump({"cniVersion": version, "dns": {}} if version.startswith("0.") else {"cniVersion": version})
    if not isinstance(prev, dict):
        raise CniError(ERR_INVALID_NETWORK_CONFIG, "invalid network config: prevResult must be a JSON object")
    result: dict[str, object] = {"cniVersion": version}
    result.update((k, v) for k, v in prev.items() if k.lower() != "cniversion")
    return _dump(result)


def version_result(stdin: bytes) -> bytes:
    """VERSION's answer: the supported versions, and the input's cniVersion when it is one of them (spec 1.1)."""
    version = LATEST
    try:
        asked = load_json(stdin).get("cniVersion") if stdin.strip() else None  # type: ignore[attr-defined]
    except (ValueError, UnicodeDecodeError, AttributeError):
        asked = None
    if isinstance(asked, str) and asked in SUPPORTED_VERSIONS:
        version = asked
    return (json.dumps({"cniVersion": version, "supportedVersions": list(SUPPORTED_VERSIONS)}) + "\n").encode()


def error_result(err: CniError, version: str = "") -> bytes:
    """The spec's error object; `cniVersion` is the config's when it is one we speak, else the latest."""
    body: dict[str, object] = {
        "cniVersion": version if version in SUPPORTED_VERSIONS else LATEST,
        "code": err.code,
        "msg": err.msg,
    }
    if err.details:
        body["details"] = err.details
    return _dump(body)


def error_version(stdin: bytes) -> str:
    """Best effort: the config's cniVersion, for labelling an error found before the request parsed (never raises:
    it labels the answers to every failure)."""
    try:
        version = load_json(stdin).get("cniVersion", "")  # type: ignore[attr-defined]
    except Exception:
        return ""
    return version if isinstance(version, str) else ""

"""The CNI runtime: what libcni does for a container runtime, so the local node builds pods through a CNI chain.

A container runtime (containerd, CRI-O) never configures a pod's network
itself: it loads a network configuration list (`.conflist`, or a single
`.conf` up-converted to a one-plugin list), then runs each plugin's binary in
order with the CNI environment (`CNI_COMMAND`, `CNI_CONTAINERID`,
`CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS`, `CNI_PATH`) and the plugin's own
config on stdin. Each plugin's config gets the list's `name` and
`cniVersion`, the previous plugin's result as `prevResult`, and a
`runtimeConfig` holding those of the runtime's capability arguments (`ips`,
`portMappings`, ...) the plugin declares in `capabilities`. A plugin's error
object (`code`, `msg`, `details`) stops the chain. The last result is cached
on disk, per network, container and interface
(`<cache>/results/<network>-<container id>-<ifname>`, libcni's `cniCacheV1`
record with the config used), because DEL and CHECK must feed it to the
plugins again: DEL runs the plugins in reverse order with the cached result
as `prevResult` (spec 0.4.0 and later) and succeeds when nothing is cached,
CHECK (0.4.0 and later) runs them in order with it. The cache goes after a
DEL.

Everything that decides is pure (parsing and validating the list, each
plugin's stdin and environment, reading a plugin's answer, the cache record);
`CniRuntime` is the thin edge that finds binaries in `CNI_PATH`, execs them
and reads and writes the cache. Plugins are exec'd inside a given network
namespace (the local node's: the bridge plugin creates its bridge and the
host ends of veths where it runs), entered in the child between fork and exec,
so no `ip netns exec` or `nsenter` process is added per plugin.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
CACHE_KIND = "cniCacheV1"
DEFAULT_TIMEOUT = 30.0
# libcni's rules for names that end up in file names and interface names.
_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
_IFNAMSIZ = 16


class CniConfigError(ValueError):
    """A network configuration or runtime argument is unusable; the message names the field and value."""


class CniExecError(RuntimeError):
    """A plugin could not be found or run, or answered something that is not CNI."""


class PluginError(CniExecError):
    """A plugin's CNI error object: which plugin, which command, the spec's code, msg and details."""

    def __init__(self, plugin: str, network: str, command: str, code: int | None, msg: str,
                 details: str = "") -> None:
        self.plugin = plugin
        self.network = network
        self.command = command
        self.code = code
        self.msg = msg
        self.details = details
        text = f"plugin {plugin} (network {network}) failed ({command}): "
        text += f"code {code}: {msg}" if code is not None else msg
        if details:
            text += f" ({details})"
        super().__init__(text)


@dataclass(frozen=True)
class PluginConf:
    """One entry of a list: its `type` (the binary's name), its raw config, the capabilities it declares."""

    type: str
    config: Mapping[str, Any]
    capabilities: frozenset[str] = frozenset()


@dataclass(frozen=True)
class NetworkList:
    """A validated network configuration list; `raw` is what the cache records as the config used."""

    name: str
    cni_version: str
    plugins: tuple[PluginConf, ...]
    disable_check: bool = False
    raw: bytes = b""
    source: str = ""


@dataclass(frozen=True)
class RuntimeConf:
    """One attachment's runtime arguments: container, netns path, interface, CNI_ARGS pairs, capability args."""

    container_id: str
    netns: str
    ifname: str
    args: tuple[tuple[str, str], ...] = ()
    capability_args: Mapping[str, Any] = field(default_factory=dict)


# ---- versions ------------------------------------------------------------------------------------


def parse_version(version: str, what: str = "cniVersion") -> tuple[int, int, int]:
    """`major.minor.patch` as integers (CniConfigError naming `what` otherwise)."""
    parts = version.split(".") if isinstance(version, str) else []
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise CniConfigError(f"{what} {version!r} is not a version (major.minor.patch)")
    return int(parts[0]), int(parts[1]), int(parts[2])


def version_at_least(version: str, minimum: str) -> bool:
    return parse_version(version) >= parse_version(minimum)


# ---- loading a list ------------------------------------------------------------------------------


def _check_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise CniConfigError(f"{what} must be a non-empty string, got {value!r}")
    if not _NAME.match(value):
        raise CniConfigError(f"{what} {value!r}: letters, digits, '_', '.' and '-' only, starting with a letter or "
                             "digit")
    return value


def _check_bool(config: Mapping[str, Any], key: str, source: str) -> bool:
    value = config.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise CniConfigError(f"{source}: {key} must be true or false, got {value!r}")


def _plugin(entry: object, index: int, source: str) -> PluginConf:
    where = f"{source}: plugins[{index}]"
    if not isinstance(entry, dict):
        raise CniConfigError(f"{where} must be an object, got {type(entry).__name__}")
    kind = entry.get("type")
    if not isinstance(kind, str) or not kind:
        raise CniConfigError(f"{where}: missing 'type'")
    if "/" in kind or kind in (".", ".."):
        raise CniConfigError(f"{where}: type {kind!r} must be a binary's name, not a path")
    capabilities = entry.get("capabilities", {})
    if not isinstance(capabilities, dict) or not all(isinstance(v, bool) for v in capabilities.values()):
        raise CniConfigError(f"{where} ({kind}): capabilities must map names to true/false, got {capabilities!r}")
    return PluginConf(kind, entry, frozenset(name for name, on in capabilities.items() if on))


def parse_network(data: bytes | str, source: str = "network config", single: bool | None = None) -> NetworkList:
    """Parse and validate a `.conflist` (or, `single=True` or no `plugins` key, a `.conf` up-converted to one).

    Checks what libcni checks and what a plugin would fail on later with a worse
    message: the name (it becomes part of cache and IPAM file names), a known
    `cniVersion`, a non-empty `plugins` list whose entries each have a `type`.
    """
    raw = data.encode() if isinstance(data, str) else bytes(data)
    try:
        config = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CniConfigError(f"{source}: not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise CniConfigError(f"{source}: must be a JSON object, got {type(config).__name__}")
    if single is None:
        single = "plugins" not in config
    if single:
        if "type" not in config:
            raise CniConfigError(f"{source}: neither 'plugins' (a .conflist) nor 'type' (a .conf)")
        config = {"name": config.get("name"), "cniVersion": config.get("cniVersion", ""), "plugins": [config]}
        raw = json.dumps(config).encode()
    name = _check_name(config.get("name"), f"{source}: name")
    version = config.get("cniVersion", "")
    if not isinstance(version, str) or not version:
        raise CniConfigError(f"{source}: cniVersion must be a non-empty string, got {version!r}")
    parse_version(version, f"{source}: cniVersion")
    if version not in SUPPORTED_VERSIONS:
        raise CniConfigError(f"{source}: cniVersion {version!r} is not supported (supported: "
                             f"{', '.join(SUPPORTED_VERSIONS)})")
    entries = config.get("plugins")
    if not isinstance(entries, list):
        raise CniConfigError(f"{source}: plugins must be a list, got {type(entries).__name__}")
    if not entries:
        raise CniConfigError(f"{source}: no plugins in list")
    plugins = tuple(_plugin(entry, i, source) for i, entry in enumerate(entries))
    return NetworkList(name, version, plugins, _check_bool(config, "disableCheck", source), raw, source)


def loopback_network(cni_version: str = "1.0.0") -> NetworkList:
    """The loopback network container runtimes attach first, on `lo`, as a list of its own."""
    return parse_network(json.dumps({"cniVersion": cni_version, "name": "cni-loopback",
                                     "plugins": [{"type": "loopback"}]}), "loopback")


# ---- one invocation ------------------------------------------------------------------------------


def validate_runtime(runtime: RuntimeConf) -> None:
    """libcni's checks before any plugin runs: container id and interface name (they name files and links)."""
    _check_name(runtime.container_id, "container id")
    ifname = runtime.ifname
    if not ifname or len(ifname) >= _IFNAMSIZ or ifname in (".", "..") or any(
            c in ifname for c in "/:") or any(c.isspace() for c in ifname):
        raise CniConfigError(f"interface name {ifname!r}: 1 to {_IFNAMSIZ - 1} characters, no '/', ':' or spaces")
    if not runtime.netns:
        raise CniConfigError("netns: a network namespace path is required")
    for key, value in runtime.args:
        if not key or "=" in key or ";" in key or ";" in value:
            raise CniConfigError(f"CNI_ARGS entry {key!r}={value!r}: keys and values cannot hold ';' (nor keys '=')")


def cni_args_text(args: Sequence[tuple[str, str]]) -> str:
    """`CNI_ARGS` as the spec writes it: `K=V` pairs joined by `;`."""
    return ";".join(f"{key}={value}" for key, value in args)


def parse_cni_args(text: str) -> tuple[tuple[str, str], ...]:
    """The pairs of a `CNI_ARGS` string (the inverse of `cni_args_text`); an entry without `=` is refused."""
    pairs = []
    for item in text.split(";"):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CniConfigError(f"CNI_ARGS entry {item!r} is not KEY=VALUE")
        pairs.append((key, value))
    return tuple(pairs)


def plugin_stdin(network: NetworkList, plugin: PluginConf, prev_result: Mapping[str, Any] | None,
                 runtime: RuntimeConf | None) -> bytes:
    """The plugin's config as it reads it: its own keys plus the list's name and version, the previous
    result, and `runtimeConfig` with the capability arguments it declared (only those, as libcni does)."""
    config = dict(plugin.config)
    config["name"] = network.name
    config["cniVersion"] = network.cni_version
    if prev_result is not None:
        config["prevResult"] = dict(prev_result)
    if runtime is not None:
        offered = {key: value for key, value in runtime.capability_args.items()
                   if key in plugin.capabilities and value is not None}
        if offered:
            config["runtimeConfig"] = offered
    return json.dumps(config, separators=(",", ":")).encode()


def plugin_environment(command: str, runtime: RuntimeConf | None, cni_path: Sequence[str],
                       base: Mapping[str, str]) -> dict[str, str]:
    """The process environment a plugin gets: the runtime's own (any CNI_* from it dropped) plus the CNI set."""
    environment = {key: value for key, value in base.items() if not key.startswith("CNI_")}
    environment["CNI_COMMAND"] = command
    environment["CNI_PATH"] = os.pathsep.join(cni_path)
    if runtime is not None:
        environment.update({"CNI_CONTAINERID": runtime.container_id, "CNI_NETNS": runtime.netns,
                            "CNI_IFNAME": runtime.ifname, "CNI_ARGS": cni_args_text(runtime.args)})
    return environment


def find_plugin(kind: str, cni_path: Sequence[str], is_executable: Callable[[str], bool]) -> str:
    """The first `<dir>/<type>` along CNI_PATH that can be executed (CniExecError naming the path otherwise)."""
    for folder in cni_path:
        candidate = os.path.join(folder, kind)
        if is_executable(candidate):
            return candidate
    raise CniExecError(f"failed to find plugin {kind!r} in path {list(cni_path)}")


def _error_object(payload: object) -> Mapping[str, Any] | None:
    if isinstance(payload, dict) and "code" in payload and "msg" in payload:
        return payload
    return None


def read_plugin_output(network: str, plugin: str, command: str, returncode: int, stdout: bytes,
                       stderr: bytes) -> dict[str, Any] | None:
    """What a plugin said: ADD's result (a JSON object), None for the other commands, PluginError for an error.

    The spec has errors exit non-zero with the error object on stdout; an
    object with `code` and `msg` is an error whatever the exit status, and a
    failure without one is reported with the plugin's stderr.
    """
    text = stdout.decode(errors="replace").strip()
    try:
        payload: object = json.loads(text) if text else None
    except ValueError:
        payload = None
    error = _error_object(payload)
    if error is not None:
        code = error.get("code")
        raise PluginError(plugin, network, command, code if isinstance(code, int) else None,
                          str(error.get("msg", "")), str(error.get("details", "") or ""))
    if returncode != 0:
        said = stderr.decode(errors="replace").strip() or text or "no error message"
        raise PluginError(plugin, network, command, None, f"exit status {returncode}: {said[-2000:]}")
    if command != "ADD" and command != "VERSION":
        return None
    if not isinstance(payload, dict):
        raise CniExecError(f"plugin {plugin} (network {network}) returned no result for {command}: {text[:500]!r}")
    return payload


# ---- the result cache ----------------------------------------------------------------------------


def cache_file(cache_dir: str, network: str, runtime: RuntimeConf) -> str:
    """libcni's cache path: `<cache>/results/<network>-<container id>-<ifname>`."""
    return os.path.join(cache_dir, "results", f"{network}-{runtime.container_id}-{runtime.ifname}")


def cache_record(network: NetworkList, runtime: RuntimeConf, result: Mapping[str, Any]) -> bytes:
    """The `cniCacheV1` record: the final result, and the config and runtime arguments it was made with."""
    record: dict[str, Any] = {
        "kind": CACHE_KIND,
        "containerId": runtime.container_id,
        "config": base64.b64encode(network.raw).decode(),
        "ifName": runtime.ifname,
        "networkName": network.name,
        "netns": runtime.netns,
        "result": dict(result),
    }
    if runtime.args:
        record["cniArgs"] = [list(pair) for pair in runtime.args]
    if runtime.capability_args:
        record["capabilityArgs"] = dict(runtime.capability_args)
    return json.dumps(record, separators=(",", ":")).encode()


def read_cache_record(data: bytes, network: str) -> dict[str, Any]:
    """A cache record's fields (CniExecError when it is not a `cniCacheV1` record of this network)."""
    try:
        record = json.loads(data)
    except ValueError as exc:
        raise CniExecError(f"cached result of network {network!r} is not JSON: {exc}") from None
    if not isinstance(record, dict) or record.get("kind") != CACHE_KIND:
        kind = record.get("kind") if isinstance(record, dict) else None
        raise CniExecError(f"cached result of network {network!r} has kind {kind!r}, not {CACHE_KIND}")
    if not isinstance(record.get("result"), dict):
        raise CniExecError(f"cached result of network {network!r} holds no result object")
    return record


def cached_config(record: Mapping[str, Any]) -> bytes:
    """The config bytes a cache record says the ADD used."""
    return base64.b64decode(str(record.get("config", "")))


# ---- the exec edge -------------------------------------------------------------------------------


def load_network_file(path: Path) -> NetworkList:
    """A `.conflist` or `.conf` file (chosen by its extension, as libcni does), validated."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CniConfigError(f"{path}: {exc.strerror or exc}") from None
    return parse_network(data, str(path), single=path.suffix in (".conf", ".json"))


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


class CniRuntime:
    """Runs CNI chains: plugins from `cni_path`, results cached under `cache_dir`, exec'd inside `netns`.

    `netns` is the path of the network namespace plugins run in (None: this
    process's own); `base_env` is the environment they start from (the CNI
    variables are added to it).
    """

    def __init__(self, cni_path: Sequence[str | Path], cache_dir: Path, netns: str | None = None,
                 base_env: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.cni_path = [str(p) for p in cni_path]
        self.cache_dir = cache_dir
        self.netns = netns
        self.base_env = dict(base_env or {})
        self.timeout = timeout

    # ---- commands on a list

    def add(self, network: NetworkList, runtime: RuntimeConf) -> dict[str, Any]:
        """ADD through every plugin in order, each fed the previous result; the last one is cached and returned."""
        validate_runtime(runtime)
        result: dict[str, Any] | None = None
        for plugin in network.plugins:
            answer = self._invoke(network, plugin, "ADD", result, runtime)
            if answer is None:  # pragma: no cover - read_plugin_output returns a dict for ADD
                raise CniExecError(f"plugin {plugin.type} returned no result")
            result = answer
        assert result is not None
        self._write_cache(network, runtime, result)
        return result

    def check(self, network: NetworkList, runtime: RuntimeConf) -> None:
        """CHECK through every plugin in order with the cached result (spec 0.4.0 and later)."""
        if not version_at_least(network.cni_version, "0.4.0"):
            raise CniConfigError(f"network {network.name}: cniVersion {network.cni_version} does not support CHECK")
        validate_runtime(runtime)
        if network.disable_check:
            return
        cached = self.cached_result(network, runtime)
        for plugin in network.plugins:
            self._invoke(network, plugin, "CHECK", cached, runtime)

    def delete(self, network: NetworkList, runtime: RuntimeConf) -> None:
        """DEL through the plugins in reverse order with the cached result; the cache goes afterwards.

        Nothing cached (never added, or already deleted) is not an error, as in
        libcni: every plugin's DEL must then succeed on its own. An unreadable
        cache record is dropped and DEL goes on without it.
        """
        validate_runtime(runtime)
        cached: dict[str, Any] | None = None
        if version_at_least(network.cni_version, "0.4.0"):
            try:
                cached = self.cached_result(network, runtime)
            except CniExecError:
                self._remove_cache(network, runtime)
        for plugin in reversed(network.plugins):
            self._invoke(network, plugin, "DEL", cached, runtime)
        self._remove_cache(network, runtime)

    def status(self, network: NetworkList) -> None:
        """STATUS (spec 1.1.0) on every plugin; nothing to ask of an older list."""
        if not version_at_least(network.cni_version, "1.1.0"):
            return
        for plugin in network.plugins:
            self._invoke(network, plugin, "STATUS", None, None)

    def versions(self, kind: str) -> list[str]:
        """The spec versions a plugin says it supports (CNI_COMMAND=VERSION)."""
        path = find_plugin(kind, self.cni_path, _executable)
        stdin = json.dumps({"cniVersion": SUPPORTED_VERSIONS[-1]}).encode()
        answer = read_plugin_output("", kind, "VERSION",
                                    *self._exec(path, stdin, plugin_environment("VERSION", None, self.cni_path,
                                                                                self.base_env)))
        supported = (answer or {}).get("supportedVersions")
        if not isinstance(supported, list):
            raise CniExecError(f"plugin {kind} answered VERSION without supportedVersions: {answer!r}")
        return [str(v) for v in supported]

    # ---- the cache

    def cache_path(self, network: NetworkList | str, runtime: RuntimeConf) -> Path:
        name = network if isinstance(network, str) else network.name
        return Path(cache_file(str(self.cache_dir), name, runtime))

    def cached_record(self, network: NetworkList, runtime: RuntimeConf) -> dict[str, Any] | None:
        try:
            data = self.cache_path(network, runtime).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CniExecError(f"reading the cached result of network {network.name!r}: {exc}") from None
        return read_cache_record(data, network.name)

    def cached_result(self, network: NetworkList, runtime: RuntimeConf) -> dict[str, Any] | None:
        """The result the last ADD of this attachment returned, or None when there is none."""
        record = self.cached_record(network, runtime)
        return None if record is None else dict(record["result"])

    def _write_cache(self, network: NetworkList, runtime: RuntimeConf, result: Mapping[str, Any]) -> None:
        path = self.cache_path(network, runtime)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(cache_record(network, runtime, result))
        partial.replace(path)

    def _remove_cache(self, network: NetworkList, runtime: RuntimeConf) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.cache_path(network, runtime).unlink()

    # ---- one plugin

    def _invoke(self, network: NetworkList, plugin: PluginConf, command: str, prev: Mapping[str, Any] | None,
                runtime: RuntimeConf | None) -> dict[str, Any] | None:
        path = find_plugin(plugin.type, self.cni_path, _executable)
        stdin = plugin_stdin(network, plugin, prev, runtime)
        environment = plugin_environment(command, runtime, self.cni_path, self.base_env)
        return read_plugin_output(network.name, plugin.type, command, *self._exec(path, stdin, environment))

    def _exec(self, path: str, stdin: bytes, environment: Mapping[str, str]) -> tuple[int, bytes, bytes]:
        """Run one plugin, inside `netns` through `nsenter --net` (which execs it: no `preexec_fn`, which is
        unsafe in a process with threads, and the node prepares pods from several at once)."""
        netns = self.netns
        argv = [path] if netns is None else ["nsenter", f"--net={netns}", "--", path]
        try:
            done = subprocess.run(argv, input=stdin, capture_output=True, env=dict(environment),
                                  timeout=self.timeout, cwd="/")
        except subprocess.TimeoutExpired:
            raise CniExecError(f"plugin {path} did not answer within {self.timeout:g}s") from None
        except (OSError, subprocess.SubprocessError) as exc:
            where = f" in network namespace {netns}" if netns else ""
            raise CniExecError(f"running plugin {path}{where}: {exc}") from None
        return done.returncode, done.stdout, done.stderr

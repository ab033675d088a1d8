"""ECDS with remote Wasm → ECDS with local files: the decisions of upstream's conversion (pkg/wasm/convert.go).

`plan()` decodes one ECDS response and lists, per extension config whose Wasm code is remote (an HTTP Wasm
filter, a network one, or either inside a `udpa.type.v1.TypedStruct`), what to fetch; `finish()` writes the
fetched files in (the code becomes a local file) or, for a fetch that failed, the plugin's fail-open or
fail-closed stand-in: an RBAC filter that allows everything or denies everything, under the same name, as
upstream does. Configs without remote Wasm are left as they are. A resource that does not decode makes the
whole response a NACK. The agent-only variables istiod puts in the VM's environment (`ISTIO_META_*`: the pull
secret, the pull policy, the resource version) are read, then removed before Envoy sees the config.

Envoy's Wasm and RBAC modules are imported by the caller's first use only (`carries_remote_wasm` is a cheap
byte scan that lets every other ECDS push pass as raw bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envoy.config.core.v3 import extension_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm_pb2
from envoy.extensions.filters.network.rbac.v3 import rbac_pb2 as network_rbac_pb2
from envoy.extensions.filters.network.wasm.v3 import wasm_pb2 as network_wasm_pb2
from envoy.extensions.wasm.v3 import wasm_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, json_format
from google.protobuf.message import DecodeError, Message
from udpa.type.v1 import typed_struct_pb2

from istio_agent.wasm.core.cache_state import PULL_POLICIES, UNSPECIFIED, FetchRequest

PREFIX = "type.googleapis.com/"
HTTP_WASM_TYPE = PREFIX + "envoy.extensions.filters.http.wasm.v3.Wasm"
NETWORK_WASM_TYPE = PREFIX + "envoy.extensions.filters.network.wasm.v3.Wasm"
TYPED_STRUCT_TYPE = PREFIX + "udpa.type.v1.TypedStruct"
EXTENSION_CONFIG_TYPE = PREFIX + "envoy.config.core.v3.TypedExtensionConfig"
# Envoy's Wasm filter type names as they appear in a pushed resource's bytes (a typed struct names them too).
_WASM_MARKERS = (b"envoy.extensions.filters.http.wasm.v3.Wasm", b"envoy.extensions.filters.network.wasm.v3.Wasm")

SECRET_ENV = "ISTIO_META_WASM_IMAGE_PULL_SECRET"
POLICY_ENV = "ISTIO_META_WASM_IMAGE_PULL_POLICY"
RESOURCE_VERSION_ENV = "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"
AGENT_ENV_PREFIX = "ISTIO_META_"
DEFAULT_FETCH_TIMEOUT = 5.0  # when the remote source names none (istiod always sets 30s)

ALLOW_STAT_PREFIX = "wasm-default-allow"
DENY_STAT_PREFIX = "wasm-default-deny"

# wasm_config_conversion_count results (upstream's)
SUCCESS = "success"
NO_REMOTE_LOAD = "no_remote_load"
MARSHAL_FAILURE = "marshal_failure"
UNMARSHAL_FAILURE = "unmarshal_failure"
FETCH_FAILURE = "fetch_failure"
MISS_REMOTE_FETCH_HINT = "miss_remote_fetch_hint"


def carries_remote_wasm(data: bytes) -> bool:
    """Whether an ECDS response may hold a Wasm filter: without one of its type names it is passed on as is."""
    return any(marker in data for marker in _WASM_MARKERS)


@dataclass
class _Item:
    index: int
    config: extension_pb2.TypedExtensionConfig
    wasm: Message  # http or network Wasm
    network: bool
    request: FetchRequest | None = None
    error: str = ""  # a failure before any fetch (no URL, empty pull secret)
    status: str = ""


@dataclass
class EcdsPlan:
    """One decoded ECDS response and its resources with remote Wasm, in order."""

    response: Message
    delta: bool
    items: list[_Item] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # resources that do not decode: the response is NACKed
    passed: int = 0  # resources without remote Wasm

    @property
    def fetches(self) -> list[tuple[int, FetchRequest]]:
        return [(item.index, item.request) for item in self.items if item.request is not None]


def _failure_open(wasm: Message) -> bool:
    config = wasm.config  # type: ignore[attr-defined]
    if config.failure_policy != wasm_pb2.UNSPECIFIED:
        return bool(config.failure_policy == wasm_pb2.FAIL_OPEN)
    return bool(config.fail_open)


def _unpack(resource: any_pb2.Any) -> tuple[extension_pb2.TypedExtensionConfig, Message | None, bool]:
    """The extension config and its Wasm filter with remote code (None when it has none); ValueError: undecodable."""
    config = extension_pb2.TypedExtensionConfig()
    try:
        unpacked = resource.type_url == EXTENSION_CONFIG_TYPE and resource.Unpack(config)
    except DecodeError as exc:
        raise ValueError(f"failed to unmarshal extension config resource: {exc}") from None
    if not unpacked:
        raise ValueError(f"failed to unmarshal extension config resource: type {resource.type_url}")
    typed = config.typed_config
    if not config.HasField("typed_config"):
        raise ValueError(f"typed extension config {config.name} does not contain any typed config")
    network = False
    try:
        if typed.type_url == HTTP_WASM_TYPE:
            wasm: Message = http_wasm_pb2.Wasm.FromString(typed.value)
        elif typed.type_url == NETWORK_WASM_TYPE:
            wasm, network = network_wasm_pb2.Wasm.FromString(typed.value), True
        elif typed.type_url == TYPED_STRUCT_TYPE:
            struct = typed_struct_pb2.TypedStruct.FromString(typed.value)
            if struct.type_url not in (HTTP_WASM_TYPE, NETWORK_WASM_TYPE):
                return config, None, False
            network = struct.type_url == NETWORK_WASM_TYPE
            wasm = network_wasm_pb2.Wasm() if network else http_wasm_pb2.Wasm()
            json_format.ParseDict(json_format.MessageToDict(struct.value), wasm)
        else:
            return config, None, False
    except (DecodeError, json_format.ParseError) as exc:
        raise ValueError(f"failed to unmarshal the Wasm filter of extension config {config.name}: {exc}") from None
    code = wasm.config.vm_config.code  # type: ignore[attr-defined]
    if not code.HasField("remote"):
        if not code.HasField("local"):
            raise ValueError(f"no remote and local load found in Wasm filter of extension config {config.name}")
        return config, None, network
    return config, wasm, network


def _fetch_request(config: extension_pb2.TypedExtensionConfig, wasm: Message) -> tuple[FetchRequest | None, str, str]:
    """Read (and strip) the agent's variables and the remote source: the request, or an error and its status."""
    plugin = wasm.config  # type: ignore[attr-defined]
    vm = plugin.vm_config
    secret: bytes | None = None
    policy, version = UNSPECIFIED, ""
    if vm.HasField("environment_variables"):
        env = vm.environment_variables
        values = env.key_values
        if SECRET_ENV in values:
            if not values[SECRET_ENV]:
                return None, f"cannot fetch Wasm module {plugin.name}: missing image pulling secret", FETCH_FAILURE
            secret = values[SECRET_ENV].encode()
        if values.get(POLICY_ENV) in PULL_POLICIES:
            policy = values[POLICY_ENV]
        version = values.get(RESOURCE_VERSION_ENV, "")
        for key in [k for k in values if k.startswith(AGENT_ENV_PREFIX)]:
            del values[key]
        if not values and not env.host_env_keys:
            vm.ClearField("environment_variables")
    remote = vm.code.remote
    if not remote.HasField("http_uri"):
        return None, (f"wasm remote fetch does not have httpUri specified for config {plugin.name}"), \
            MISS_REMOTE_FETCH_HINT
    checksum = "" if remote.sha256 == "nil" else remote.sha256  # istiod's stand-in for "not set"
    timeout = DEFAULT_FETCH_TIMEOUT
    if remote.http_uri.HasField("timeout"):
        timeout = remote.http_uri.timeout.ToTimedelta().total_seconds()
    return FetchRequest(remote.http_uri.uri, checksum.lower(), config.name, version, policy, secret, timeout,
                        plugin.name), "", ""


def plan(data: bytes, delta: bool) -> EcdsPlan:
    """Decode an ECDS response (DecodeError from protobuf if it is not one) and say what to fetch."""
    response: Message = discovery_pb2.DeltaDiscoveryResponse() if delta else discovery_pb2.DiscoveryResponse()
    response.ParseFromString(data)
    out = EcdsPlan(response, delta)
    for index, resource in enumerate(_resources(response, delta)):
        try:
            config, wasm, network = _unpack(resource)
        except ValueError as exc:
            out.errors.append(str(exc))
            continue
        if wasm is None:
            out.passed += 1
            continue
        request, error, status = _fetch_request(config, wasm)
        out.items.append(_Item(index, config, wasm, network, request, error, status))
    return out


def _resources(response: Message, delta: bool) -> list[any_pb2.Any]:
    if delta:
        return [item.resource for item in response.resources]  # type: ignore[attr-defined]
    return list(response.resources)  # type: ignore[attr-defined]


def _fallback(name: str, network: bool, fail_open: bool) -> extension_pb2.TypedExtensionConfig:
    if network:
        typed: Message = (network_rbac_pb2.RBAC(stat_prefix=ALLOW_STAT_PREFIX) if fail_open else
                          network_rbac_pb2.RBAC(rules=rbac_pb2.RBAC(), stat_prefix=DENY_STAT_PREFIX))
    else:
        typed = (http_rbac_pb2.RBAC(rules_stat_prefix=ALLOW_STAT_PREFIX) if fail_open else
                 http_rbac_pb2.RBAC(rules=rbac_pb2.RBAC(), rules_stat_prefix=DENY_STAT_PREFIX))
    packed = any_pb2.Any()
    packed.Pack(typed)
    return extension_pb2.TypedExtensionConfig(name=name, typed_config=packed)


@dataclass(frozen=True)
class Outcome:
    """What became of one resource: its conversion status, and the failure (for the log) if any."""

    name: str
    status: str
    error: str = ""
    fail_open: bool = False


def finish(ecds: EcdsPlan, results: dict[int, str | Exception]) -> tuple[bytes, list[Outcome]]:
    """The response to forward, with each fetched module as a local file (`results`: index → path or failure)."""
    outcomes = []
    resources = _resources(ecds.response, ecds.delta)
    for item in ecds.items:
        result = results.get(item.index) if item.request is not None else None
        error = item.error or (f"cannot fetch Wasm module {item.request.url}: {result}"
                               if isinstance(result, Exception) and item.request is not None else "")
        if item.request is not None and result is None:
            error = f"cannot fetch Wasm module {item.request.url}: no result"
        if error:
            fail_open = _failure_open(item.wasm)
            new = _fallback(item.config.name, item.network, fail_open)
            outcomes.append(Outcome(item.config.name, item.status or FETCH_FAILURE, error, fail_open))
        else:
            code = item.wasm.config.vm_config.code  # type: ignore[attr-defined]
            code.ClearField("remote")
            code.local.filename = str(result)
            new = extension_pb2.TypedExtensionConfig(name=item.config.name)
            new.typed_config.Pack(item.wasm)
            outcomes.append(Outcome(item.config.name, SUCCESS))
        resources[item.index].Pack(new)
    return bytes(ecds.response.SerializeToString()), outcomes


def nack(ecds: EcdsPlan, version_info: str, errors: list[str]) -> bytes:
    """The NACK upstream sends for an ECDS response it could not convert (INTERNAL, the errors joined)."""
    response: Any = ecds.response
    message = "; ".join(errors)
    if ecds.delta:
        request: Message = discovery_pb2.DeltaDiscoveryRequest(type_url=response.type_url,
                                                               response_nonce=response.nonce)
    else:
        request = discovery_pb2.DiscoveryRequest(type_url=response.type_url, response_nonce=response.nonce,
                                                 version_info=version_info)
    request.error_detail.code = 13  # INTERNAL
    request.error_detail.message = message
    return bytes(request.SerializeToString())

"""WorkloadEntry auto-registration and health, as istiod's `pilot/pkg/autoregistration` decides them; no I/O.

A proxy whose node metadata names `AUTO_REGISTER_GROUP` gets a WorkloadEntry
built from that WorkloadGroup of its namespace when it connects; one whose
metadata names `WORKLOAD_ENTRY` takes control of that existing entry when the
entry has health checks enabled. Upstream's rules, restated:

* the entry is named `<group>-<first IP with ':' as '-'>[-<network>]`, the last
  253 characters when longer; its address is the proxy's first IP
  (`INSTANCE_IPS`, else the node id's; anything there that is not an IP
  address refuses the stream, `proxy.instance_ips`); its labels are the template's, then
  the group's `metadata.labels`, then the proxy's own labels (without
  `istio-locality`); its annotations are `istio.io/autoRegistrationGroup`,
  the group's `metadata.annotations`, and `proxy.istio.io/health-checks-enabled`
  when the proxy runs a readiness probe (its ProxyConfig has one);
* the connecting proxy's verified identity (its token's) must be of the
  entry's namespace and, when the entry names one, its service account; else
  the registration is refused and so is the stream (upstream returns the error
  from the connection's initialisation); a missing group refuses it too;
* connected entries carry `istio.io/workloadController` and
  `istio.io/connectedAt`; when the last connection of an entry goes,
  `istio.io/disconnectedAt` replaces `connectedAt` and, after the grace
  period (`PILOT_WORKLOAD_ENTRY_GRACE_PERIOD`, 10 s), an auto-registered entry
  is deleted and a controlled one loses its health condition; a reconnect
  within the grace period keeps it;
* a HealthInformation request sets the entry's `Healthy` condition (True, or
  False with the error detail's message); an older report never replaces a
  newer one; an entry with health checks enabled is healthy only while that
  condition is True, so a new one is out of EDS until its first good report;
* an auto-registered entry goes with its group (the owner reference's garbage
  collection); a group that comes (back) registers the connections waiting on it.

Time is passed in (seconds since the epoch); `next_deadline()` says when
`expire()` has work.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from istiod_local.controlplane.tokens import TokenIdentity
from istiod_local.controlplane.xds.proxy import Proxy, instance_ips
from istiod_local.controlplane.xds.registry import Registry
from istiod_local.controlplane.xds.workloadgroups import (
    AUTO_REGISTRATION_GROUP,
    CONNECTED_AT,
    DISCONNECTED_AT,
    HEALTH_CHECKS_ENABLED,
    WORKLOAD_CONTROLLER,
    WorkloadEntry,
    WorkloadGroup,
)

log = logging.getLogger("istiod_local.controlplane.wle")

DEFAULT_GRACE_PERIOD = 10.0
DEFAULT_INSTANCE_ID = "istiod-local"
LOCALITY_LABEL = "istio-locality"
MAX_NAME = 253

Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class WorkloadEntryOptions:
    """istiod's switches for this controller (the PILOT_* / ISTIO_* variables named beside each)."""

    grace_period: float = DEFAULT_GRACE_PERIOD  # PILOT_WORKLOAD_ENTRY_GRACE_PERIOD
    auto_registration: bool = True  # PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION
    health_checks: bool = True  # PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS
    validate_identity: bool = True  # ISTIO_WORKLOAD_ENTRY_VALIDATE_IDENTITY


class RegistrationRefused(Exception):
    """The proxy may not register (or control) the entry; `code` is the gRPC status name the stream ends with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class VmProxy:
    """What registration reads from a connecting proxy."""

    id: str
    namespace: str
    ips: tuple[str, ...]
    group: str = ""
    workload_entry: str = ""
    network: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    readiness_probe: bool = False
    locality: str = ""

    @classmethod
    def from_proxy(cls, proxy: Proxy, locality: str = "") -> VmProxy:
        """Upstream's IPAddresses: INSTANCE_IPS when it lists any, else the node id's IP."""
        listed = tuple(instance_ips(proxy.id, proxy.metadata))
        meta = proxy.metadata
        return cls(proxy.id, proxy.namespace, listed or (proxy.ip,), str(meta.get("AUTO_REGISTER_GROUP") or ""),
                   str(meta.get("WORKLOAD_ENTRY") or ""), str(meta.get("NETWORK") or ""),
                   proxy.labels, "readinessProbe" in proxy.proxy_config, locality)

    def is_vm(self, options: WorkloadEntryOptions | None = None) -> bool:
        """A proxy that stands for a WorkloadEntry rather than a pod (with the features that make it one on)."""
        options = options or WorkloadEntryOptions()
        return bool((self.group and options.auto_registration) or (self.workload_entry and options.health_checks))


def entry_name(group: str, ip: str, network: str = "") -> str:
    """Upstream's name for an auto-registered entry: group, IP (':' → '-'), network; the last 253 characters."""
    name = "-".join([group, ip.replace(":", "-"), *([network] if network else [])])
    return name[-MAX_NAME:]


def format_time(now: float) -> str:
    """Go's RFC3339Nano in UTC: fraction without trailing zeros, none when whole."""
    moment = datetime.datetime.fromtimestamp(now, datetime.UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{moment.microsecond:06d}".rstrip("0")
    return f"{text}.{fraction}Z" if fraction else f"{text}Z"


def entry_from_group(name: str, proxy: VmProxy, group: WorkloadGroup) -> WorkloadEntry:
    """The entry upstream creates for `proxy` from `group` (before the connection annotations)."""
    labels = {**group.template.labels, **group.labels}
    if proxy.labels:
        labels.update(proxy.labels)
        labels.pop(LOCALITY_LABEL, None)
    annotations = {AUTO_REGISTRATION_GROUP: group.name, **group.annotations}
    if proxy.readiness_probe:
        annotations[HEALTH_CHECKS_ENABLED] = "true"
    return WorkloadEntry(name, proxy.namespace, proxy.ips[0], labels, dict(group.template.ports),
                         group.template.service_account, proxy.network or group.template.network,
                         proxy.locality or group.template.locality, group.template.weight, annotations)


def check_identity(identity: TokenIdentity | None, entry: WorkloadEntry) -> None:
    """Upstream's ensureProxyCanControlEntry: the verified identity must be the entry's."""
    if identity is None:
        raise RegistrationRefused("UNKNOWN", "registration of WorkloadEntry requires a verified identity "
                                             "(a service-account token on the stream)")
    what = f"registration of WorkloadEntry {entry.namespace}/{entry.name}"
    if identity.namespace != entry.namespace:
        raise RegistrationRefused("UNKNOWN", f"{what}: namespace mismatch: token for {identity.namespace!r}, "
                                             f"entry in {entry.namespace!r}")
    if entry.service_account and identity.service_account != entry.service_account:
        raise RegistrationRefused("UNKNOWN", f"{what}: service account mismatch: token for "
                                             f"{identity.service_account!r}, entry wants {entry.service_account!r}")


@dataclass(frozen=True)
class HealthCondition:
    """The entry's `Healthy` condition as the agent last reported it."""

    healthy: bool
    message: str
    probe_time: float

    def as_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "Healthy", "status": "True" if self.healthy else "False",
                               "lastProbeTime": format_time(self.probe_time),
                               "lastTransitionTime": format_time(self.probe_time)}
        if self.message:
            out["message"] = self.message
        return out


@dataclass
class _Controlled:
    """An entry this control plane created or controls, with its connections and status."""

    auto: bool
    entry: WorkloadEntry  # for a controlled registry entry: that entry (its annotations overlaid in `entries`)
    connections: set[str] = field(default_factory=set)
    connected_at: float | None = None
    disconnected_at: float | None = None
    health: HealthCondition | None = None
    cleanup_at: float | None = None


@dataclass(frozen=True)
class _Waiting:
    proxy: VmProxy
    identity: TokenIdentity | None
    connected_at: float


class AutoRegistration:
    """The WorkloadEntry controller's state: which entries exist, who is connected, their health."""

    def __init__(self, instance_id: str = DEFAULT_INSTANCE_ID, options: WorkloadEntryOptions | None = None) -> None:
        self.options = options or WorkloadEntryOptions()
        self.instance_id = instance_id
        self._entries: dict[Key, _Controlled] = {}
        self._by_connection: dict[str, Key] = {}
        # Every connection of an auto-registering proxy, so a group that comes back registers it again.
        self._auto_connections: dict[str, _Waiting] = {}

    # ---- connections --------------------------------------------------------------------------------------------

    def connect(self, conn_id: str, proxy: VmProxy, identity: TokenIdentity | None, registry: Registry,
                now: float) -> str:
        """Register (or take control of) the proxy's entry; its name, or "" when the proxy is no VM.

        RegistrationRefused when upstream's OnConnect fails (the stream is then refused)."""
        if proxy.group and self.options.auto_registration:
            name = entry_name(proxy.group, proxy.ips[0], proxy.network)
            key = (proxy.namespace, name)
            self._register(key, proxy, identity, registry)
            self._auto_connections[conn_id] = _Waiting(proxy, identity, now)
        elif proxy.workload_entry and self.options.health_checks:
            key = (proxy.namespace, proxy.workload_entry)
            entry = registry.workload_entry(*key)
            if entry is None:
                raise RegistrationRefused("UNKNOWN", f"proxy metadata says it is WorkloadEntry {key[0]}/{key[1]}, "
                                                     "which does not exist")
            if not entry.health_checked:
                return ""
            self._check(identity, entry)
            self._entries.setdefault(key, _Controlled(False, entry))
            log.info("updated health-checked WorkloadEntry %s/%s", *key)
        else:
            return ""
        controlled = self._entries[key]
        controlled.connections.add(conn_id)
        controlled.connected_at, controlled.disconnected_at, controlled.cleanup_at = now, None, None
        self._by_connection[conn_id] = key
        return key[1]

    def _register(self, key: Key, proxy: VmProxy, identity: TokenIdentity | None, registry: Registry) -> None:
        existing = self._entries.get(key)
        if existing is not None:
            self._check(identity, existing.entry)
            if existing.connected_at is None:
                log.info("updated auto-registered WorkloadEntry %s/%s as connected", *key)
            return
        static = registry.workload_entry(*key)
        if static is not None:  # the registry defines it: control it as upstream controls an existing entry
            self._check(identity, static)
            self._entries[key] = _Controlled(False, static)
            return
        group = registry.workload_group(proxy.namespace, proxy.group)
        if group is None:
            raise RegistrationRefused("FAILED_PRECONDITION",
                                      f"auto-registration WorkloadEntry of {proxy.id} failed: "
                                      f"cannot find WorkloadGroup {proxy.namespace}/{proxy.group}")
        entry = entry_from_group(key[1], proxy, group)
        self._check(identity, entry)
        self._entries[key] = _Controlled(True, entry)
        log.info("auto-registered WorkloadEntry %s/%s%s", *key,
                 " with health checking enabled" if entry.health_checked else "")

    def _check(self, identity: TokenIdentity | None, entry: WorkloadEntry) -> None:
        if self.options.validate_identity:
            check_identity(identity, entry)

    def disconnect(self, conn_id: str, now: float) -> None:
        """A stream ended; the entry's last one starts its grace period."""
        self._auto_connections.pop(conn_id, None)
        key = self._by_connection.pop(conn_id, None)
        controlled = self._entries.get(key) if key is not None else None
        if controlled is None:
            return
        controlled.connections.discard(conn_id)
        if controlled.connections:
            return
        controlled.connected_at, controlled.disconnected_at = None, now
        controlled.cleanup_at = now + self.options.grace_period
        log.info("updated %s WorkloadEntry %s/%s as disconnected", "auto-registered" if controlled.auto else
                 "health-checked", *key)  # type: ignore[misc]

    def entry_for(self, conn_id: str) -> str:
        key = self._by_connection.get(conn_id)
        return key[1] if key else ""

    # ---- health -------------------------------------------------------------------------------------------------

    def report_health(self, conn_id: str, healthy: bool, message: str, now: float) -> bool:
        """A HealthInformation request on `conn_id`; True when the entry's condition changed."""
        if not self.options.health_checks:
            return False
        key = self._by_connection.get(conn_id)
        controlled = self._entries.get(key) if key is not None else None
        if controlled is None:
            log.error("unable to derive WorkloadEntry for health update on connection %s", conn_id)
            return False
        previous = controlled.health
        if previous is not None and previous.probe_time > now:
            return False
        condition = HealthCondition(healthy, "" if healthy else message, now)
        controlled.health = condition
        changed = previous is None or (previous.healthy, previous.message) != (condition.healthy, condition.message)
        if changed:
            log.info("WorkloadEntry %s/%s is %s%s", *key, "healthy" if healthy else "unhealthy",  # type: ignore[misc]
                     f": {message}" if message and not healthy else "")
        return changed

    def health(self, namespace: str, name: str) -> HealthCondition | None:
        controlled = self._entries.get((namespace, name))
        return controlled.health if controlled else None

    # ---- time and registry changes --------------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        deadlines = [c.cleanup_at for c in self._entries.values() if c.cleanup_at is not None]
        return min(deadlines) if deadlines else None

    def expire(self, now: float) -> bool:
        """Clean up entries whose grace period has passed; True when something changed."""
        changed = False
        for key, controlled in list(self._entries.items()):
            if controlled.cleanup_at is None or controlled.cleanup_at > now or controlled.connections:
                continue
            # An auto-registered entry is deleted; a controlled registry entry loses its health condition.
            del self._entries[key]
            log.info("cleaned up %s WorkloadEntry %s/%s", "auto-registered" if controlled.auto else "health-checked",
                     *key)
            changed = True
        return changed

    def update_registry(self, registry: Registry, now: float) -> bool:
        """Entries whose group left go; connections waiting on a group that came back register."""
        changed = False
        for key, controlled in list(self._entries.items()):
            group = controlled.entry.auto_registration_group
            if controlled.auto and registry.workload_group(key[0], group) is None:
                for conn_id in controlled.connections:
                    self._by_connection.pop(conn_id, None)
                del self._entries[key]
                log.info("deleted auto-registered WorkloadEntry %s/%s: its WorkloadGroup %s is gone", key[0], key[1],
                         group)
                changed = True
            elif not controlled.auto:
                static = registry.workload_entry(*key)
                if static is None:
                    for conn_id in controlled.connections:
                        self._by_connection.pop(conn_id, None)
                    del self._entries[key]
                    changed = True
                else:
                    controlled.entry = static
        for conn_id, waiting in self._auto_connections.items():
            if conn_id in self._by_connection:
                continue
            try:
                self.connect(conn_id, waiting.proxy, waiting.identity, registry, waiting.connected_at)
                changed = True
            except RegistrationRefused as exc:
                log.debug("late registration of %s: %s", waiting.proxy.id, exc)
        return changed

    # ---- what the mesh sees -------------------------------------------------------------------------------------

    def entries(self, registry: Registry) -> tuple[tuple[WorkloadEntry, bool], ...]:
        """Every WorkloadEntry (the registry's, then auto-registered ones) with whether it is healthy for EDS."""
        out: list[tuple[WorkloadEntry, bool]] = []
        for entry in registry.workload_entries:
            controlled = self._entries.get((entry.namespace, entry.name))
            out.append(self._view(controlled.entry if controlled and not controlled.auto else entry, controlled))
        for key in sorted(self._entries):
            controlled = self._entries[key]
            if controlled.auto and registry.workload_entry(*key) is None:
                out.append(self._view(controlled.entry, controlled))
        return tuple(out)

    def _view(self, entry: WorkloadEntry, controlled: _Controlled | None) -> tuple[WorkloadEntry, bool]:
        health = controlled.health if controlled else None
        if controlled is not None:
            annotations = dict(entry.annotations)
            if controlled.connected_at is not None:
                annotations[WORKLOAD_CONTROLLER] = self.instance_id
                annotations[CONNECTED_AT] = format_time(controlled.connected_at)
            elif controlled.disconnected_at is not None:
                annotations[WORKLOAD_CONTROLLER] = self.instance_id
                annotations[DISCONNECTED_AT] = format_time(controlled.disconnected_at)
            entry = replace(entry, annotations=annotations)
        healthy = not (entry.health_checked and self.options.health_checks) or (health is not None and health.healthy)
        return entry, healthy

    def status(self, registry: Registry) -> list[dict[str, Any]]:
        """Entries as Kubernetes objects would show them (debugging and tests)."""
        out = []
        for entry, healthy in self.entries(registry):
            condition = self.health(entry.namespace, entry.name)
            out.append({"name": entry.name, "namespace": entry.namespace, "address": entry.address,
                        "labels": dict(entry.labels), "annotations": dict(entry.annotations),
                        "serviceAccount": entry.service_account, "healthy": healthy,
                        "conditions": [condition.as_status()] if condition else []})
        return out


"""WorkloadGroups and WorkloadEntries in the registry: the machines that are not pods (VMs, bare metal).

Upstream's `networking.istio.io/v1` WorkloadGroup and WorkloadEntry, with the
registry's flattened shape (`name`/`namespace` beside the spec's own fields,
as `services` and `workloads` are written):

    workloadGroups:
    - name: vm
      namespace: default
      metadata: {labels: {app: vm}, annotations: {}}     # spec.metadata: stamped on every entry
      template: {serviceAccount: vm, ports: {http: 8080}, network: "", labels: {}}
      probe:                                             # sent to the agent as its readinessProbe
        periodSeconds: 5
        failureThreshold: 3
        httpGet: {path: /ready, port: 8080}   # or tcpSocket {host, port}, exec {command}, grpc {port, service}
    workloadEntries:
    - {name: vm-1, namespace: default, address: 10.0.0.5, labels: {app: vm}, serviceAccount: vm,
       ports: {http: 8080}, network: "", locality: region/zone, weight: 1, annotations: {}}

`ports` is upstream's map of port name to number. Parsing is pure and fails
with the line and field, like the rest of the registry (`yamlfields.Fields`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from istio_agent.config.gobool import is_true
from istiod_local.controlplane.xds.yamlfields import (
    DNS_LABEL,
    Fields,
    RegistryError,
    compose,
    dns_label,
    namespaced_items,
)

# The annotation upstream puts on an entry whose proxy runs a readiness probe: its health decides EDS.
HEALTH_CHECKS_ENABLED = "proxy.istio.io/health-checks-enabled"
AUTO_REGISTRATION_GROUP = "istio.io/autoRegistrationGroup"
WORKLOAD_CONTROLLER = "istio.io/workloadController"
CONNECTED_AT = "istio.io/connectedAt"
DISCONNECTED_AT = "istio.io/disconnectedAt"

_PORT_NAME = re.compile(r"^[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$")
_HEADER_NAME = re.compile(r"^[-!#$%&'*+.^_`|~0-9A-Za-z]+$")

_ENTRY = frozenset({"name", "namespace", "address", "labels", "annotations", "ports", "serviceAccount", "network",
                    "locality", "weight"})
_TEMPLATE = frozenset({"address", "labels", "ports", "serviceAccount", "network", "locality", "weight"})
_GROUP = frozenset({"name", "namespace", "metadata", "template", "probe"})
_GROUP_META = frozenset({"labels", "annotations"})
_PROBE = frozenset({"initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold",
                    "failureThreshold", "httpGet", "tcpSocket", "exec", "grpc"})
PROBE_METHODS = ("httpGet", "tcpSocket", "exec", "grpc")
_PROBE_TIMES = ("initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold", "failureThreshold")
_HTTP_GET = frozenset({"path", "port", "host", "scheme", "httpHeaders"})
_HEADER = frozenset({"name", "value"})
_TCP = frozenset({"host", "port"})
_EXEC = frozenset({"command"})
_GRPC = frozenset({"port", "service"})


@dataclass(frozen=True)
class WorkloadEntry:
    """One non-pod workload: an endpoint of every service whose selector matches its labels."""

    name: str
    namespace: str
    address: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    ports: Mapping[str, int] = field(default_factory=dict)
    service_account: str = ""
    network: str = ""
    locality: str = ""
    weight: int = 0
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def health_checked(self) -> bool:
        """Upstream's rule: the annotation, parsed as a Go bool, says whether health decides EDS."""
        return is_true(self.annotations.get(HEALTH_CHECKS_ENABLED, ""))

    @property
    def auto_registration_group(self) -> str:
        return self.annotations.get(AUTO_REGISTRATION_GROUP, "")


@dataclass(frozen=True)
class WorkloadGroup:
    """A template for auto-registered entries, and the probe their agents run."""

    name: str
    namespace: str
    template: WorkloadEntry
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    # The probe as upstream's JSON (camelCase, zero values left out), so it can be sent on unchanged.
    probe: Mapping[str, Any] | None = None




def _address(f: Fields) -> str:
    text = f.string("address", "")
    if not text:
        return ""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return f.fail(f.value_node("address"), "address",  # type: ignore[no-any-return]
                      f"must be an IP address, got {text!r}")


def _ports(f: Fields) -> dict[str, int]:
    if not f.has("ports"):
        return {}
    inner = Fields(f.value_node("ports"), f.child_path("ports"), f.source)
    out = {}
    for name in inner.names():
        if not _PORT_NAME.match(name) or len(name) > 63:
            inner.fail(inner.value_node(name), name, f"not a valid port name: {name!r}")
        out[name] = inner.integer(name, low=1, high=65535)
    return out


def _locality(f: Fields) -> str:
    text = f.string("locality", "")
    if text.count("/") > 2:
        f.fail(f.value_node("locality"), "locality", f"must be region/zone/subzone, got {text!r}")
    return text


def _entry_fields(f: Fields, name: str, namespace: str) -> WorkloadEntry:
    return WorkloadEntry(
        name, namespace, _address(f), f.string_map("labels"), _ports(f), f.string("serviceAccount", ""),
        f.string("network", ""), _locality(f), f.integer("weight", 0, low=0, high=2**32 - 1),
        f.string_map("annotations"),
    )


def parse_workload_entries(top: Fields) -> tuple[WorkloadEntry, ...]:
    out: list[WorkloadEntry] = []
    for f, name, namespace in namespaced_items(top, "workloadEntries", _ENTRY, "workload entry"):
        entry = _entry_fields(f, name, namespace)
        if not entry.address and not entry.network:
            f.fail(f.node, "address", "is required (an entry without one needs a network)")
        if entry.service_account and not DNS_LABEL.match(entry.service_account):
            f.fail(f.value_node("serviceAccount"), "serviceAccount",
                   f"must be a DNS label, got {entry.service_account!r}")
        out.append(entry)
    return tuple(out)


def _probe_int(f: Fields, key: str) -> int:
    return f.integer(key, 0, low=0, high=2**31 - 1)


def _probe(f: Fields) -> dict[str, Any]:
    """A ReadinessProbe checked as upstream's validator does, as upstream's JSON (zero values omitted)."""
    p = Fields(f.value_node("probe"), f.child_path("probe"), f.source, _PROBE)
    out: dict[str, Any] = {}
    for key in _PROBE_TIMES:
        value = _probe_int(p, key)
        if value:
            out[key] = value
    methods = [m for m in PROBE_METHODS if p.has(m)]
    if len(methods) != 1:
        p.fail(p.node, "", f"must have exactly one of {', '.join(PROBE_METHODS)}"
               + (f", got {', '.join(methods)}" if methods else ""))
    method = methods[0]
    m_path, m_node = p.child_path(method), p.value_node(method)
    if method == "httpGet":
        m = Fields(m_node, m_path, f.source, _HTTP_GET)
        action: dict[str, Any] = {}
        for key in ("path", "host"):
            if m.string(key, ""):
                action[key] = m.string(key)
        action["port"] = m.integer("port", low=1, high=65535)
        scheme = m.string("scheme", "")
        if scheme and scheme not in ("HTTP", "HTTPS"):
            m.fail(m.value_node("scheme"), "scheme", f"must be one of HTTP, HTTPS, got {scheme!r}")
        if scheme:
            action["scheme"] = scheme
        headers = []
        for h_path, h_node in m.items("httpHeaders"):
            h = Fields(h_node, h_path, f.source, _HEADER)
            name = h.string("name")
            if not _HEADER_NAME.match(name):
                h.fail(h.value_node("name"), "name", f"not a valid header name: {name!r}")
            headers.append({"name": name, **({"value": h.string("value")} if h.string("value", "") else {})})
        if headers:
            action["httpHeaders"] = headers
    elif method == "tcpSocket":
        m = Fields(m_node, m_path, f.source, _TCP)
        action = {**({"host": m.string("host")} if m.string("host", "") else {}),
                  "port": m.integer("port", low=1, high=65535)}
    elif method == "exec":
        m = Fields(m_node, m_path, f.source, _EXEC)
        command = [value for _, _, value in m.string_list("command", required=True)]
        action = {"command": command}
    else:
        m = Fields(m_node, m_path, f.source, _GRPC)
        action = {"port": m.integer("port", low=1, high=65535)}
        if m.string("service", ""):
            action["service"] = m.string("service")
    out[method] = action
    return out


def _group(f: Fields, name: str, namespace: str) -> WorkloadGroup:
    """A group's spec fields (`metadata`, `template`, `probe`) from `f`."""
    if not f.has("template"):
        f.fail(f.node, "template", "is required")
    t = Fields(f.value_node("template"), f.child_path("template"), f.source, _TEMPLATE)
    template = _entry_fields(t, "", namespace)
    account = template.service_account or "default"  # istioctl's default for an empty one
    if not DNS_LABEL.match(account):
        t.fail(t.value_node("serviceAccount"), "serviceAccount", f"must be a DNS label, got {account!r}")
    template = WorkloadEntry("", namespace, template.address, template.labels, template.ports, account,
                             template.network, template.locality, template.weight)
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if f.has("metadata"):
        meta = Fields(f.value_node("metadata"), f.child_path("metadata"), f.source, _GROUP_META)
        labels, annotations = meta.string_map("labels"), meta.string_map("annotations")
    probe = _probe(f) if f.has("probe") else None
    return WorkloadGroup(name, namespace, template, labels, annotations, probe)


def parse_workload_groups(top: Fields) -> tuple[WorkloadGroup, ...]:
    out: list[WorkloadGroup] = []
    for f, name, namespace in namespaced_items(top, "workloadGroups", _GROUP, "workload group"):
        out.append(_group(f, name, namespace))
    return tuple(out)


_OBJECT = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})


def parse_workload_group_object(text: str, source: str,
                                namespace: str = "") -> tuple[WorkloadGroup, dict[str, str]]:
    """A Kubernetes WorkloadGroup object (istioctl's `-f workloadgroup.yaml`): the group, the object's annotations.

    `namespace` is used when the object names none (as kubectl's -n)."""
    root = compose(text, source)
    if root is None:
        raise RegistryError(source, 0, "", "no document")
    top = Fields(root, "", source, _OBJECT)
    kind = top.string("kind", "WorkloadGroup")
    if kind != "WorkloadGroup":
        top.fail(top.value_node("kind"), "kind", f"must be WorkloadGroup, got {kind!r}")
    if not top.has("metadata"):
        top.fail(top.node, "metadata", "is required")
    meta = Fields(top.value_node("metadata"), "metadata", source)
    name = dns_label(meta, "name")
    ns = dns_label(meta, "namespace", namespace or "default")
    if not top.has("spec"):
        top.fail(top.node, "spec", "is required")
    spec = Fields(top.value_node("spec"), "spec", source, _GROUP - {"name", "namespace"})
    return _group(spec, name, ns), meta.string_map("annotations")

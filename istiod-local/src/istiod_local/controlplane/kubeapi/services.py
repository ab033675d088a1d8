"""Services, EndpointSlices and Nodes as a cluster would show them for the registry's services and pods (pure).

A real istiod learns a Kubernetes mesh from these: a Service gives the host
(`name.namespace.svc.cluster.local`), its ports and their protocols; the
EndpointSlices the endpoint controller keeps give each ready pod's address
with a `targetRef` to the pod, through which istiod finds the pod's labels
and service account (the identity its clients expect, the inbound listeners
of the pod's sidecar); the Node gives the locality. So istiod-local renders
them from the registry as the control-plane controllers of a cluster would:

- a Service per registry service (type ClusterIP, its `clusterIP`, each port
  with its `targetPort` and, from the registry's protocol, `appProtocol`,
  which istiod reads before the port name);
- one EndpointSlice per service (`<service>-istiod-local`, label
  `kubernetes.io/service-name`, IPv4): every served pod of its namespace its
  selector matches that has an IP, `ready` as the pod's Ready condition says
  (the node reports it through pods/status, as a kubelet does);
- a Node for the default node name and each node a workload names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from istiod_local.controlplane.kubeapi.resources import ENDPOINTSLICES, NODES, SERVICES
from istiod_local.controlplane.xds.registry import Registry, Service

Key = tuple[str, str]  # (namespace, name); "" for a cluster-scoped object
# The uid and creationTimestamp of the object of a type at a key: the store's, or new ones.
Dated = Callable[[str, Key], tuple[str, str]]

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "endpointslice-controller.k8s.io"
SLICE_SUFFIX = "-istiod-local"
APP_PROTOCOLS = {"HTTP": "http", "HTTP2": "http2", "GRPC": "grpc", "TCP": "tcp"}


def render_service(service: Service, uid: str, created: str) -> dict[str, Any]:
    ports = [{"name": p.name, "port": p.port, "targetPort": p.target_port, "protocol": "TCP",
              **({"appProtocol": APP_PROTOCOLS[p.protocol]} if p.protocol in APP_PROTOCOLS else {})}
             for p in service.ports]
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": service.name, "namespace": service.namespace, "uid": uid,
                         "creationTimestamp": created},
            "spec": {"type": "ClusterIP", "clusterIP": service.cluster_ip, "clusterIPs": [service.cluster_ip],
                     "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "ports": ports,
                     "selector": dict(service.selector), "sessionAffinity": "None",
                     "internalTrafficPolicy": "Cluster"},
            "status": {"loadBalancer": {}}}


def pod_ready(pod: Mapping[str, Any]) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def selects(service: Service, pod: Mapping[str, Any]) -> bool:
    """Whether the service's selector picks the pod (same namespace; a service without a selector picks none)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    return bool(service.selector) and meta.get("namespace") == service.namespace and \
        all(labels.get(k) == v for k, v in service.selector.items())


def slice_name(service: Service) -> str:
    return f"{service.name}{SLICE_SUFFIX}"


def render_endpointslice(service: Service, pods: Iterable[Mapping[str, Any]], uid: str, created: str,
                         service_uid: str) -> dict[str, Any]:
    endpoints = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        ip = (pod.get("status") or {}).get("podIP")
        if not ip or not selects(service, pod):
            continue
        meta = pod["metadata"]
        ready = pod_ready(pod)
        endpoints.append({"addresses": [ip],
                          "conditions": {"ready": ready, "serving": ready, "terminating": False},
                          "nodeName": (pod.get("spec") or {}).get("nodeName", ""),
                          "targetRef": {"kind": "Pod", "namespace": meta["namespace"], "name": meta["name"],
                                        "uid": meta.get("uid", "")}})
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": slice_name(service), "namespace": service.namespace, "uid": uid,
                         "creationTimestamp": created,
                         "labels": {SERVICE_NAME_LABEL: service.name, MANAGED_BY_LABEL: MANAGED_BY},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service.name,
                                              "uid": service_uid, "controller": True, "blockOwnerDeletion": True}]},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": p.name, "port": p.target_port, "protocol": "TCP",
                       **({"appProtocol": APP_PROTOCOLS[p.protocol]} if p.protocol in APP_PROTOCOLS else {})}
                      for p in service.ports]}


def render_node(name: str, host_ip: str, uid: str, created: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": uid, "creationTimestamp": created,
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
            "spec": {},
            "status": {"addresses": [{"type": "InternalIP", "address": host_ip}, {"type": "Hostname",
                                                                                    "address": name}],
                       "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": created,
                                       "lastTransitionTime": created, "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status"}]}}


def node_names(registry: Registry, default_node: str) -> set[str]:
    return {default_node} | {w.node_name for w in registry.workloads if w.node_name}


def derived_objects(registry: Registry, pods: Sequence[Mapping[str, Any]], dated: Dated, default_node: str,
                    host_ip: str) -> dict[str, dict[Key, dict[str, Any]]]:
    """Every Service, EndpointSlice and Node the registry and the served pods make, by type and key."""
    out: dict[str, dict[Key, dict[str, Any]]] = {SERVICES: {}, ENDPOINTSLICES: {}, NODES: {}}
    for service in registry.services:
        key = (service.namespace, service.name)
        uid, created = dated(SERVICES, key)
        out[SERVICES][key] = render_service(service, uid, created)
        slice_key = (service.namespace, slice_name(service))
        slice_uid, slice_created = dated(ENDPOINTSLICES, slice_key)
        out[ENDPOINTSLICES][slice_key] = render_endpointslice(service, pods, slice_uid, slice_created, uid)
    for name in node_names(registry, default_node):
        uid, created = dated(NODES, ("", name))
        out[NODES]["", name] = render_node(name, host_ip, uid, created)
    return out


def refreshed_slices(registry: Registry, changed: Iterable[Mapping[str, Any]],
                     pods: Mapping[Key, Any], dated: Dated) -> dict[Key, dict[str, Any]]:
    """The EndpointSlices of the services that select one of the `changed` pods, rendered again from `pods`
    (the store's entries by (namespace, name), each with its served object as `.current`)."""
    changed = list(changed)
    affected = [s for s in registry.services if any(selects(s, pod) for pod in changed)]
    if not affected:
        return {}
    namespaces = {s.namespace for s in affected}
    current = [entry.current for (namespace, _), entry in pods.items() if namespace in namespaces]
    out: dict[Key, dict[str, Any]] = {}
    for service in affected:
        service_uid, _ = dated(SERVICES, (service.namespace, service.name))
        key = (service.namespace, slice_name(service))
        uid, created = dated(ENDPOINTSLICES, key)
        out[key] = render_endpointslice(service, current, uid, created, service_uid)
    return out

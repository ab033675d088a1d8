"""Registry workloads as the Pods Istio's sidecar injector would have written (pure).

A workload becomes the Pod a Deployment's pod looks like after injection with
the default `sidecar` template (`envoy`), the `grpc-agent` template
(`proxyless`), the `gateway` template (`router`: `proxy router`, no init
container, no capture, the unprivileged-ports sysctl), or none at all
(`none`): the labels and annotations the
injector adds (`sidecar.istio.io/status`, `kubectl.kubernetes.io/default-container`,
`prometheus.io/*`, the capture annotations in CNI mode), the `istio-proxy`
container with its arguments, env (fieldRef where the injector uses the
downward API), port, readiness probe and securityContext, and the init
container: `istio-validation` when the CNI captures (`captureInit: cni`, the
default) or `istio-init` (`captureInit: init`). The app container comes first
and carries the ports of the services that select the workload.

The workload's `annotations` are merged over the rendered ones (and, as the
injector reads them, shape the capture arguments), then its `pod` overlay is
deep-merged last (maps merge; containers, init containers and env merge by
name). Status says Running and ready with the validation passed, until the
node reports otherwise through PATCH .../status.

Nothing here reads a clock or a file: the uid, creation time and default
node are given.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from istio_agent.version import ISTIO_COMPAT_VERSION
from istiod_local.controlplane.kubeapi.patch import strategic_merge_patch
from istiod_local.controlplane.xds.registry import Registry, Workload

PROXY_IMAGE = f"docker.io/istio/proxyv2:{ISTIO_COMPAT_VERSION}"
APP_IMAGE = "docker.io/istio/app:latest"
APP_CONTAINER = "app"
PROXY_UID = "1337"
STATUS_PORT = "15020"
DEFAULT_HOST_IP = "127.0.0.1"
SIDECAR_STATUS = "sidecar.istio.io/status"
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet of Kubernetes' generated name suffixes

ENVOY_VOLUMES = ("workload-socket", "credential-socket", "workload-certs", "istio-envoy", "istio-data",
                 "istio-podinfo", "istio-token", "istiod-ca-cert", "istio-ca-crl")
PROXYLESS_VOLUMES = ("workload-socket", "workload-certs", "istio-xds", "istio-data", "istio-podinfo",
                     "istio-token", "istiod-ca-cert")


@dataclass(frozen=True)
class PodMeta:
    """What the API server (not the registry) decides about a pod."""

    uid: str
    created: str  # RFC 3339, e.g. 2026-12-01T12:00:00Z
    default_node: str
    host_ip: str = DEFAULT_HOST_IP


def _field_ref(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}


def _resource_ref(name: str, resource: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"resourceFieldRef": {"divisor": "1", "resource": resource}}}


def _app_ports(registry: Registry, workload: Workload) -> list[dict[str, Any]]:
    ports: dict[int, dict[str, Any]] = {}
    for service in registry.services:
        if service.namespace == workload.namespace and service.selects(workload.labels):
            for port in service.ports:
                entry: dict[str, Any] = {"containerPort": port.target_port, "protocol": "TCP"}
                if port.name:
                    entry["name"] = port.name
                ports.setdefault(port.target_port, entry)
    return [ports[p] for p in sorted(ports)]


def _canonical_name(workload: Workload) -> str:
    labels = workload.labels
    name = (labels.get("service.istio.io/canonical-name") or labels.get("app.kubernetes.io/name")
            or labels.get("app") or workload.name)
    return name[:63].strip("-_.")


def _canonical_revision(workload: Workload) -> str:
    labels = workload.labels
    return (labels.get("service.istio.io/canonical-revision") or labels.get("app.kubernetes.io/version")
            or labels.get("version") or "latest")


def _capture_args(ann: Mapping[str, str], cni: bool) -> list[str]:
    """istio-iptables' arguments as the injector writes them for istio-validation / istio-init."""
    args = ["istio-iptables", "-p", "15001", "-z", "15006", "-u", PROXY_UID,
            "-m", ann.get("sidecar.istio.io/interceptionMode", "REDIRECT"),
            "-i", ann.get("traffic.sidecar.istio.io/includeOutboundIPRanges", "*"),
            "-x", ann.get("traffic.sidecar.istio.io/excludeOutboundIPRanges", ""),
            "-b", ann.get("traffic.sidecar.istio.io/includeInboundPorts", "*"),
            "-d", _exclude_inbound(ann, "15090,15021")]
    for flag, key in (("-q", "traffic.sidecar.istio.io/includeOutboundPorts"),
                      ("-o", "traffic.sidecar.istio.io/excludeOutboundPorts")):
        if key in ann:
            args += [flag, ann[key]]
    for key in ("istio.io/reroute-virtual-interfaces", "traffic.sidecar.istio.io/kubevirtInterfaces"):
        if key in ann:
            args += ["-k", ann[key]]
            break
    if "traffic.sidecar.istio.io/excludeInterfaces" in ann:
        args += ["-c", ann["traffic.sidecar.istio.io/excludeInterfaces"]]
    args.append(f"--log_output_level={ann.get('sidecar.istio.io/agentLogLevel', 'default:info')}")
    if cni:
        args += ["--run-validation", "--skip-rule-apply"]
    return args


def _exclude_inbound(ann: Mapping[str, str], prefix: str = "") -> str:
    """The injector's excludeInboundPort: the status port joined to the annotation's list."""
    status = ann.get("status.sidecar.istio.io/port", STATUS_PORT)
    extra = ann.get("traffic.sidecar.istio.io/excludeInboundPorts", "")
    ports = [p for p in ([status] if status != "0" else []) + [p.strip() for p in extra.split(",")] if p]
    joined = ",".join(dict.fromkeys(ports))
    return ",".join(p for p in (prefix, joined) if p)


def _init_container(ann: Mapping[str, str], cni: bool) -> dict[str, Any]:
    if cni:
        security = {"allowPrivilegeEscalation": False, "privileged": False,
                    "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True,
                    "runAsGroup": 1337, "runAsNonRoot": True, "runAsUser": 1337}
    else:
        security = {"allowPrivilegeEscalation": False, "privileged": False,
                    "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
                    "readOnlyRootFilesystem": False, "runAsGroup": 0, "runAsNonRoot": False, "runAsUser": 0}
    return {
        "name": "istio-validation" if cni else "istio-init",
        "image": PROXY_IMAGE,
        "args": _capture_args(ann, cni),
        "imagePullPolicy": "IfNotPresent",
        "resources": {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": security,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


def _proxy_env(registry: Registry, workload: Workload, ann: Mapping[str, str], app_ports: list[dict[str, Any]],
               proxyless: bool) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []
    if proxyless:
        env += [{"name": "ISTIO_META_GENERATOR", "value": "grpc"},
                {"name": "OUTPUT_CERTS", "value": "/var/lib/istio/data"}]
    if registry.inbound_traffic_policy == "LOCALHOST":
        env.append({"name": "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", "value": "true"})
    env += [
        {"name": "PILOT_CERT_PROVIDER", "value": "istiod"},
        {"name": "CA_ADDR", "value": "istiod.istio-system.svc:15012"},
        _field_ref("POD_NAME", "metadata.name"),
        _field_ref("POD_NAMESPACE", "metadata.namespace"),
        _field_ref("INSTANCE_IP", "status.podIP"),
        _field_ref("SERVICE_ACCOUNT", "spec.serviceAccountName"),
        _field_ref("HOST_IP", "status.hostIP"),
    ]
    if not proxyless:
        env.append(_resource_ref("ISTIO_CPU_LIMIT", "limits.cpu"))
    env += [
        {"name": "PROXY_CONFIG", "value": json.dumps({"discoveryAddress": "istiod.istio-system.svc:15012"},
                                                     separators=(",", ":")) + "\n"},
        {"name": "ISTIO_META_POD_PORTS", "value": _pod_ports_value(app_ports)},
        {"name": "ISTIO_META_APP_CONTAINERS", "value": APP_CONTAINER},
    ]
    if not proxyless:
        env.append(_resource_ref("GOMEMLIMIT", "limits.memory"))
    env += [
        {"name": "ISTIO_META_CLUSTER_ID", "value": "Kubernetes"},
        _field_ref("ISTIO_META_NODE_NAME", "spec.nodeName"),
    ]
    if not proxyless:
        env.append({"name": "ISTIO_META_INTERCEPTION_MODE",
                    "value": ann.get("sidecar.istio.io/interceptionMode", "REDIRECT")})
    workload_name = workload.labels.get("service.istio.io/workload-name", workload.name)
    env += [
        {"name": "ISTIO_META_WORKLOAD_NAME", "value": workload_name},
        {"name": "ISTIO_META_OWNER",
         "value": f"kubernetes://apis/apps/v1/namespaces/{workload.namespace}/deployments/{workload.name}"},
        {"name": "ISTIO_META_MESH_ID", "value": registry.trust_domain},
        {"name": "TRUST_DOMAIN", "value": registry.trust_domain},
    ]
    if proxyless:
        env += [{"name": "ISTIO_META_DNS_CAPTURE", "value": "false"}, {"name": "DISABLE_ENVOY", "value": "true"}]
    return env


def _pod_ports_value(app_ports: list[dict[str, Any]]) -> str:
    """ISTIO_META_POD_PORTS as the injection template lays it out: `[`, each port's compact JSON (Go's field
    order: name, containerPort, protocol) on its own line indented four spaces, the comma leading every port
    after the first, then `]` on its own line."""
    lines = []
    for index, port in enumerate(app_ports):
        ordered = {k: port[k] for k in ("name", "hostPort", "containerPort", "protocol", "hostIP") if k in port}
        lines.append("    " + ("," if index else "") + json.dumps(ordered, separators=(",", ":")))
    return "\n".join(["[", *lines, "]"])


def _probe(port: int, initial_delay: int, period: int, failure_threshold: int) -> dict[str, Any]:
    """An httpGet probe of /healthz/ready as the apiserver serves it (scheme and successThreshold defaulted,
    a zero initialDelaySeconds left out)."""
    probe: dict[str, Any] = {"failureThreshold": failure_threshold,
                             "httpGet": {"path": "/healthz/ready", "port": port, "scheme": "HTTP"}}
    if initial_delay:
        probe["initialDelaySeconds"] = initial_delay
    probe.update(periodSeconds=period, successThreshold=1, timeoutSeconds=3)
    return probe


def _int_annotation(ann: Mapping[str, str], key: str, default: int) -> int:
    try:
        return int(ann.get(key, default))
    except ValueError:
        return default


def _proxy_container(registry: Registry, workload: Workload, ann: Mapping[str, str],
                     app_ports: list[dict[str, Any]], proxyless: bool) -> dict[str, Any]:
    tproxy = ann.get("sidecar.istio.io/interceptionMode") == "TPROXY"
    security: dict[str, Any] = {"allowPrivilegeEscalation": False, "privileged": False,
                                "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}
    if tproxy and not proxyless:
        security["capabilities"] = {"add": ["NET_ADMIN"], "drop": ["ALL"]}
        security.update(runAsNonRoot=False, runAsUser=0, runAsGroup=1337)
    else:
        security.update(runAsGroup=1337, runAsNonRoot=True, runAsUser=1337)
    probe_port = 15020 if proxyless else 15021
    mounts = [{"mountPath": "/var/run/secrets/workload-spiffe-uds", "name": "workload-socket"}]
    if not proxyless:
        mounts.append({"mountPath": "/var/run/secrets/credential-uds", "name": "credential-socket"})
    mounts += [{"mountPath": "/var/run/secrets/workload-spiffe-credentials", "name": "workload-certs"},
               {"mountPath": "/var/run/secrets/istio", "name": "istiod-ca-cert"}]
    if not proxyless:
        mounts.append({"mountPath": "/var/run/secrets/istio/crl", "name": "istio-ca-crl"})
    mounts += [{"mountPath": "/var/lib/istio/data", "name": "istio-data"},
               {"mountPath": "/etc/istio/proxy", "name": "istio-xds" if proxyless else "istio-envoy"},
               {"mountPath": "/var/run/secrets/tokens", "name": "istio-token"},
               {"mountPath": "/etc/istio/pod", "name": "istio-podinfo"},
               _api_access_mount(workload)]
    container: dict[str, Any] = {
        "name": "istio-proxy",
        "image": PROXY_IMAGE,
        "args": ["proxy", "sidecar", "--domain", f"$(POD_NAMESPACE).svc.{registry.domain_suffix}",
                 f"--proxyLogLevel={ann.get('sidecar.istio.io/logLevel', 'warning')}",
                 f"--proxyComponentLogLevel={ann.get('sidecar.istio.io/componentLogLevel', 'misc:error')}",
                 f"--log_output_level={ann.get('sidecar.istio.io/agentLogLevel', 'default:info')}"],
        "env": _proxy_env(registry, workload, ann, app_ports, proxyless),
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"containerPort": 15020, "name": "mesh-metrics", "protocol": "TCP"}] if proxyless
        else [{"containerPort": 15090, "name": "http-envoy-prom", "protocol": "TCP"}],
        "resources": {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": security,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": mounts,
    }
    # The sidecar template probes only while the status port is not 0 (`status.sidecar.istio.io/port`), with a
    # startup probe first (`global.proxy.startupProbe`, enabled with failureThreshold 600 by default) and the
    # readiness probe's timing from the `readiness.status.sidecar.istio.io/*` annotations or the chart's
    # defaults (0 s delay, 15 s period, 4 failures); the proxyless template always has the readiness probe.
    if proxyless or ann.get("status.sidecar.istio.io/port", STATUS_PORT) != "0":
        if not proxyless:
            container["startupProbe"] = _probe(probe_port, 0, 1, 600)
        container["readinessProbe"] = _probe(
            probe_port, _int_annotation(ann, "readiness.status.sidecar.istio.io/initialDelaySeconds", 0),
            _int_annotation(ann, "readiness.status.sidecar.istio.io/periodSeconds", 15),
            _int_annotation(ann, "readiness.status.sidecar.istio.io/failureThreshold", 4))
    if proxyless:
        container["lifecycle"] = {"postStart": {"exec": {"command": [
            "pilot-agent", "wait", "--url=http://localhost:15020/healthz/ready"]}}}
    return container


def _api_access_mount(workload: Workload) -> dict[str, Any]:
    return {"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "name": _api_access_volume(workload),
            "readOnly": True}


def _api_access_volume(workload: Workload) -> str:
    """The token volume's name; Kubernetes adds five random characters, here derived from the pod's name."""
    digest = hashlib.sha256(f"{workload.namespace}/{workload.name}".encode()).digest()
    return "kube-api-access-" + "".join(_NAME_CHARS[b % len(_NAME_CHARS)] for b in digest[:5])


def _volumes(workload: Workload, proxyless: bool | None) -> list[dict[str, Any]]:
    """The injector's volumes (None: a plain pod, only the service-account token volume)."""
    api_access = {"name": _api_access_volume(workload), "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"items": [{"key": "ca.crt", "path": "ca.crt"}], "name": "kube-root-ca.crt"}},
        {"downwardAPI": {"items": [{"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                    "path": "namespace"}]}}]}}
    if proxyless is None:
        return [api_access]
    volumes: list[dict[str, Any]] = [{"emptyDir": {}, "name": "workload-socket"}]
    if not proxyless:
        volumes.append({"emptyDir": {}, "name": "credential-socket"})
    volumes += [
        {"emptyDir": {}, "name": "workload-certs"},
        {"emptyDir": {"medium": "Memory"}, "name": "istio-xds" if proxyless else "istio-envoy"},
        {"emptyDir": {}, "name": "istio-data"},
        {"downwardAPI": {"defaultMode": 420, "items": [
            {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.labels"}, "path": "labels"},
            {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.annotations"}, "path": "annotations"}]},
         "name": "istio-podinfo"},
        {"name": "istio-token", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"audience": "istio-ca", "expirationSeconds": 43200, "path": "istio-token"}}]}},
        {"configMap": {"defaultMode": 420, "name": "istio-ca-root-cert"}, "name": "istiod-ca-cert"},
    ]
    if not proxyless:
        volumes.append({"configMap": {"defaultMode": 420, "name": "istio-ca-crl", "optional": True},
                        "name": "istio-ca-crl"})
    return [*volumes, api_access]


def _injected_annotations(workload: Workload, proxyless: bool, cni: bool, router: bool = False) -> dict[str, str]:
    user = workload.annotations
    ann: dict[str, str] = {"istio.io/rev": "default",
                           "kubectl.kubernetes.io/default-container": APP_CONTAINER,
                           "kubectl.kubernetes.io/default-logs-container": APP_CONTAINER}
    if proxyless:
        ann["sidecar.istio.io/rewriteAppHTTPProbers"] = "false"
    else:
        ann.update({"prometheus.io/path": "/stats/prometheus", "prometheus.io/port": STATUS_PORT,
                    "prometheus.io/scrape": "true"})
        if cni:
            ann["sidecar.istio.io/interceptionMode"] = user.get("sidecar.istio.io/interceptionMode", "REDIRECT")
            ann["traffic.sidecar.istio.io/includeOutboundIPRanges"] = user.get(
                "traffic.sidecar.istio.io/includeOutboundIPRanges", "*")
            if user.get("traffic.sidecar.istio.io/excludeOutboundIPRanges"):
                ann["traffic.sidecar.istio.io/excludeOutboundIPRanges"] = user[
                    "traffic.sidecar.istio.io/excludeOutboundIPRanges"]
            ann["traffic.sidecar.istio.io/includeInboundPorts"] = user.get(
                "traffic.sidecar.istio.io/includeInboundPorts", "*")
            ann["traffic.sidecar.istio.io/excludeInboundPorts"] = _exclude_inbound(user)
    status = {"initContainers": [] if proxyless else ["istio-validation" if cni else "istio-init"],
              "containers": ["istio-proxy"],
              "volumes": list(PROXYLESS_VOLUMES if proxyless else ENVOY_VOLUMES),
              "imagePullSecrets": None, "revision": "default"}
    if proxyless or router:
        status["initContainers"] = None
    ann[SIDECAR_STATUS] = json.dumps(status, separators=(",", ":"))
    return ann


def _conditions(created: str) -> list[dict[str, Any]]:
    return [{"lastProbeTime": None, "lastTransitionTime": created, "status": "True", "type": kind}
            for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")]


def _running(name: str, image: str, created: str, uid: str) -> dict[str, Any]:
    return {"containerID": f"containerd://{uid.replace('-', '')}{name}"[:77], "image": image,
            "imageID": f"{image}@sha256:{'0' * 64}", "lastState": {}, "name": name, "ready": True,
            "restartCount": 0, "started": True, "state": {"running": {"startedAt": created}}}


def _completed(name: str, image: str, created: str, uid: str) -> dict[str, Any]:
    return {"containerID": f"containerd://{uid.replace('-', '')}{name}"[:77], "image": image,
            "imageID": f"{image}@sha256:{'0' * 64}", "lastState": {}, "name": name, "ready": True,
            "restartCount": 0, "started": False,
            "state": {"terminated": {"containerID": f"containerd://{uid.replace('-', '')}{name}"[:77],
                                     "exitCode": 0, "finishedAt": created, "reason": "Completed",
                                     "startedAt": created}}}


def merge_pod_overlay(pod: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge a partial Pod: maps merge, containers/initContainers/env (and other keyed lists) by key."""
    merged = strategic_merge_patch(pod, overlay)
    assert isinstance(merged, dict)
    return merged


def render_inputs(registry: Registry, workload: Workload) -> tuple[Any, ...]:
    """Everything of the registry `render_pod` reads for `workload` (equal inputs render equal pods)."""
    return (workload, registry.trust_domain, registry.domain_suffix, registry.inbound_traffic_policy,
            _app_ports(registry, workload))


def render_pod(registry: Registry, workload: Workload, meta: PodMeta) -> dict[str, Any]:
    """The Pod object for one workload (a fresh dict each call)."""
    injected = workload.sidecar != "none"
    proxyless = workload.sidecar == "proxyless"
    router = workload.sidecar == "router"  # a gateway: captures nothing, so no capture or init container
    cni = workload.capture_init == "cni" and not router
    labels = dict(workload.labels)
    annotations: dict[str, str] = {}
    if injected:
        if not proxyless and not router:
            labels.setdefault("security.istio.io/tlsMode", "istio")
        labels.setdefault("service.istio.io/canonical-name", _canonical_name(workload))
        labels.setdefault("service.istio.io/canonical-revision", _canonical_revision(workload))
        annotations = _injected_annotations(workload, proxyless, cni, router)
    annotations.update(workload.annotations)
    app_ports = _app_ports(registry, workload)
    app: dict[str, Any] = {"name": APP_CONTAINER, "image": APP_IMAGE, "imagePullPolicy": "IfNotPresent",
                           "resources": {}, "terminationMessagePath": "/dev/termination-log",
                           "terminationMessagePolicy": "File", "volumeMounts": [_api_access_mount(workload)]}
    if app_ports:
        app["ports"] = app_ports
    containers = [app]
    init_containers: list[dict[str, Any]] = []
    if injected:
        proxy = _proxy_container(registry, workload, workload.annotations, app_ports, proxyless)
        if router:
            proxy["args"][1] = "router"
        containers.append(proxy)
        if not proxyless and not router:
            init_containers.append(_init_container(workload.annotations, cni))
    node = workload.node_name or meta.default_node
    spec: dict[str, Any] = {
        "containers": containers,
        "dnsPolicy": "ClusterFirst",
        "enableServiceLinks": True,
        "nodeName": node,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "securityContext": {"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]}
        if router else {},
        "serviceAccount": workload.service_account,
        "serviceAccountName": workload.service_account,
        "terminationGracePeriodSeconds": 30,
        "tolerations": [
            {"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists",
             "tolerationSeconds": 300},
            {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists",
             "tolerationSeconds": 300}],
        "volumes": _volumes(workload, proxyless if injected else None),
    }
    if init_containers:
        spec["initContainers"] = init_containers
    status: dict[str, Any] = {
        "conditions": _conditions(meta.created),
        "containerStatuses": [_running(c["name"], c["image"], meta.created, meta.uid) for c in containers],
        "hostIP": meta.host_ip,
        "hostIPs": [{"ip": meta.host_ip}],
        "phase": "Running",
        "qosClass": "Burstable" if injected else "BestEffort",
        "startTime": meta.created,
    }
    if workload.ip:
        status["podIP"] = workload.ip
        status["podIPs"] = [{"ip": workload.ip}]
    if init_containers:
        status["initContainerStatuses"] = [_completed(c["name"], c["image"], meta.created, meta.uid)
                                           for c in init_containers]
    metadata: dict[str, Any] = {
        "name": workload.name,
        "namespace": workload.namespace,
        "uid": meta.uid,
        "creationTimestamp": meta.created,
        "labels": labels,
    }
    if annotations:
        metadata["annotations"] = annotations
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
                           "status": status}
    if workload.pod:
        pod = merge_pod_overlay(pod, copy.deepcopy(dict(workload.pod)))
        # Identity is the registry's and the API server's, whatever the overlay says.
        pod.update(apiVersion="v1", kind="Pod")
        pod["metadata"].pop("resourceVersion", None)
        pod["metadata"].update(name=workload.name, namespace=workload.namespace, uid=meta.uid,
                               creationTimestamp=meta.created)
    return pod


def render_namespace(name: str, labels: Mapping[str, str], uid: str, created: str) -> dict[str, Any]:
    """A Namespace as the apiserver shows it (the `kubernetes.io/metadata.name` label it always adds)."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "uid": uid, "creationTimestamp": created,
                         "labels": {"kubernetes.io/metadata.name": name, **labels}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}

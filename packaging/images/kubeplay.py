"""An injected Pod (as the API server returns it) made runnable by `podman kube play` (pure: no I/O).

podman's kube play runs a Pod spec much as a kubelet would, but lacks pieces the
injected pod uses. `for_podman` resolves exactly those, the way the kubelet
would have before starting the containers, and says what it resolved:

- env `fieldRef`s podman refuses (it knows `metadata.name`, `metadata.uid` and
  single labels/annotations): `metadata.namespace`, `spec.serviceAccountName`,
  `spec.nodeName`, `status.podIP`, `status.hostIP` become literal values read from
  the Pod object, with the IP podman will give the pod (the kubelet reads
  them from the same object once the sandbox has its IP);
- `downwardAPI` volumes (`istio-podinfo`): files written in the kubelet's format;
- `projected` volumes (the `istio-token` and `kube-api-access-*` ones): the
  service-account token (what the kubelet gets from the TokenRequest API; here
  istiod-local issues it), the ConfigMap item and the downward-API item, as files;
- `emptyDir`: a directory of mode 0777, as the kubelet makes it (podman's is root's and
  0755, which the istio-proxy container, uid 1337, cannot write);

each of the last three as a hostPath volume onto a directory the caller creates from
`Plan.files` and `Plan.dirs`. Not kubelet work, and said so in the notes: the
images are replaced (Istio's `proxyv2` by ours, the app's by ours with a command),
the ConfigMaps the pod mounts are given as documents beside it, and `hostAliases`
stands in for the cluster DNS name of istiod.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# fieldPaths podman kube play resolves itself (tested against podman 4.3); the rest it refuses.
PODMAN_FIELD_PATHS = ("metadata.name", "metadata.uid")
PODMAN_FIELD_PREFIXES = ("metadata.labels[", "metadata.annotations[")
PODMAN_ANNOTATION_MAX = 63  # podman 4.3 checks annotation values as if they were label values
PODMAN_INIT_TYPE = "io.podman.annotations.init.container.type"
EMPTY_DIR_MODE = 0o777  # the kubelet's emptyDir
FILE_MODE = 0o644  # defaultMode 420, the injector's


@dataclass(frozen=True)
class Inputs:
    """What the kubelet would fetch or know when it starts the pod."""

    pod_ip: str
    host_dir: str  # where this pod's volume directories go on the host
    proxy_image: str
    app_image: str
    app_command: Sequence[str]
    tokens: Mapping[str, str]  # audience ("" for the API's own) -> service-account token
    config_maps: Mapping[str, Mapping[str, str]]  # name -> data
    host_aliases: Mapping[str, str] = field(default_factory=dict)  # hostname -> IP
    # path in the app container -> host file, bind-mounted read-only (the demo app, which the images do not carry)
    app_files: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Plan:
    """The pod for podman, the host files and directories it mounts, and what was resolved."""

    pod: dict[str, Any]
    documents: list[dict[str, Any]]  # the ConfigMaps, ahead of the pod in the kube play file
    dirs: dict[str, int] = field(default_factory=dict)  # path -> mode
    files: dict[str, tuple[str, int]] = field(default_factory=dict)  # path -> (content, mode)
    resolved: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)


def podman_knows(field_path: str) -> bool:
    """Whether podman kube play fills an env var from this fieldPath itself."""
    return field_path in PODMAN_FIELD_PATHS or field_path.startswith(PODMAN_FIELD_PREFIXES)


def field_value(pod: Mapping[str, Any], field_path: str, pod_ip: str) -> str:
    """A fieldRef's value as the kubelet computes it (status.podIP: the sandbox's IP)."""
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": status.get("hostIP", ""),
        "status.hostIPs": status.get("hostIP", ""),
    }
    if field_path in simple:
        return str(simple[field_path])
    if field_path == "metadata.labels":
        return downward_text(meta.get("labels", {}))
    if field_path == "metadata.annotations":
        return downward_text(meta.get("annotations", {}))
    for prefix, values in (("metadata.labels['", meta.get("labels", {})),
                           ("metadata.annotations['", meta.get("annotations", {}))):
        if field_path.startswith(prefix) and field_path.endswith("']"):
            return str(values.get(field_path[len(prefix):-2], ""))
    raise ValueError(f"fieldPath {field_path!r} is not one the kubelet resolves")


def downward_text(values: Mapping[str, str]) -> str:
    """A map as the kubelet's downward API writes it: sorted `key="value"` lines (Go %q quoting)."""
    return "\n".join(f"{key}={json.dumps(str(values[key]), ensure_ascii=False)}" for key in sorted(values))


def _resolve_env(pod: dict[str, Any], source: Mapping[str, Any], inputs: Inputs, plan: Plan) -> None:
    for kind in ("initContainers", "containers"):
        for container in pod["spec"].get(kind, []):
            for var in container.get("env", []):
                ref = (var.get("valueFrom") or {}).get("fieldRef")
                if ref is None or podman_knows(ref["fieldPath"]):
                    continue
                value = field_value(source, ref["fieldPath"], inputs.pod_ip)
                var.pop("valueFrom")
                var["value"] = value
                plan.resolved.append(f"env {container['name']}/{var['name']}: fieldRef {ref['fieldPath']} -> {value!r}")


def _host_path(volume: dict[str, Any], path: str) -> None:
    name = volume["name"]
    volume.clear()
    volume.update(name=name, hostPath={"path": path, "type": "Directory"})


def _projected_files(pod: Mapping[str, Any], source: Mapping[str, Any], inputs: Inputs) -> dict[str, str]:
    files: dict[str, str] = {}
    if "serviceAccountToken" in source:
        token = source["serviceAccountToken"]
        audience = token.get("audience", "")
        if audience not in inputs.tokens:
            raise ValueError(f"no token for audience {audience!r}")
        files[token["path"]] = inputs.tokens[audience]
    elif "configMap" in source:
        cm = source["configMap"]
        data = inputs.config_maps.get(cm["name"])
        if data is None:
            if cm.get("optional"):
                return files
            raise ValueError(f"ConfigMap {cm['name']!r} is not given")
        for item in cm.get("items") or [{"key": k, "path": k} for k in data]:
            files[item["path"]] = data[item["key"]]
    elif "downwardAPI" in source:
        for item in source["downwardAPI"]["items"]:
            files[item["path"]] = field_value(pod, item["fieldRef"]["fieldPath"], inputs.pod_ip)
    else:
        raise ValueError(f"projected source {sorted(source)} is not supported here")
    return files


def _resolve_volumes(pod: dict[str, Any], source: Mapping[str, Any], inputs: Inputs, plan: Plan) -> None:
    for volume in pod["spec"].get("volumes", []):
        name = volume["name"]
        path = f"{inputs.host_dir}/{name}"
        files: dict[str, str] | None = None
        if "emptyDir" in volume:
            plan.dirs[path] = EMPTY_DIR_MODE
            plan.resolved.append(f"volume {name}: emptyDir -> hostPath {path} (mode 0777, as the kubelet's)")
            _host_path(volume, path)
            continue
        if "downwardAPI" in volume:
            files = {item["path"]: field_value(source, item["fieldRef"]["fieldPath"], inputs.pod_ip)
                     for item in volume["downwardAPI"]["items"]}
            kind = "downwardAPI"
        elif "projected" in volume:
            files = {}
            for projected in volume["projected"]["sources"]:
                files.update(_projected_files(source, projected, inputs))
            kind = "projected"
        if files is None:
            continue
        plan.dirs[path] = 0o755
        for relative, content in files.items():
            plan.files[f"{path}/{relative}"] = (content, FILE_MODE)
        plan.resolved.append(f"volume {name}: {kind} -> hostPath {path} with {', '.join(sorted(files))}")
        _host_path(volume, path)


def _replace_images(pod: dict[str, Any], inputs: Inputs, plan: Plan) -> None:
    mounts = []
    for index, (target, source) in enumerate(sorted(inputs.app_files.items())):
        name = f"app-file-{index}"
        pod["spec"].setdefault("volumes", []).append({"name": name, "hostPath": {"path": source, "type": "File"}})
        mounts.append({"name": name, "mountPath": target, "readOnly": True})
        plan.replaced.append(f"volume {name}: hostPath {source} -> {target} in the app container (read-only)")
    for kind in ("initContainers", "containers"):
        for container in pod["spec"].get(kind, []):
            old = container.get("image", "")
            if container["name"] in ("istio-proxy", "istio-init", "istio-validation"):
                container["image"] = inputs.proxy_image
            else:
                container["image"] = inputs.app_image
                container["command"] = list(inputs.app_command)
                if kind == "containers" and mounts:
                    container.setdefault("volumeMounts", []).extend(mounts)
            plan.replaced.append(f"image {container['name']}: {old} -> {container['image']}")
            container["imagePullPolicy"] = "Never"


def for_podman(pod: Mapping[str, Any], inputs: Inputs) -> Plan:
    """The Plan for one injected Pod (a deep copy: `pod` is not changed)."""
    original = copy.deepcopy(dict(pod))
    runnable = copy.deepcopy(original)
    runnable.pop("status", None)
    meta = runnable["metadata"]
    for key in ("resourceVersion", "creationTimestamp", "uid", "managedFields"):
        meta.pop(key, None)
    plan = Plan(runnable, [])
    _resolve_env(runnable, original, inputs, plan)
    _resolve_volumes(runnable, original, inputs, plan)
    annotations = meta.setdefault("annotations", {})
    for key in [k for k, v in annotations.items() if len(v) > PODMAN_ANNOTATION_MAX]:
        del annotations[key]
        plan.replaced.append(f"annotation {key}: left out of podman's pod (podman caps a value at "
                             f"{PODMAN_ANNOTATION_MAX} characters); the pod's downward-API file has it")
    _replace_images(runnable, inputs, plan)
    used = {v["configMap"]["name"] for v in runnable["spec"].get("volumes", []) if "configMap" in v}
    for name in sorted(used & set(inputs.config_maps)):
        plan.documents.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                               "data": dict(inputs.config_maps[name])})
        plan.replaced.append(f"ConfigMap {name}: given beside the pod (the API server's object)")
    for volume in runnable["spec"].get("volumes", []):
        cm = volume.get("configMap")
        if cm is not None and cm["name"] not in inputs.config_maps and cm.get("optional"):
            plan.replaced.append(f"volume {volume['name']}: optional ConfigMap {cm['name']} absent -> empty dir")
            plan.dirs[f"{inputs.host_dir}/{volume['name']}"] = 0o755
            _host_path(volume, f"{inputs.host_dir}/{volume['name']}")
    for container in runnable["spec"].get("containers", []):
        ports = container.pop("ports", None)
        if ports:
            # podman publishes a containerPort on the host's every address even without hostPort; the kubelet
            # publishes nothing (the list is informational; ISTIO_META_POD_PORTS carries it to the agent).
            plan.replaced.append(f"ports of {container['name']}: "
                                 f"{', '.join(str(p['containerPort']) for p in ports)} not listed "
                                 "(podman would publish them on the host)")
    if runnable["spec"].get("initContainers"):
        # podman gives every container the pod's restart policy: with Always, an init container that exited is
        # started again and podman cannot remove it. And "once" init containers are removed after they run;
        # "always" keeps the exited container to inspect (it would also run again on a restart of the pod).
        if runnable["spec"].get("restartPolicy", "Always") == "Always":
            runnable["spec"]["restartPolicy"] = "OnFailure"
            plan.replaced.append("restartPolicy: Always -> OnFailure (podman applies it to init containers too)")
        annotations[PODMAN_INIT_TYPE] = "always"
        plan.replaced.append(f"annotation {PODMAN_INIT_TYPE}: always (podman keeps the exited init container)")
    if inputs.host_aliases:
        by_ip: dict[str, list[str]] = {}
        for host, ip in inputs.host_aliases.items():
            by_ip.setdefault(ip, []).append(host)
        runnable["spec"]["hostAliases"] = [{"ip": ip, "hostnames": hosts} for ip, hosts in by_ip.items()]
        plan.replaced.append("hostAliases: " + ", ".join(f"{h} -> {ip}" for h, ip in inputs.host_aliases.items())
                             + " (the cluster DNS's answer)")
    return plan

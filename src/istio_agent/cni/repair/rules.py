"""Which pods the repair controller acts on and what it sends (sans-IO: Pod JSON in, decisions and bodies out).

The rules are upstream's (`cni/pkg/repair/repaircontroller.go`):

- only pods carrying the sidecar annotation (any value) are considered, when an annotation is configured;
- an init container is looked at when its name is the configured one (any, when that is empty);
- a container whose *current* state is a successful termination (exit code 0 or reason `Completed`) is never
  broken, whatever it did before: a pod that recovered must not be touched;
- otherwise the container is broken when its *last* termination (`lastState.terminated`, which the kubelet fills
  in once the container has been restarted, i.e. while it crash-loops) matches the configured exit code (0: any)
  and the configured termination message (empty: any; compared with surrounding white space trimmed).

The first failure alone (`state.terminated` with exit 126 and no `lastState` yet) is therefore not acted on, as
upstream does not: the pod is repaired when the kubelet restarts the validation container and reports the
failure as its last state (`state.waiting` CrashLoopBackOff, or running again).
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from istio_agent.cni.repair.options import RepairOptions

Action = Literal["repair", "delete", "label"]

# Upstream's label value names for `istio_cni_repair_pods_repaired_total` (type="repair"|"delete"|"label").
RESULT_SUCCESS, RESULT_SKIP, RESULT_FAIL = "success", "skip", "fail"


class RepairOptionsError(ValueError):
    """A `--repair-*` setting the API would refuse (names the flag and the value)."""


@dataclass(frozen=True)
class Diagnosis:
    """Whether a pod is broken, and why (or why not), in words fit for a log line."""

    broken: bool
    reason: str


@dataclass(frozen=True)
class PodKey:
    """A pod's identity across its versions: namespace and name, plus the uid of this incarnation."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_key(pod: Mapping[str, Any]) -> PodKey:
    meta = _mapping(pod.get("metadata"))
    return PodKey(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")))


def resource_version(obj: Mapping[str, Any]) -> str:
    return str(_mapping(obj.get("metadata")).get("resourceVersion", ""))


def chosen_action(options: RepairOptions) -> Action | None:
    """Upstream's order: in-place repair wins over deletion, deletion over labelling."""
    if options.repair_pods:
        return "repair"
    if options.delete_pods:
        return "delete"
    if options.label_pods:
        return "label"
    return None


def diagnose(pod: Mapping[str, Any], options: RepairOptions) -> Diagnosis:
    """Is this pod broken by the CNI race (its validation init container keeps failing)?"""
    meta = _mapping(pod.get("metadata"))
    if options.sidecar_annotation and options.sidecar_annotation not in _mapping(meta.get("annotations")):
        return Diagnosis(False, f"no {options.sidecar_annotation} annotation")
    node = str(_mapping(pod.get("spec")).get("nodeName") or "")
    if options.node_name and node != options.node_name:
        return Diagnosis(False, f"on node {node or '(none)'}, not {options.node_name}")
    wanted_message = options.init_container_termination_message.strip()
    seen = False
    for status in _list(_mapping(pod.get("status")).get("initContainerStatuses")):
        status = _mapping(status)
        name = str(status.get("name", ""))
        if options.init_container_name and name != options.init_container_name:
            continue
        seen = True
        current = _mapping(_mapping(status.get("state")).get("terminated"))
        if current and (current.get("reason") == "Completed" or current.get("exitCode") == 0):
            continue
        last = _mapping(_mapping(status.get("lastState")).get("terminated"))
        if not last:
            continue
        if wanted_message and str(last.get("message") or "").strip() != wanted_message:
            continue
        code = last.get("exitCode")
        if options.init_container_exit_code and code != options.init_container_exit_code:
            continue
        return Diagnosis(True, f"init container {name} last terminated with exit code {code}"
                               + (f" and message {wanted_message!r}" if wanted_message else ""))
    which = options.init_container_name or "any init container"
    if not seen:
        return Diagnosis(False, f"no status for {which}")
    return Diagnosis(False, f"{which} has no matching failure")


def has_label(pod: Mapping[str, Any], key: str) -> bool:
    return key in _mapping(_mapping(pod.get("metadata")).get("labels"))


def label_patch(options: RepairOptions) -> bytes:
    """The JSON merge patch upstream sends to the pod's `status` subresource (lower privilege than `pods`)."""
    return json.dumps({"metadata": {"labels": {options.label_key: options.label_value}}},
                      separators=(",", ":")).encode()


LABEL_PATCH_CONTENT_TYPE = "application/merge-patch+json"


def delete_options(pod: Mapping[str, Any]) -> dict[str, Any]:
    """DeleteOptions with upstream's preconditions: delete only the incarnation and version we judged broken."""
    meta = _mapping(pod.get("metadata"))
    return {"kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"uid": str(meta.get("uid", "")), "resourceVersion": str(meta.get("resourceVersion", ""))}}


# Upstream's event reasons (core/v1 Events on the pod, from the `cni-repair` component).
REASON_DELETE, REASON_LABEL = "DeleteBrokenPod", "LabelBrokenPod"
EVENT_COMPONENT = "cni-repair"


def event(pod: Mapping[str, Any], reason: str, message: str, now: float) -> dict[str, Any]:
    """A Warning Event about `pod`, shaped as client-go's event recorder writes one (`now`: Unix seconds)."""
    meta = _mapping(pod.get("metadata"))
    stamp = _rfc3339(now)
    return {
        "kind": "Event", "apiVersion": "v1",
        "metadata": {"name": f"{meta.get('name', '')}.{int(now * 1e9):x}", "namespace": meta.get("namespace", "")},
        "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": meta.get("namespace", ""),
                           "name": meta.get("name", ""), "uid": meta.get("uid", ""),
                           "resourceVersion": meta.get("resourceVersion", "")},
        "reason": reason, "message": message, "type": "Warning", "count": 1,
        "source": {"component": EVENT_COMPONENT}, "reportingComponent": EVENT_COMPONENT, "reportingInstance": "",
        "firstTimestamp": stamp, "lastTimestamp": stamp,
    }


def _rfc3339(now: float) -> str:
    return datetime.datetime.fromtimestamp(int(now), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def field_selector(options: RepairOptions) -> str:
    """The configured field selectors, plus this node's pods only when a node name is set."""
    terms = [options.field_selectors] if options.field_selectors else []
    if options.node_name:
        terms.append(f"spec.nodeName={options.node_name}")
    return ",".join(terms)


def label_selector(options: RepairOptions) -> str:
    return options.label_selectors


def check_options(options: RepairOptions) -> None:
    """Refuse, naming the flag, settings that would make every list or patch fail at the API."""
    action = chosen_action(options)
    if action == "repair" and not options.host_proc_dir.strip():
        raise RepairOptionsError("--repair-host-proc-dir '': in-place repair needs the host's /proc (upstream's "
                                 "chart mounts it at /host/proc)")
    if action == "label":
        if error := _qualified_name_error(options.label_key):
            raise RepairOptionsError(f"--repair-broken-pod-label-key {options.label_key!r}: {error}")
        if error := _label_value_error(options.label_value):
            raise RepairOptionsError(f"--repair-broken-pod-label-value {options.label_value!r}: {error}")
    if error := field_selector_error(options.field_selectors):
        raise RepairOptionsError(f"--repair-field-selectors {options.field_selectors!r}: {error}")
    if error := label_selector_error(options.label_selectors):
        raise RepairOptionsError(f"--repair-label-selectors {options.label_selectors!r}: {error}")
    if options.init_container_exit_code < 0 or options.init_container_exit_code > 255:
        raise RepairOptionsError(f"--repair-init-container-exit-code {options.init_container_exit_code}: "
                                 "an exit code is 0..255 (0 matches any)")


# ---- selector syntax, as the API server parses it --------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


def _qualified_name_error(key: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return "the prefix must be a DNS subdomain"
    if not name or len(name) > 63 or not _NAME.match(name):
        return "a label key's name is 1-63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
    return ""


def _label_value_error(value: str) -> str:
    if value and (len(value) > 63 or not _NAME.match(value)):
        return "a label value is empty or 1-63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
    return ""


def field_selector_error(selector: str) -> str:
    """'' when `selector` parses as a field selector (`key=value`, `key==value`, `key!=value`, comma-separated)."""
    if not selector:
        return ""
    for term in re.split(r"(?<!\\),", selector):
        match = re.match(r"\s*([^=!\s]+)\s*(!=|==|=)(.*)\Z", term)
        if not match:
            return f"term {term!r} is not key=value, key==value or key!=value"
    return ""


_SET_OPERATOR = re.compile(r"\s*([^\s=!<>(),]+)\s+(in|notin)\s*\(([^()]*)\)\s*\Z")
_COMPARISON = re.compile(r"\s*([^\s=!<>(),]+)\s*(==|!=|=|<|>)\s*([^\s,()]*)\s*\Z")
_EXISTENCE = re.compile(r"\s*(!?)\s*([^\s=!<>(),]+)\s*\Z")


def label_selector_error(selector: str) -> str:
    """'' when `selector` parses as a label selector (equality, set-based, existence and `<`/`>` requirements)."""
    if not selector.strip():
        return ""
    for term in _split_requirements(selector):
        if match := _SET_OPERATOR.match(term):
            key, values = match.group(1), [v.strip() for v in match.group(3).split(",")]
            errors = [_label_value_error(v) for v in values]
        elif match := _COMPARISON.match(term):
            key, operator, value = match.groups()
            if operator in "<>" and not re.fullmatch(r"-?\d+", value):
                return f"requirement {term.strip()!r}: {operator} needs an integer"
            errors = [_label_value_error(value)]
        elif match := _EXISTENCE.match(term):
            key, errors = match.group(2), []
        else:
            return f"requirement {term.strip()!r} does not parse"
        if error := _qualified_name_error(key) or next((e for e in errors if e), ""):
            return f"requirement {term.strip()!r}: {error}"
    return ""


def _split_requirements(selector: str) -> list[str]:
    terms, depth, start = [], 0, 0
    for i, char in enumerate(selector):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return terms


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []

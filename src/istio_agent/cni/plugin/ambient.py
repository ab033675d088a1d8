"""Would upstream enrol this pod in ambient mode? (`enablement_selectors`, as `cni/pkg/util` matches them; pure.)

Ambient mode is not supported here; this only lets the plugin say so for a
pod upstream would have handed to the ambient node agent. Upstream's rules:
a host-network pod or a pod with a sidecar (`sidecar.istio.io/status`) is
never ambient; otherwise any selector whose pod selector matches the pod's
labels and whose namespace selector matches the namespace's labels enrols
it. Selectors are Kubernetes LabelSelectors (`matchLabels`, and
`matchExpressions` with In, NotIn, Exists, DoesNotExist); an empty one
selects everything.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


class SelectorError(ValueError):
    """A selector that cannot be evaluated (names the field)."""


def _matches(selector: object, labels: Mapping[str, str], where: str) -> bool:
    if selector is None:
        return True
    if not isinstance(selector, dict):
        raise SelectorError(f"{where} must be a label selector object")
    match_labels = selector.get("matchLabels") or {}
    if not isinstance(match_labels, dict):
        raise SelectorError(f"{where}.matchLabels must be a map")
    if any(labels.get(key) != value for key, value in match_labels.items()):
        return False
    for i, expr in enumerate(selector.get("matchExpressions") or []):
        if not isinstance(expr, dict) or not isinstance(expr.get("key"), str):
            raise SelectorError(f"{where}.matchExpressions[{i}] needs a key")
        key, op, values = expr["key"], expr.get("operator"), expr.get("values") or []
        if op == "In":
            if not values or labels.get(key) not in values:
                return False
        elif op == "NotIn":
            if not values:
                raise SelectorError(f"{where}.matchExpressions[{i}]: NotIn needs values")
            if key in labels and labels[key] in values:
                return False
        elif op == "Exists":
            if key not in labels:
                return False
        elif op == "DoesNotExist":
            if key in labels:
                return False
        else:
            raise SelectorError(f"{where}.matchExpressions[{i}].operator {op!r} is not In, NotIn, Exists or "
                                "DoesNotExist")
    return True


def selected_for_ambient(pod: Mapping[str, object], namespace_labels: Mapping[str, str],
                         selectors: Sequence[object]) -> bool:
    """Upstream's CompiledEnablementSelectors.Matches for this pod (SelectorError for a bad selector)."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    metadata = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    assert isinstance(spec, dict) and isinstance(metadata, dict)
    if spec.get("hostNetwork") is True:
        return False
    annotations = metadata.get("annotations") or {}
    if isinstance(annotations, dict) and "sidecar.istio.io/status" in annotations:
        return False
    labels = metadata.get("labels") or {}
    if not isinstance(labels, dict):
        labels = {}
    for i, selector in enumerate(selectors):
        if not isinstance(selector, dict):
            raise SelectorError(f"enablement_selectors[{i}] must be an object")
        where = f"enablement_selectors[{i}]"
        if _matches(selector.get("podSelector"), labels, f"{where}.podSelector") and \
                _matches(selector.get("namespaceSelector"), namespace_labels, f"{where}.namespaceSelector"):
            return True
    return False

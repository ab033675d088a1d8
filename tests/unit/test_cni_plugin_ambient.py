"""Which pods upstream would enrol in ambient mode (which istio-cni only reports: ambient is not supported)."""

from __future__ import annotations

from typing import Any

import pytest

from istio_agent.cni.plugin.ambient import SelectorError, selected_for_ambient

# install-cni's default enablement selectors (upstream's values.yaml).
DEFAULTS: list[Any] = [
    {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
    {"podSelector": {"matchExpressions": [{"key": "istio.io/dataplane-mode", "operator": "NotIn",
                                           "values": ["none"]}]},
     "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
]


def pod(labels: dict[str, str] | None = None, sidecar: bool = False, host_network: bool = False) -> dict[str, Any]:
    return {"metadata": {"labels": labels or {}, "annotations": {"sidecar.istio.io/status": "{}"} if sidecar else {}},
            "spec": {"hostNetwork": host_network}}


AMBIENT_NS = {"istio.io/dataplane-mode": "ambient"}


@pytest.mark.parametrize(("p", "ns", "selected"), [
    (pod({"istio.io/dataplane-mode": "ambient"}), {}, True),
    (pod(), AMBIENT_NS, True),
    (pod({"istio.io/dataplane-mode": "none"}), AMBIENT_NS, False),
    (pod(), {}, False),
    (pod(sidecar=True), AMBIENT_NS, False),  # a sidecar pod is never ambient
    (pod({"istio.io/dataplane-mode": "ambient"}, host_network=True), {}, False),
])  # fmt: skip
def test_default_selectors(p: dict[str, Any], ns: dict[str, str], selected: bool) -> None:
    assert selected_for_ambient(p, ns, DEFAULTS) is selected


def test_operators_and_empty_selectors() -> None:
    assert selected_for_ambient(pod(), {}, [{}])  # an empty selector selects everything
    exists = [{"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}}]
    assert selected_for_ambient(pod({"a": "1"}), {}, exists) and not selected_for_ambient(pod(), {}, exists)
    absent = [{"podSelector": {"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}}]
    assert selected_for_ambient(pod(), {}, absent) and not selected_for_ambient(pod({"a": "1"}), {}, absent)
    within = [{"namespaceSelector": {"matchExpressions": [{"key": "t", "operator": "In", "values": ["x", "y"]}]}}]
    assert selected_for_ambient(pod(), {"t": "y"}, within) and not selected_for_ambient(pod(), {"t": "z"}, within)
    with pytest.raises(SelectorError, match="operator"):
        selected_for_ambient(pod(), {}, [{"podSelector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}}])

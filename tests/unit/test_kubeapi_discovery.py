"""Discovery documents, the Accept negotiation for tables, and the Table kubectl prints."""

from __future__ import annotations

import datetime as dt

import pytest

from istiod_local.controlplane.kubeapi.discovery import api_resource_list, human_duration, table, wants_table
from istiod_local.controlplane.kubeapi.pods import PodMeta, render_pod
from istiod_local.controlplane.xds.registry import parse_registry

KUBECTL_ACCEPT = ("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
                  "application/json")


def test_resource_list_names_kinds_verbs_and_short_names() -> None:
    resources = {r["name"]: r for r in api_resource_list()["resources"]}
    assert resources["pods"]["shortNames"] == ["po"] and resources["pods"]["namespaced"] is True
    assert {"get", "list", "watch", "patch", "delete"} <= set(resources["pods"]["verbs"])
    assert resources["namespaces"]["shortNames"] == ["ns"] and resources["namespaces"]["namespaced"] is False
    assert resources["pods/status"]["verbs"] == ["get", "patch"]


def test_table_negotiation() -> None:
    assert wants_table(KUBECTL_ACCEPT)
    assert not wants_table("application/json")
    assert not wants_table("")
    assert wants_table("application/json;as=Table;v=v1beta1;g=meta.k8s.io")


@pytest.mark.parametrize(("seconds", "shown"), [(5, "5s"), (119, "119s"), (130, "2m10s"), (600, "10m"),
                                                 (3 * 3600 + 240, "3h4m"), (10 * 3600, "10h"),
                                                 (50 * 3600, "2d2h"), (30 * 86400, "30d"), (800 * 86400, "2y")])
def test_human_duration_as_kubectl_shows_age(seconds: int, shown: str) -> None:
    assert human_duration(seconds) == shown


def test_pod_table_rows() -> None:
    registry = parse_registry("workloads: [{name: a, ip: 10.0.0.1, nodeName: n1}]")
    pod = render_pod(registry, registry.workloads[0], PodMeta("u", "2026-12-01T12:00:00Z", "n"))
    now = dt.datetime(2026, 12, 1, 12, 5, tzinfo=dt.UTC).timestamp()
    out = table("pods", [pod], "7", now)
    assert out["kind"] == "Table" and out["metadata"]["resourceVersion"] == "7"
    assert [c["name"] for c in out["columnDefinitions"]][:5] == ["Name", "Ready", "Status", "Restarts", "Age"]
    assert out["rows"][0]["cells"] == ["a", "2/2", "Running", "0", "5m", "10.0.0.1", "n1", "<none>", "<none>"]
    assert out["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    pod["status"]["initContainerStatuses"][0]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    failing = table("pods", [pod], "8", now, include_object="None", columns=False)
    assert failing["rows"][0]["cells"][2] == "Init:CrashLoopBackOff"
    assert "object" not in failing["rows"][0] and "columnDefinitions" not in failing

"""The cloud platform (config/platform.py): upstream's pkg/bootstrap/platform rules, from the environment and the
metadata servers' answers (`CloudFacts`, which the loader's probe gathers); the rules themselves open no socket
(the unit tier's guard fails any socket opened here)."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from istio_agent.config import env, platform
from istio_agent.config.cloud_metadata import CloudFacts
from istio_agent.config.platform import (
    GCP,
    UNKNOWN,
    Platform,
    discover,
    gcp_static_metadata,
    gke_cluster_url,
    platform_locality,
    zone_from_resolv_conf,
    zone_to_region,
)

GKE = "my-proj|1234|my-cluster|us-central1-c"
FULL = {
    "gcp_project": "my-proj", "gcp_project_number": "1234", "gcp_gke_cluster_name": "my-cluster",
    "gcp_location": "us-central1-c",
    "gcp_gke_cluster_url": "https://container.googleapis.com/v1/projects/my-proj/locations/us-central1-c/clusters/"
                           "my-cluster",
}


def found(environ: dict[str, str], facts: CloudFacts | None = None) -> Platform:
    return discover(env.Environment(environ), facts)


def messages(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


# --- GCP_METADATA, GCP_QUOTA_PROJECT, GCP_ZONE -----------------------------------------------------------------

def test_four_parts_give_project_cluster_location_and_the_cluster_url() -> None:
    assert gcp_static_metadata(GKE) == FULL
    assert gcp_static_metadata(GKE, "quota-proj", "us-central1-f") == {
        **FULL, "gcp_quota_project": "quota-proj", "gcp_zone": "us-central1-f"}


def test_empty_parts_are_still_present() -> None:
    """Upstream stores the four parts as split, so `|||` sets four empty keys (and a URL of empty parts)."""
    md = gcp_static_metadata("|||")
    assert md["gcp_project"] == "" and md["gcp_gke_cluster_url"].endswith("/projects//locations//clusters/")


def test_a_gcp_metadata_of_three_parts_gives_no_project_and_no_url(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    assert gcp_static_metadata("my-proj|1234|my-cluster") == {}
    assert "GCP_METADATA" in messages(caplog)[0] and "got 3 part(s)" in messages(caplog)[0]
    # The other two variables still count once GCP_METADATA is set, however malformed.
    assert gcp_static_metadata("my-proj|1234|my-cluster", "q", "z") == {"gcp_quota_project": "q", "gcp_zone": "z"}
    assert gcp_static_metadata("a|b|c|d|e") == {}


def test_quota_project_and_zone_alone_count_for_nothing() -> None:
    """As upstream: without GCP_METADATA there is no static GCP metadata at all."""
    assert gcp_static_metadata("", "quota-proj", "us-central1-f") == {}


def test_cluster_url_needs_project_location_and_cluster() -> None:
    assert gke_cluster_url({"gcp_project": "p", "gcp_location": "l", "gcp_gke_cluster_name": "c"}) == \
        "https://container.googleapis.com/v1/projects/p/locations/l/clusters/c"
    assert gke_cluster_url({"gcp_project": "p", "gcp_location": "l"}) is None


# --- CLOUD_PLATFORM and detection ------------------------------------------------------------------------------

def test_gcp_metadata_alone_is_detected_as_gcp(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    p = found({"GCP_METADATA": GKE, "GCP_ZONE": "us-central1-f"})
    assert (p.name, p.zone) == (GCP, "us-central1-f")
    assert p.metadata == {**FULL, "gcp_zone": "us-central1-f"}
    assert p.kubernetes, "a GKE cluster name means Kubernetes"
    assert messages(caplog) == [], "nothing missing: no warning"


def test_nothing_set_and_nothing_detected_is_no_platform(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    assert found({}) == Platform(UNKNOWN)
    assert found({"GCP_ZONE": "us-central1-f", "GCP_QUOTA_PROJECT": "q"}) == Platform(UNKNOWN)
    assert any("no cloud platform detected" in m for m in messages(caplog, logging.INFO))
    assert found({}, CloudFacts(timed_out=True)) == Platform(UNKNOWN)
    assert any("did not answer in time" in m for m in messages(caplog, logging.INFO))
    assert messages(caplog) == []


def test_three_parts_with_a_quota_project_still_detect_gcp() -> None:
    """Upstream detects GCP whenever its static metadata is non-empty."""
    p = found({"GCP_METADATA": "a|b|c", "GCP_QUOTA_PROJECT": "q"})
    assert p.name == GCP and p.metadata == {"gcp_quota_project": "q"}
    assert found({"GCP_METADATA": "a|b|c"}).name == UNKNOWN


def test_cloud_platform_gcp_takes_the_metadata_servers_values_and_builds_the_cluster_url() -> None:
    p = found({"CLOUD_PLATFORM": "GCP", "KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    assert p.name == GCP and p.metadata == {} and p.zone == ""
    fetched = {"gcp_project": "my-proj", "gcp_project_number": "1234", "gcp_gke_cluster_name": "my-cluster",
               "gcp_location": "us-central1-c", "gcp_gce_instance": "vm-1"}
    p = found({"CLOUD_PLATFORM": "gcp"}, CloudFacts(gcp=fetched, gcp_zone="us-central1-c"))
    assert p.metadata == {**fetched, "gcp_gke_cluster_url": FULL["gcp_gke_cluster_url"]}
    assert p.kubernetes, "a cluster name says Kubernetes"
    # Static metadata wins whole: upstream does no lookups when GCP_METADATA is set.
    assert found({"CLOUD_PLATFORM": "gcp", "GCP_METADATA": GKE}, CloudFacts(gcp=fetched)).metadata == FULL


def test_cloud_platform_none_ignores_gcp_metadata() -> None:
    assert found({"CLOUD_PLATFORM": "none", "GCP_METADATA": GKE}) == Platform(UNKNOWN)
    assert found({"CLOUD_PLATFORM": "none"}, CloudFacts(detected="aws", aws={"aws_region": "r"})) == Platform(UNKNOWN)


@pytest.mark.parametrize("cloud", ["aws", "AWS"])
def test_aws_takes_region_zone_and_instance_from_imds(cloud: str) -> None:
    facts = CloudFacts(aws={"aws_region": "us-west-2", "aws_availability_zone": "us-west-2b",
                            "aws_instance_id": "i-0abc"})
    p = found({"CLOUD_PLATFORM": cloud, "GCP_METADATA": GKE}, facts)
    assert p.name == "aws" and p.metadata == facts.aws
    assert platform_locality(p, "search us-central1-f.c.p.internal") == {"region": "us-west-2",
                                                                           "zone": "us-west-2b"}
    assert found({"CLOUD_PLATFORM": cloud}).metadata == {} and platform_locality(found({"CLOUD_PLATFORM": cloud}),
                                                                                  None) == {}


def test_azure_and_detection_take_the_cloud_the_probe_found() -> None:
    facts = CloudFacts(detected="azure", azure={"azure_name": "vm", "azure_location": "westeurope"},
                       azure_locality={"region": "westeurope", "zone": "2"})
    p = found({}, facts)
    assert p.name == "azure" and p.metadata == facts.azure
    assert platform_locality(p, None) == {"region": "westeurope", "zone": "2"}
    assert found({"CLOUD_PLATFORM": "azure"}, facts).metadata == facts.azure
    # GCP_METADATA decides detection before any answer, as upstream's static GCP check does.
    assert found({"GCP_METADATA": GKE}, facts).name == GCP


def test_an_unknown_cloud_platform_falls_back_to_detection(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    assert found({"CLOUD_PLATFORM": "openstack", "GCP_METADATA": GKE}).name == GCP
    assert "not one of aws, azure, gcp, none" in messages(caplog)[0]


def test_off_kubernetes_upstream_would_ask_the_compute_api_for_instance_labels(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    # No cluster name (quota project only) and no KUBERNETES_SERVICE_HOST: not Kubernetes.
    p = found({"GCP_METADATA": "a|b|c", "GCP_QUOTA_PROJECT": "q"})
    assert not p.kubernetes
    assert any("compute.googleapis.com" in m for m in messages(caplog))
    caplog.clear()
    assert found({"GCP_METADATA": "a|b|c", "GCP_QUOTA_PROJECT": "q", "KUBERNETES_SERVICE_HOST": ""}).kubernetes, \
        "KUBERNETES_SERVICE_HOST counts when set at all, as upstream's LookupEnv"
    assert not any("compute.googleapis.com" in m for m in messages(caplog))


# --- the zone and region ---------------------------------------------------------------------------------------

def test_zone_from_the_search_line_of_resolv_conf() -> None:
    """Upstream's cases: the zone's domain first or in the middle of the search list, last, with a trailing
    space, and absent from the search line (a `domain` line does not count)."""
    first = ("domain us-central1-c.c.test-proj.internal\n"
             "search us-central1-c.c.test-proj.internal. c.test-proj.internal. google.internal.\n"
             "nameserver 8.8.8.8\n")
    assert zone_from_resolv_conf(first) == "us-central1-c"
    middle = ("search httpbin.svc.cluster.local svc.cluster.local cluster.local us-central1-f.c.test-proj.internal "
              "c.test-proj.internal google.internal\nnameserver 34.118.224.10\noptions ndots:5")
    assert zone_from_resolv_conf(middle) == "us-central1-f"
    last = ("nameserver 34.118.224.10\noptions ndots:5\n"
            "search httpbin.svc.cluster.local svc.cluster.local cluster.local us-central1-f.c.test-proj.internal")
    assert zone_from_resolv_conf(last) == "us-central1-f"
    assert zone_from_resolv_conf(last + " ") == "us-central1-f"
    absent = ("nameserver 34.118.224.10\noptions ndots:5\nsearch httpbin.svc.cluster.local svc.cluster.local "
              "cluster.local\ndomain us-central1-f.c.test-proj.internal ")
    assert zone_from_resolv_conf(absent) == ""
    assert zone_from_resolv_conf("") == ""


def test_zone_to_region() -> None:
    assert zone_to_region("us-central1-f") == "us-central1"
    assert zone_to_region("us-central1") is None
    assert zone_to_region("abcd") is None


RESOLV = "search ns.svc.cluster.local svc.cluster.local cluster.local us-central3-f.c.test-proj.internal\n"


def test_locality_from_gcp_zone_wins_over_resolv_conf() -> None:
    p = found({"GCP_METADATA": GKE, "GCP_ZONE": "us-central2-ir"})
    assert platform_locality(p, RESOLV) == {"region": "us-central2", "zone": "us-central2-ir"}


def test_locality_from_resolv_conf() -> None:
    assert platform_locality(found({"GCP_METADATA": GKE}), RESOLV) == {"region": "us-central3", "zone": "us-central3-f"}
    # GCP_ZONE without GCP_METADATA is not kept, as upstream: resolv.conf decides.
    p = found({"CLOUD_PLATFORM": "gcp", "GCP_ZONE": "us-central2-ir", "KUBERNETES_SERVICE_HOST": "h"})
    assert platform_locality(p, RESOLV) == {"region": "us-central3", "zone": "us-central3-f"}


def test_the_metadata_servers_zone_is_the_last_resort(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    p = found({"GCP_METADATA": GKE})
    assert platform_locality(p, "nameserver 10.96.0.10\n") == {}
    assert any("no GCP zone from GCP_ZONE, resolv.conf or the GCE metadata server" in m for m in messages(caplog))
    caplog.clear()
    assert platform_locality(p, None) == {}
    assert any("failed to read /etc/resolv.conf" in m for m in messages(caplog))
    asked = found({"GCP_METADATA": GKE}, CloudFacts(gcp_zone="europe-west1-b"))
    assert platform_locality(asked, "nameserver 10.96.0.10\n") == {"region": "europe-west1", "zone": "europe-west1-b"}
    assert platform_locality(asked, RESOLV)["zone"] == "us-central3-f", "resolv.conf comes first"


def test_a_zone_without_a_region_gives_no_locality(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    assert platform_locality(found({"GCP_METADATA": GKE, "GCP_ZONE": "us-central1"}), RESOLV) == {}
    assert "no region" in messages(caplog)[0]


def test_no_platform_gives_no_locality_and_reads_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    assert platform_locality(Platform(UNKNOWN), None) == {}
    assert messages(caplog) == []


def test_the_platform_rules_import_nothing_that_reaches_the_network() -> None:
    """Sans-IO, checked at its source: the rules (and what the metadata servers' answers mean) import only text,
    logging, JSON and the env registry; the requests are the loader's (agent/cloud_probe.py)."""
    from istio_agent.config import cloud_metadata

    for module in (platform, cloud_metadata):
        tree = ast.parse(Path(module.__file__ or "").read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert imported <= {"__future__", "logging", "re", "json", "typing", "collections.abc", "dataclasses",
                            "istio_agent.config", "istio_agent.config.cloud_metadata"}, imported

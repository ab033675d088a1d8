"""The cloud probe's questions and the facts it draws, in virtual time, with metadata servers of the test's own.

Each fake server answers (method, URL) as the cloud's does; the requests it saw are kept, so a test says what
was asked as well as what was learnt. A silent server shows the start's delay is the probe's budget, in
virtual time. The real requests, to servers in a network namespace, are tests/node/test_cloud_metadata_netns.py's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

import pytest

from istio_agent.agent.cloud_probe import Answer, CloudProbe
from istio_agent.clock import VirtualClock
from istio_agent.config import cloud_metadata as cloud
from istio_agent.config import env
from istio_agent.config.cloud_metadata import CloudFacts, Request

GCE = "http://169.254.169.254/computeMetadata/v1/"
IMDS = "http://169.254.169.254/latest/"
AZURE = "http://169.254.169.254/metadata/instance?"
GCE_VALUES = {
    "project/project-id": "my-proj\n", "project/numeric-project-id": "1234", "instance/name": "vm-1",
    "instance/id": "99", "instance/attributes/cluster-name": "prod", "instance/zone": "projects/1234/zones/us-east1-b",
    "instance/attributes/created-by": "projects/1234/zones/us-east1-b/instanceGroupManagers/ig",
}
AZURE_INSTANCE = {"compute": {"name": "vm-az", "location": "westeurope", "vmId": "id-1", "zone": "2",
                              "tagsList": [{"name": "team", "value": "mesh"}], "tags": "ignored:yes"}}


class Servers:
    """The metadata servers of one test: answers by (method, URL); what was asked, in order."""

    def __init__(self, answers: Mapping[tuple[str, str], Answer], silent: bool = False) -> None:
        self.answers = dict(answers)
        self.silent = silent
        self.asked: list[Request] = []

    async def ask(self, request: Request) -> Answer | None:
        self.asked.append(request)
        if self.silent:
            await asyncio.sleep(3600)  # accepts and never answers: only the budget ends it
        return self.answers.get((request.method, request.url))

    def urls(self) -> list[str]:
        return [request.url for request in self.asked]


def gce_server(host: str = "169.254.169.254", flavor: bool = True) -> dict[tuple[str, str], Answer]:
    answers: dict[tuple[str, str], Answer] = {
        ("GET", f"http://{host}/computeMetadata/v1/{path}"): (200, {}, value) for path, value in GCE_VALUES.items()}
    answers[("GET", "http://169.254.169.254")] = (200, {"metadata-flavor": "Google"} if flavor else {}, "")
    return answers


def aws_server(base: str = IMDS, token: str | None = "tok") -> dict[tuple[str, str], Answer]:
    answers: dict[tuple[str, str], Answer] = {
        ("GET", f"{base}meta-data/iam/info"): (200, {}, '{"InstanceProfileArn": "arn:aws:iam::1:instance-profile/x"}'),
        ("GET", f"{base}meta-data/placement/region"): (200, {}, "us-west-2"),
        ("GET", f"{base}meta-data/placement/availability-zone"): (200, {}, "us-west-2b"),
        ("GET", f"{base}meta-data/instance-id"): (200, {}, "i-0abc"),
    }
    if token is not None:
        answers[("PUT", f"{base}api/token")] = (200, {}, token)
    return answers


def probe(servers: Servers, variables: Mapping[str, str] | None = None, *, ipv6: bool = False,
          sys_vendor: str | None = None, zone_wanted: bool = False,
          budget: float = cloud.DETECT_TIMEOUT) -> tuple[CloudFacts, float]:
    clock = VirtualClock()
    prober = CloudProbe(env.Environment(dict(variables or {})), ask=servers.ask, ipv6=ipv6, sys_vendor=sys_vendor,
                        zone_wanted=zone_wanted, budget=budget)
    return clock.run(prober.facts()), clock.elapsed()


def test_none_asks_nothing() -> None:
    servers = Servers(gce_server())
    prober = CloudProbe(env.Environment({"CLOUD_PLATFORM": "NONE"}), ask=servers.ask)
    assert not prober.wanted()
    assert probe(servers, {"CLOUD_PLATFORM": "none"})[0] == CloudFacts() and servers.asked == []


def test_gce_is_detected_by_its_flavor_header_and_its_values_asked() -> None:
    servers = Servers(gce_server())
    facts, _ = probe(servers)
    assert facts.detected == "gcp"
    assert facts.gcp == {"gcp_project": "my-proj", "gcp_project_number": "1234", "gcp_gce_instance": "vm-1",
                         "gcp_gce_instance_id": "99", "gcp_gke_cluster_name": "prod",
                         "gcp_gce_instance_created_by": GCE_VALUES["instance/attributes/created-by"],
                         "gcp_location": "us-east1-b"}, "no cluster-location: the zone stands in, as upstream"
    assert facts.gcp_zone == "us-east1-b"
    values = [r for r in servers.asked if r.url.startswith(GCE)]
    assert values and all(("Metadata-Flavor", "Google") in r.headers for r in values)
    assert all(r.timeout == cloud.GCP_REQUEST_TIMEOUT for r in values)


def test_a_server_without_the_flavor_is_not_gce() -> None:
    facts, _ = probe(Servers(gce_server(flavor=False)))
    assert facts == CloudFacts()


def test_gce_metadata_host_says_gce_without_asking_and_is_where_values_come_from() -> None:
    servers = Servers(gce_server(host="10.0.0.5:8080"))
    facts, _ = probe(servers, {"GCE_METADATA_HOST": "10.0.0.5:8080"})
    assert facts.detected == "gcp" and facts.gcp["gcp_project"] == "my-proj"
    assert "http://169.254.169.254" not in servers.urls()
    assert not any(url.startswith(GCE) for url in servers.urls())


@pytest.mark.parametrize("token", ["tok", None], ids=["imdsv2", "imdsv1"])
def test_aws_is_detected_by_iam_info_with_or_without_a_session_token(token: str | None) -> None:
    servers = Servers(aws_server(token=token))
    facts, _ = probe(servers)
    assert facts.detected == "aws"
    assert facts.aws == {"aws_region": "us-west-2", "aws_availability_zone": "us-west-2b", "aws_instance_id": "i-0abc"}
    put = next(r for r in servers.asked if r.method == "PUT")
    assert put.headers == (("X-aws-ec2-metadata-token-ttl-seconds", "60"),) and put.timeout == 0.1
    gets = [r for r in servers.asked if r.url.startswith(IMDS + "meta-data/")]
    expected = (("X-aws-ec2-metadata-token", "tok"),) if token else ()
    assert gets and all(r.headers == expected for r in gets)


def test_aws_is_asked_on_its_ipv6_address_when_the_proxy_has_one() -> None:
    servers = Servers(aws_server(base="http://[fd00:ec2::254]/latest/"))
    facts, _ = probe(servers, ipv6=True)
    assert facts.detected == "aws" and facts.aws["aws_region"] == "us-west-2"
    assert all("169.254.169.254/latest" not in url for url in servers.urls())


def test_azure_is_the_dmi_vendors_word_then_its_newest_api() -> None:
    answers: dict[tuple[str, str], Answer] = {
        ("GET", AZURE): (400, {}, json.dumps({"error": "Bad request",
                                              "newest-versions": ["2021-02-01", "2018-10-01"]})),
        ("GET", AZURE + "api-version=2021-02-01"): (200, {}, json.dumps(AZURE_INSTANCE)),
    }
    servers = Servers(answers)
    facts, _ = probe(servers, sys_vendor="Microsoft Corporation\n")
    assert facts.detected == "azure"
    assert facts.azure == {"azure_name": "vm-az", "azure_location": "westeurope", "azure_vmId": "id-1",
                           "azure_team": "mesh"}
    assert facts.azure_locality == {"region": "westeurope", "zone": "2"}
    assert all(("Metadata", "True") in r.headers for r in servers.asked)
    assert servers.urls() == [AZURE, AZURE + "api-version=2021-02-01"], "nothing asked of GCE or AWS"


def test_static_gcp_metadata_asks_only_for_a_missing_zone() -> None:
    servers = Servers(gce_server())
    facts, _ = probe(servers, {"GCP_METADATA": "p|1|c|us-east1-b"})
    assert facts == CloudFacts() and servers.asked == []
    facts, _ = probe(servers, {"GCP_METADATA": "p|1|c|us-east1-b"}, zone_wanted=True)
    assert facts.gcp_zone == "us-east1-b" and facts.gcp == {}
    assert servers.urls() == [GCE + "instance/zone"]


@pytest.mark.parametrize("variables", [{}, {"CLOUD_PLATFORM": "aws"}, {"CLOUD_PLATFORM": "gcp"}])
def test_a_silent_server_delays_the_start_by_the_budget_and_no_more(variables: dict[str, str]) -> None:
    facts, elapsed = probe(Servers({}, silent=True), variables)
    assert facts.timed_out and facts.gcp == {} and facts.aws == {}
    assert elapsed == cloud.DETECT_TIMEOUT
    assert probe(Servers({}, silent=True), variables, budget=1.5)[1] == 1.5


def test_azure_tags_string_and_api_versions() -> None:
    instance = json.dumps({"compute": {"name": "n", "tags": "a:1;b;c:x:y"}})
    assert cloud.azure_metadata(instance) == ({"azure_name": "n", "azure_a": "1", "azure_b": "", "azure_c": "x:y"},
                                              {})
    assert cloud.azure_metadata("not json") == ({}, {})
    assert cloud.azure_api_version(None) == cloud.AZURE_DEFAULT_API_VERSION
    assert cloud.azure_api_version('{"newest-versions": ["2017-01-01"]}') == cloud.AZURE_DEFAULT_API_VERSION
    assert cloud.gcp_zone("projects/1/zones/europe-west4-a\n") == "europe-west4-a"
    assert cloud.gcp_value(404, "whatever", True) is None
    assert cloud.gcp_value(200, " raw \n", False) == " raw \n"

"""What the agent asks the clouds' metadata servers, and what their answers mean (sans-IO).

Upstream's agent (pkg/bootstrap/platform) learns its cloud at start by asking the
metadata servers at 169.254.169.254; `agent/cloud_probe.py` sends the requests
described here and hands the answers to these parsers, so that every rule is a
pure function of text in, facts out:

- **GCP** (the GCE metadata server): it is GCE when `GCE_METADATA_HOST` is set, or
  when `http://169.254.169.254/` answers with `Metadata-Flavor: Google`. Values are
  GETs of `http://<GCE_METADATA_HOST or 169.254.169.254>/computeMetadata/v1/<path>`
  with `Metadata-Flavor: Google` (404: not defined): project id and number,
  instance name and id, the instance attributes cluster-name, cluster-location
  (else the zone), instance-template and created-by, and, for the locality as a
  last resort, the zone (`projects/<n>/zones/<zone>`: its last part).
- **AWS** (IMDS): a session token first (PUT `/latest/api/token`, TTL 60 s; without
  one, IMDSv1), then `iam/info` (AWS when it names an `arn:aws:iam`), and
  `placement/region`, `placement/availability-zone`, `instance-id` under
  `/latest/meta-data/`; on `[fd00:ec2::254]` when the proxy has IPv6 addresses.
- **Azure** (IMDS): it is Azure when `/sys/class/dmi/id/sys_vendor` says
  `Microsoft Corporation`; then `GET /metadata/instance?` (`Metadata: True`) lists
  the API versions, and the newest (from 2019-08-15 on) fetches the instance's
  compute metadata: name, location, vmId, zone and its tags.

The timeouts are upstream's: 5 s for the whole (`DETECT_TIMEOUT`, its detection
timeout, which here also bounds the values' requests: start-up never waits
longer), 2 s per GCE request (the metadata client's), 100 ms per AWS request and
5 s per Azure one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

METADATA_IP = "169.254.169.254"
AWS_IPV6 = "fd00:ec2::254"
DETECT_TIMEOUT = 5.0
GCP_REQUEST_TIMEOUT = 2.0
AWS_REQUEST_TIMEOUT = 0.1
AZURE_REQUEST_TIMEOUT = 5.0
GCP_USER_AGENT = "gcloud-golang/0.1"  # what the GCE metadata client sends, as upstream's
SYS_VENDOR = "/sys/class/dmi/id/sys_vendor"
MICROSOFT = "Microsoft Corporation"
AZURE_DEFAULT_API_VERSION = "2019-08-15"
IDENTITY_TOKEN_PATH = "instance/service-accounts/default/identity"

# PLATFORM_METADATA keys of what the GCE metadata server tells (upstream's names) and where it is.
GCE_INSTANCE = "gcp_gce_instance"
GCE_INSTANCE_ID = "gcp_gce_instance_id"
GCE_INSTANCE_TEMPLATE = "gcp_gce_instance_template"
GCE_INSTANCE_CREATED_BY = "gcp_gce_instance_created_by"
GCP_ZONE_PATH = "instance/zone"
# (key, path, trimmed): the metadata client trims project and instance values, not attribute values.
GCP_VALUES: tuple[tuple[str, str, bool], ...] = (
    ("gcp_project", "project/project-id", True),
    ("gcp_project_number", "project/numeric-project-id", True),
    ("gcp_location", "instance/attributes/cluster-location", False),
    ("gcp_gke_cluster_name", "instance/attributes/cluster-name", False),
    (GCE_INSTANCE, "instance/name", True),
    (GCE_INSTANCE_ID, "instance/id", True),
    (GCE_INSTANCE_TEMPLATE, "instance/attributes/instance-template", False),
    (GCE_INSTANCE_CREATED_BY, "instance/attributes/created-by", False),
)
AWS_VALUES = (("aws_region", "placement/region"), ("aws_availability_zone", "placement/availability-zone"),
              ("aws_instance_id", "instance-id"))
AWS_TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
AWS_TOKEN_HEADER = "X-aws-ec2-metadata-token"


@dataclass(frozen=True)
class Request:
    """One HTTP request to a metadata server."""

    method: str
    url: str
    headers: tuple[tuple[str, str], ...] = ()
    timeout: float = GCP_REQUEST_TIMEOUT


@dataclass(frozen=True)
class CloudFacts:
    """What the metadata servers told (nothing when none was asked, or none answered).

    `detected`: the cloud detection found (gcp, aws, azure), "" when it ran and found none or did not run;
    `gcp`, `aws`, `azure`: PLATFORM_METADATA keys learnt; `gcp_zone`: the GCE zone (the locality's last
    resort); `azure_locality`: Azure's region and zone; `timed_out`: the budget ran out first.
    """

    detected: str = ""
    gcp: Mapping[str, str] = field(default_factory=dict)
    gcp_zone: str = ""
    aws: Mapping[str, str] = field(default_factory=dict)
    azure: Mapping[str, str] = field(default_factory=dict)
    azure_locality: Mapping[str, str] = field(default_factory=dict)
    timed_out: bool = False


# --- GCP ------------------------------------------------------------------------------------------------------

def gcp_host(metadata_host: str) -> str:
    """Where the GCE metadata server is: GCE_METADATA_HOST (host or host:port), else the link-local address."""
    return metadata_host or METADATA_IP


def gcp_detect_request() -> Request:
    """Is this GCE? The metadata client asks the link-local address itself (not GCE_METADATA_HOST)."""
    return Request("GET", f"http://{METADATA_IP}", (("User-Agent", GCP_USER_AGENT),), GCP_REQUEST_TIMEOUT)


def gcp_detected(headers: Mapping[str, str]) -> bool:
    return headers.get("metadata-flavor") == "Google"


def gcp_request(metadata_host: str, path: str) -> Request:
    return Request("GET", f"http://{gcp_host(metadata_host)}/computeMetadata/v1/{path.lstrip('/')}",
                   (("Metadata-Flavor", "Google"), ("User-Agent", GCP_USER_AGENT)), GCP_REQUEST_TIMEOUT)


def gcp_value(status: int, body: str, trimmed: bool) -> str | None:
    """A value the GCE metadata server answered with: None when it is not defined (404) or failed."""
    if status != 200:
        return None
    return body.strip() if trimmed else body


def gcp_zone(answer: str | None) -> str:
    """`projects/<number>/zones/<zone>` -> `<zone>`."""
    return answer.strip().rsplit("/", 1)[-1] if answer else ""


def gcp_metadata(values: Mapping[str, str | None], zone: str) -> dict[str, str]:
    """PLATFORM_METADATA from the GCE values (by key), the location falling back to the zone, as upstream."""
    out = {key: value for key, value in values.items() if value is not None}
    if "gcp_location" not in out and zone:
        out["gcp_location"] = zone
    return out


# --- AWS ------------------------------------------------------------------------------------------------------

def aws_base(ipv6: bool) -> str:
    return f"http://[{AWS_IPV6}]" if ipv6 else f"http://{METADATA_IP}"


def aws_token_request(ipv6: bool) -> Request:
    return Request("PUT", f"{aws_base(ipv6)}/latest/api/token", ((AWS_TOKEN_TTL_HEADER, "60"),),
                   AWS_REQUEST_TIMEOUT)


def aws_request(ipv6: bool, path: str, token: str) -> Request:
    headers = ((AWS_TOKEN_HEADER, token),) if token else ()
    return Request("GET", f"{aws_base(ipv6)}/latest/meta-data/{path}", headers, AWS_REQUEST_TIMEOUT)


def aws_answer(status: int, body: str) -> str | None:
    """An IMDS answer: its body on 200, else None (upstream's client treats any other status as an error)."""
    return body if status == 200 else None


def aws_detected(iam_info: str | None) -> bool:
    return iam_info is not None and "arn:aws:iam" in iam_info


def aws_metadata(values: Mapping[str, str | None]) -> dict[str, str]:
    return {key: value for key, value in values.items() if value}


# --- Azure ----------------------------------------------------------------------------------------------------

def azure_detected(sys_vendor: str | None) -> bool:
    return sys_vendor is not None and MICROSOFT in sys_vendor


def azure_request(query: str) -> Request:
    return Request("GET", f"http://{METADATA_IP}/metadata/instance?{query}", (("Metadata", "True"),),
                   AZURE_REQUEST_TIMEOUT)


def _json_object(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "")
    except ValueError:
        if text:
            log.warning("Azure metadata: could not read the answer as JSON")
        return {}
    return value if isinstance(value, dict) else {}


def azure_api_version(versions_answer: str | None) -> str:
    """The newest API version the server lists (`newest-versions`), if newer than upstream's default."""
    version = AZURE_DEFAULT_API_VERSION
    newest = _json_object(versions_answer).get("newest-versions")
    for candidate in newest if isinstance(newest, list) else ():
        if isinstance(candidate, str) and candidate > version:
            version = candidate
    return version


def azure_metadata(instance_answer: str | None, prefix: str = "azure_") -> tuple[dict[str, str], dict[str, str]]:
    """(PLATFORM_METADATA, locality) from the instance's metadata: name, location, vmId and tags (tagsList,
    else the `k:v;k2:v2` string), and its location and zone."""
    compute = _json_object(instance_answer).get("compute")
    compute = compute if isinstance(compute, dict) else {}

    def text(key: str) -> str:
        value = compute.get(key)
        return value if isinstance(value, str) else ""

    metadata = {prefix + key: text(key) for key in ("name", "location", "vmId") if text(key)}
    tags = compute.get("tagsList")
    if isinstance(tags, list):
        for tag in tags:
            if isinstance(tag, dict) and isinstance(tag.get("name"), str):
                metadata[prefix + tag["name"]] = str(tag.get("value", ""))
    elif text("tags"):
        for item in text("tags").split(";"):
            name, _, value = item.partition(":")
            metadata[prefix + name] = value
    locality = {key: value for key, value in (("region", text("location")), ("zone", text("zone"))) if value}
    return metadata, locality

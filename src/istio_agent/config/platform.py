"""The cloud platform the proxy runs on and what it says about the node (upstream's pkg/bootstrap/platform).

Upstream's agent learns its platform two ways, and so does this one: from
environment variables (`CLOUD_PLATFORM`, and for GCP `GCP_METADATA`,
`GCP_QUOTA_PROJECT`, `GCP_ZONE`), and from the cloud's metadata server, which
`agent/cloud_probe.py` asks at start (`config/cloud_metadata.py` says what and
with which timeouts) unless `CLOUD_PLATFORM=none` says not to. Its answers
arrive here as `CloudFacts`; these rules decide, as upstream's do, which
platform it is and what it says.

What the facts feed: `PLATFORM_METADATA` in node metadata (istiod and the
bootstrap read it: the Stackdriver tracer takes its GCP project from it, a
custom template gets `gcp_project_number` / `gcp_project_id`), and the node's
locality when the pod has no locality label. GCE instance labels, which
upstream adds off Kubernetes from compute.googleapis.com (an authenticated
Google API call, not the metadata server), are not fetched (warned).

Pure: `discover()` reads an `env.Environment` and the facts, `platform_locality()`
is given /etc/resolv.conf's text (read at the I/O edge, the loader). Nothing here
opens a socket.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from istio_agent.config import env
from istio_agent.config.cloud_metadata import CloudFacts

log = logging.getLogger(__name__)

# PLATFORM_METADATA keys (upstream's names).
GCP_PROJECT = "gcp_project"
GCP_PROJECT_NUMBER = "gcp_project_number"
GCP_CLUSTER = "gcp_gke_cluster_name"
GCP_CLUSTER_URL = "gcp_gke_cluster_url"
GCP_LOCATION = "gcp_location"
GCP_QUOTA_PROJECT = "gcp_quota_project"
GCP_ZONE = "gcp_zone"

GCP = "gcp"
AWS = "aws"
AZURE = "azure"
NONE = "none"
CLOUD_PLATFORMS = (AWS, AZURE, GCP, NONE)  # what CLOUD_PLATFORM may name; anything else means "detect"
UNKNOWN = ""  # no platform: no metadata, no locality (upstream's platform.Unknown)

RESOLV_CONF = "/etc/resolv.conf"  # where GKE writes the node's zone into the search list
GKE_CLUSTER_URL = "https://container.googleapis.com/v1/projects/{project}/locations/{location}/clusters/{cluster}"
GCP_METADATA_PARTS = 4  # PROJECT_ID|PROJECT_NUMBER|CLUSTER_NAME|CLUSTER_ZONE

# A GCE internal search domain `<zone>.c.<project>.internal`, where a zone is three dash-separated parts.
_ZONE_IN_SEARCH_LINE = re.compile(r"^search.* ([^-]+-[^-]+-[^-]+)\.c\.[^.]+\.internal")
# A zone is `<country>-<region>-<zone>`; its region is the first two parts.
_ZONE = re.compile(r"^([^-]+-[^-]+)-[^-]+$")


@dataclass(frozen=True)
class Platform:
    """The platform found and what the environment says about it.

    `metadata` is PLATFORM_METADATA (empty: the key is left out of node metadata);
    `zone` is GCP_ZONE as upstream keeps it (only alongside GCP_METADATA);
    `kubernetes` is upstream's IsKubernetes, which decides whether instance labels
    would have been fetched.
    """

    name: str = UNKNOWN
    metadata: Mapping[str, str] = field(default_factory=dict)
    zone: str = ""
    kubernetes: bool = True
    # The metadata server's answers for the locality: GCE's zone (asked last, as upstream), AWS's and Azure's
    # region and zone.
    metadata_zone: str = ""
    locality: Mapping[str, str] = field(default_factory=dict)


def gke_cluster_url(metadata: Mapping[str, str]) -> str | None:
    """The GKE cluster's API URL, or None unless project, location and cluster name are all known."""
    if not all(key in metadata for key in (GCP_PROJECT, GCP_LOCATION, GCP_CLUSTER)):
        return None
    return GKE_CLUSTER_URL.format(project=metadata[GCP_PROJECT], location=metadata[GCP_LOCATION],
                                  cluster=metadata[GCP_CLUSTER])


def gcp_static_metadata(gcp_metadata: str, quota_project: str = "", zone: str = "") -> dict[str, str]:
    """PLATFORM_METADATA from GCP_METADATA, GCP_QUOTA_PROJECT and GCP_ZONE, by upstream's rules.

    Nothing at all without GCP_METADATA (so GCP_ZONE and GCP_QUOTA_PROJECT alone
    count for nothing, as upstream). GCP_METADATA gives project, project number,
    cluster and location only when it has exactly four `|`-separated parts; a
    value of another shape is ignored (as upstream does; here with a warning) but
    still lets the other two variables in.
    """
    if not gcp_metadata:
        return {}
    out: dict[str, str] = {}
    parts = gcp_metadata.split("|")
    if len(parts) == GCP_METADATA_PARTS:
        out[GCP_PROJECT], out[GCP_PROJECT_NUMBER], out[GCP_CLUSTER], out[GCP_LOCATION] = parts
    else:
        log.warning("environment variable GCP_METADATA=%r: expected PROJECT_ID|PROJECT_NUMBER|CLUSTER_NAME|"
                    "CLUSTER_ZONE (4 parts), got %d part(s); ignored", gcp_metadata, len(parts))
    if quota_project:
        out[GCP_QUOTA_PROJECT] = quota_project
    url = gke_cluster_url(out)
    if url is not None:
        out[GCP_CLUSTER_URL] = url
    if zone:
        out[GCP_ZONE] = zone
    return out


def _gcp(environment: env.Environment, static: Mapping[str, str], facts: CloudFacts) -> Platform:
    # Static metadata wins whole (upstream does no lookups then); else what the metadata server told.
    metadata = dict(static) if static else dict(facts.gcp)
    if not static and metadata:
        url = gke_cluster_url(metadata)
        if url is not None:
            metadata[GCP_CLUSTER_URL] = url
    kubernetes = environment.is_set(env.KUBERNETES_SERVICE_HOST) or bool(metadata.get(GCP_CLUSTER))
    if not kubernetes:
        # Off Kubernetes upstream adds the GCE instance's labels, asked of compute.googleapis.com.
        log.warning("GCE instance labels are not fetched from compute.googleapis.com (an authenticated Google API "
                    "call this agent does not make); node metadata has only the pod's own labels")
    return Platform(GCP, metadata, static.get(GCP_ZONE, ""), kubernetes, facts.gcp_zone)


def discover(environment: env.Environment, facts: CloudFacts | None = None) -> Platform:
    """The platform, as upstream's Discover decides it, from the environment and the metadata servers' answers.

    CLOUD_PLATFORM names it (any case): `gcp`, `aws` and `azure` take what their
    metadata server told (`facts`), `none` is no platform. Unset (or not one of
    those), the platform is detected: GCP when GCP_METADATA yields metadata, else
    the cloud whose metadata server (or, for Azure, the DMI vendor) said so.
    """
    facts = facts or CloudFacts()
    cloud = environment.get(env.CLOUD_PLATFORM)
    static = gcp_static_metadata(environment.get(env.GCP_METADATA), environment.get(env.GCP_QUOTA_PROJECT),
                                 environment.get(env.GCP_ZONE))
    chosen = cloud.lower()
    if chosen == NONE:
        return Platform(UNKNOWN)
    if chosen not in CLOUD_PLATFORMS:
        if cloud:
            log.warning("environment variable CLOUD_PLATFORM=%r: not one of %s; detecting the platform, as "
                        "upstream", cloud, ", ".join(CLOUD_PLATFORMS))
        chosen = GCP if static else facts.detected
        if not chosen:
            log.info("no cloud platform detected%s; no platform metadata or locality",
                     " (the metadata servers did not answer in time)" if facts.timed_out else "")
            return Platform(UNKNOWN)
        log.info("platform detected is %s", {GCP: "GCP", AWS: "AWS", AZURE: "Azure"}[chosen])
    if chosen == GCP:
        return _gcp(environment, static, facts)
    if chosen == AWS:
        locality = {"region": facts.aws.get("aws_region", ""), "zone": facts.aws.get("aws_availability_zone", "")}
        return Platform(AWS, dict(facts.aws), locality=locality)
    return Platform(AZURE, dict(facts.azure), locality=dict(facts.azure_locality))


def zone_from_resolv_conf(text: str) -> str:
    """The GCE zone in resolv.conf's search list (`... us-central1-f.c.PROJECT.internal ...`), or ""."""
    for line in text.split("\n"):
        match = _ZONE_IN_SEARCH_LINE.match(line)
        if match:
            return match.group(1)
    return ""


def zone_to_region(zone: str) -> str | None:
    """The region of a GCP zone (`us-central1-f` -> `us-central1`), or None when it is not a zone."""
    match = _ZONE.match(zone)
    return match.group(1) if match else None


def platform_locality(platform: Platform, resolv_conf: str | None) -> dict[str, str]:
    """The node's region and zone from the platform, for a pod with no locality label; {} when unknown.

    AWS and Azure: what their metadata server told (empty parts included, as upstream's locality carries
    them). GCP: the zone is GCP_ZONE (when GCP_METADATA is set), else the one in resolv.conf's search list
    (`resolv_conf`: its text, None when unreadable), else the GCE metadata server's; the region is the zone
    less its last part, and a zone without three parts gives no locality at all, as upstream.
    """
    if platform.name in (AWS, AZURE):
        return {key: value for key, value in platform.locality.items() if value}
    if platform.name != GCP:
        return {}
    zone = platform.zone
    if not zone:
        if resolv_conf is None:
            log.warning("failed to read %s: no GCP zone from its search list", RESOLV_CONF)
        else:
            zone = zone_from_resolv_conf(resolv_conf)
            if not zone:
                log.warning("no GCP zone in %s's search list", RESOLV_CONF)
    zone = zone or platform.metadata_zone
    if not zone:
        log.warning("no GCP zone from GCP_ZONE, resolv.conf or the GCE metadata server; the node has no locality")
        return {}
    region = zone_to_region(zone)
    if region is None:
        log.warning("GCP zone %r: expected <country>-<region>-<zone>, so no region; the node has no locality", zone)
        return {}
    return {"region": region, "zone": zone}

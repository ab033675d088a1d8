"""The cloud platform the proxy runs on, learnt from the environment alone (upstream's pkg/bootstrap/platform).

Upstream's agent learns its platform two ways: from environment variables
(`CLOUD_PLATFORM`, and for GCP `GCP_METADATA`, `GCP_QUOTA_PROJECT`,
`GCP_ZONE`) and by asking the cloud's metadata server (169.254.169.254 on GCE,
AWS and Azure) or, for GCE instance labels, compute.googleapis.com. This
agent never contacts a metadata server, nor any non-loopback address, at
start: a pod's start must not depend on, or leak to, a server it was not told
about. So only the first way is implemented. Where upstream would have asked a
server, these rules log what was not fetched and go on with what the
environment says, which is what upstream itself does when the server does not
answer.

What the facts feed: `PLATFORM_METADATA` in node metadata (istiod and the
bootstrap read it: the Stackdriver tracer takes its GCP project from it, a
custom template gets `gcp_project_number` / `gcp_project_id`), and the node's
locality when the pod has no locality label.

Pure: `discover()` reads an `env.Environment`, `platform_locality()` is given
/etc/resolv.conf's text (read at the I/O edge, `options.load_agent_options`).
Nothing here opens a socket.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from istio_agent.config import env

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


def _gcp(environment: env.Environment, static: Mapping[str, str], explicit: bool) -> Platform:
    if not static:
        # Upstream would fill project, cluster and instance facts from the metadata server.
        (log.warning if explicit else log.info)(
            "GCP platform metadata is not fetched from the metadata server (this agent never contacts it); "
            "set GCP_METADATA=PROJECT_ID|PROJECT_NUMBER|CLUSTER_NAME|CLUSTER_ZONE to supply it")
    kubernetes = environment.is_set(env.KUBERNETES_SERVICE_HOST) or bool(static.get(GCP_CLUSTER))
    if not kubernetes:
        # Off Kubernetes upstream adds the GCE instance's labels, asked of compute.googleapis.com.
        log.warning("GCE instance labels are not fetched from compute.googleapis.com (this agent never contacts "
                    "it); node metadata has only the pod's own labels")
    return Platform(GCP, dict(static), static.get(GCP_ZONE, ""), kubernetes)


def discover(environment: env.Environment) -> Platform:
    """The platform, as upstream's Discover decides it, without asking any metadata server.

    CLOUD_PLATFORM names it (any case): `gcp` and `none` as upstream; `aws` and
    `azure` know nothing without their metadata servers, so they give no metadata
    and no locality, with a warning. Unset (or not one of those), the platform is
    detected: GCP when GCP_METADATA (with GCP_QUOTA_PROJECT / GCP_ZONE) yields
    metadata; upstream would then probe the three metadata servers, which this
    agent does not, so anything else is no platform.
    """
    cloud = environment.get(env.CLOUD_PLATFORM)
    static = gcp_static_metadata(environment.get(env.GCP_METADATA), environment.get(env.GCP_QUOTA_PROJECT),
                                 environment.get(env.GCP_ZONE))
    chosen = cloud.lower()
    if chosen == GCP:
        return _gcp(environment, static, explicit=True)
    if chosen in (AWS, AZURE):
        log.warning("environment variable CLOUD_PLATFORM=%s: %s platform metadata and locality come only from "
                    "its metadata server, which this agent never contacts; none are set", cloud,
                    {AWS: "AWS", AZURE: "Azure"}[chosen])
        return Platform(chosen)
    if chosen == NONE:
        return Platform(UNKNOWN)
    if cloud:
        log.warning("environment variable CLOUD_PLATFORM=%r: not one of %s; detecting the platform, as upstream",
                    cloud, ", ".join(CLOUD_PLATFORMS))
    if static:
        log.info("platform detected is GCP (GCP_METADATA)")
        return _gcp(environment, static, explicit=False)
    log.info("no cloud platform detected from the environment (GCE, AWS and Azure metadata servers are not "
             "asked); no platform metadata or locality")
    return Platform(UNKNOWN)


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

    On GCP the zone is GCP_ZONE (when GCP_METADATA is set), else the one in
    resolv.conf's search list (`resolv_conf`: its text, None when unreadable);
    upstream would then ask the metadata server, which this agent does not. The
    region is the zone less its last part; a zone without three parts gives no
    locality at all, as upstream. Other platforms give none here.
    """
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
    if not zone:
        log.warning("GCP zone is not fetched from the metadata server (this agent never contacts it); set GCP_ZONE "
                    "(with GCP_METADATA) or a locality label; the node has no locality")
        return {}
    region = zone_to_region(zone)
    if region is None:
        log.warning("GCP zone %r: expected <country>-<region>-<zone>, so no region; the node has no locality", zone)
        return {}
    return {"region": region, "zone": zone}

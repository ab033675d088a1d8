"""Proxyless gRPC pods as data: Istio's `grpc-agent` template for the local node (no I/O here).

The template gives a pod two containers and no istio-init (a proxyless app
talks xDS itself, so nothing is captured):

- `istio-proxy` runs `pilot-agent proxy sidecar` with DISABLE_ENVOY and
  ISTIO_META_GENERATOR=grpc. It writes the gRPC bootstrap to
  `/etc/istio/proxy/grpc-bootstrap.json`, keeps the workload certificates in
  `/var/lib/istio/data` (OUTPUT_CERTS) and serves xDS on
  `/etc/istio/proxy/XDS`. Its postStart hook, `pilot-agent wait` on the
  status port, holds the app back until the agent is ready.
- the app gets `GRPC_XDS_BOOTSTRAP=/etc/istio/proxy/grpc-bootstrap.json` and
  shares the `istio-xds` (/etc/istio/proxy) and `istio-data`
  (/var/lib/istio/data) volumes with the agent.

Those absolute paths are what the template and the bootstrap contain, so the
node reproduces the volumes: each container runs in its own mount namespace
(`unshare --mount --propagation private`) where the pod's directories are
bind-mounted onto the template's mount paths, with `/` as working directory,
so the agent's relative defaults (`./etc/istio/proxy`,
`./var/run/secrets/tokens/istio-token`) land in the same volumes. The mounts
live and die with the container's process; nothing is mounted on the host.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from istiod_local.node.plan import ISTIOD_SAN, NodePlan, PodPlan, as_user

STATUS_PORT = 15020
READY_URL = f"http://localhost:{STATUS_PORT}/healthz/ready"
GRPC_XDS_BOOTSTRAP = "/etc/istio/proxy/grpc-bootstrap.json"
OUTPUT_CERTS = "/var/lib/istio/data"

# The template's volumes: mount path in the container (also the directory under the pod's root on the host).
ISTIO_XDS = "etc/istio/proxy"
ISTIO_DATA = "var/lib/istio/data"
AGENT_VOLUMES = (
    ISTIO_XDS,
    ISTIO_DATA,
    "etc/istio/pod",                                   # istio-podinfo (downward API)
    "var/run/secrets/tokens",                          # istio-token
    "var/run/secrets/istio",                           # istiod-ca-cert
    "var/run/secrets/workload-spiffe-uds",             # workload-socket
    "var/run/secrets/workload-spiffe-credentials",     # workload-certs
)
APP_VOLUMES = (ISTIO_DATA, ISTIO_XDS)

# Binds each (source, target) pair given before `--`, then runs the rest from `/`. `set -e`: a failed
# mount ends the container with mount's message in its log instead of starting a program without its volume.
MOUNT_SCRIPT = ('set -e; while [ "$1" != -- ]; do mount --bind "$1" "$2"; shift 2; done; shift; '
                'cd /; exec "$@"')


def mount_targets() -> list[str]:
    """Every absolute path a proxyless container mounts on: the directories that must exist on the host."""
    return sorted({f"/{volume}" for volume in (*AGENT_VOLUMES, *APP_VOLUMES)})


def volume_mounts(pod_root: str, volumes: Sequence[str]) -> list[tuple[str, str]]:
    """(host directory, container path) for each volume of a container, sources under the pod's root."""
    return [(f"{pod_root.rstrip('/')}/{volume}", f"/{volume}") for volume in volumes]


def in_container(netns: str, mounts: Sequence[tuple[str, str]], argv: Sequence[str], uid: int | None = None,
                 gid: int | None = None, pdeathsig: str = "SIGTERM", image: str = "") -> list[str]:
    """argv as a container of a proxyless pod: the pod's network namespace, its own mount namespace, cwd `/`.

    `image` is shell run first, in that mount namespace (`container.image_script`:
    what makes the interpreter reachable for a non-root `uid`). `ip netns exec`,
    `unshare` (no --fork), `sh` and `setpriv` all exec, so the pid of the
    started process is the program's own, as with `plan.in_netns`.
    """
    pairs = [path for pair in mounts for path in pair]
    script = f"set -e; {image}; {MOUNT_SCRIPT}" if image else MOUNT_SCRIPT
    return ["ip", "netns", "exec", netns, "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", script, "sh", *pairs, "--", *as_user(uid, gid, pdeathsig), "--", *argv]


def proxy_config_json(node: NodePlan, pod: PodPlan) -> str:
    """`PROXY_CONFIG`: the template's `{}` plus istiod at the node's gateway and the pod's own fields."""
    config: dict[str, Any] = {"discoveryAddress": node.discovery_address}
    config.update(pod.spec.proxy_config)
    return json.dumps(config, sort_keys=True)


def agent_environment(node: NodePlan, pod: PodPlan, base: Mapping[str, str],
                      trust_domain: str = "cluster.local") -> dict[str, str]:
    """The istio-proxy container's environment in the grpc-agent template, for this node.

    As for sidecars, `CA_ADDR` and `discoveryAddress` are the gateway address and
    `ISTIOD_SAN` names the service istiod's certificate is issued for.
    """
    spec = pod.spec
    environment = {key: value for key, value in base.items() if key in ("PATH", "LANG", "LC_ALL", "TZ")}
    environment.update({
        "ISTIO_META_GENERATOR": "grpc",
        "OUTPUT_CERTS": OUTPUT_CERTS,
        "JWT_POLICY": "third-party-jwt",
        "PILOT_CERT_PROVIDER": "istiod",
        "CA_ADDR": node.discovery_address,
        "ISTIOD_SAN": ISTIOD_SAN,
        "POD_NAME": spec.name,
        "POD_NAMESPACE": spec.namespace,
        "INSTANCE_IP": pod.ip,
        "SERVICE_ACCOUNT": spec.service_account,
        "HOST_IP": node.gateway,
        "PROXY_CONFIG": proxy_config_json(node, pod),
        "ISTIO_META_APP_CONTAINERS": "app" if spec.app else "",
        "ISTIO_META_CLUSTER_ID": "Kubernetes",
        "ISTIO_META_MESH_ID": trust_domain,
        "TRUST_DOMAIN": trust_domain,
        "ISTIO_META_DNS_CAPTURE": "false",
        "DISABLE_ENVOY": "true",
        "HOME": "/tmp",
    })
    environment.update(spec.agent_env)
    return environment


def agent_argv(pod: PodPlan, pilot_agent: str) -> list[str]:
    """The template's args: `proxy sidecar --domain $(POD_NAMESPACE).svc.cluster.local` and its log levels."""
    return [pilot_agent, "proxy", "sidecar", "--domain", f"{pod.spec.namespace}.svc.cluster.local",
            "--proxyLogLevel=warning", "--proxyComponentLogLevel=misc:error", "--log_output_level=default:info"]


def post_start_argv(pilot_agent: str, timeout_seconds: int = 60) -> list[str]:
    """The postStart hook: `pilot-agent wait` on the agent's own readiness (no Envoy, so :15020, not :15021)."""
    return [pilot_agent, "wait", f"--url={READY_URL}", f"--timeoutSeconds={timeout_seconds}", "--periodMillis=100"]


def app_environment(pod: PodPlan, base: Mapping[str, str]) -> dict[str, str]:
    """The app container's environment: the template's two gRPC variables plus the pod fields the node sets."""
    spec = pod.spec
    environment = {key: value for key, value in base.items() if key in ("PATH", "LANG", "LC_ALL", "TZ")}
    environment.update({
        "HOME": "/tmp",
        "POD_NAME": spec.name,
        "POD_NAMESPACE": spec.namespace,
        "INSTANCE_IP": pod.ip,
        "GRPC_XDS_EXPERIMENTAL_SECURITY_SUPPORT": "true",
        "GRPC_XDS_BOOTSTRAP": GRPC_XDS_BOOTSTRAP,
    })
    environment.update(spec.app_env)
    return environment

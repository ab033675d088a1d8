"""`istiod-local`'s table: every command's arguments and flags, and istiod's variables it reads, declared
once (the shape is the product's `config/settings.py`).

`cli/main.py` and `cli/up.py` build their click options from it
(`istio_agent.config.clickflags`; what only click checks, a `click.Path` or a
range, is added there), and `docs/reference/istiod-local.md` is generated from
it (`python -m istiod_local.cli.reference`, `make docs`). A flag whose value
click parses with the table's parser keeps its default as the text a user
would write (`24h`), which help shows as is.
"""

from __future__ import annotations

from typing import Any

from istio_agent.config.durations import parse_duration
from istio_agent.config.gobool import parse_bool
from istio_agent.config.settings import (
    ACCEPTED,
    Argument,
    Command,
    EnvVar,
    Flag,
    Program,
    floating,
    go_bool,
    integer,
)
from istiod_local.controlplane.monitoring import DEFAULT_MONITORING_ADDR
from istiod_local.controlplane.server import DEFAULT_GRPC_ADDR, DEFAULT_SECURE_GRPC_ADDR, DEFAULT_TRUST_DOMAIN
from istiod_local.controlplane.xds.autoregistration import DEFAULT_GRACE_PERIOD


def positive_duration(value: str) -> float:
    """A Go duration longer than zero, in seconds."""
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"must be positive, got {value!r}")
    return seconds


def non_negative_duration(value: str) -> float:
    """A Go duration, zero or longer, in seconds."""
    seconds = parse_duration(value)
    if seconds < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return seconds


def boolean(value: str) -> bool:
    """Go's strconv.ParseBool, with the short message click shows."""
    try:
        return parse_bool(value)
    except ValueError:
        raise ValueError(f"not a boolean: {value!r}") from None


# istiod's variables istiod-local honours (read as istiod reads them: Go durations and booleans).
GRACE_PERIOD = EnvVar("PILOT_WORKLOAD_ENTRY_GRACE_PERIOD", DEFAULT_GRACE_PERIOD,
                      "How long an auto-registered WorkloadEntry outlives its proxy's last stream (not negative); "
                      "--workload-entry-grace-period wins.", non_negative_duration, "duration")
AUTOREGISTRATION = EnvVar("PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION", True,
                          "Create a WorkloadEntry when a proxy of an auto-registering WorkloadGroup connects.",
                          go_bool, "bool")
HEALTHCHECKS = EnvVar("PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS", True,
                      "Keep auto-registered WorkloadEntries' health condition from their proxies' reports.",
                      go_bool, "bool")
VALIDATE_IDENTITY = EnvVar("ISTIO_WORKLOAD_ENTRY_VALIDATE_IDENTITY", True,
                           "Register a proxy only when its certificate's identity is the WorkloadGroup's namespace "
                           "and service account.", go_bool, "bool")
WORKLOAD_ENTRY_VARIABLES = (GRACE_PERIOD, AUTOREGISTRATION, HEALTHCHECKS, VALIDATE_IDENTITY)

STATE_DIR = Flag("state-dir", None, "Directory holding the root CA, serving certificate and token-signing key "
                 "(created on first use).", type_name="path", required=True)
TRUST_DOMAIN = Flag("trust-domain", DEFAULT_TRUST_DOMAIN, "SPIFFE trust domain of issued identities.")
NAMESPACE = Flag("namespace", None, "The pod's namespace.", required=True)
SERVICE_ACCOUNT = Flag("service-account", None, "The pod's service account.", required=True)
POD = Flag("pod", "", "Pod name, bound into the token like a projected token's pod claim.")
TOKEN_TTL: Flag[Any] = Flag("token-ttl", "1h", "Token lifetime.", positive_duration, "duration")

SERVE = Command("serve", "Serve the CA (and, with --registry, xDS), and the Kubernetes API, until SIGTERM or SIGINT.", (
    STATE_DIR,
    Flag("grpc-addr", DEFAULT_GRPC_ADDR, "Plaintext gRPC address (empty to disable; port 0 picks one)."),
    Flag("secure-grpc-addr", DEFAULT_SECURE_GRPC_ADDR, "TLS gRPC address (empty to disable; port 0 picks one)."),
    Flag("max-cert-ttl", "24h", "Longest workload certificate lifetime; longer requests are capped.",
         positive_duration, "duration"),
    TRUST_DOMAIN,
    Flag("log-level", "info", "How much istiod-local logs (to stderr).",
         choices=("debug", "info", "warning", "error")),
    Flag("registry", None, "Mesh registry YAML (services, workloads, peerAuthentication, serviceEntries): serve ADS "
         "from it on the same ports, reloading it when it changes.", type_name="path"),
    Flag("kube-api-addr", "127.0.0.1:6443", "HTTPS address of the Kubernetes API (pods and namespaces from the "
         "registry); 'off' disables it, port 0 picks one."),
    Flag("kube-node-name", None, "spec.nodeName of pods whose workload names no nodeName (default: this host's "
         "name)."),
    Flag("kube-bookmark-interval", "60s", "How often a watch asking for bookmarks gets one.", positive_duration,
         "duration"),
    Flag("kube-watch-history", 1000, "Changes kept for watches to resume from; an older resourceVersion is 410 "
         "Expired.", integer, "int"),
    Flag("monitoring-addr", DEFAULT_MONITORING_ADDR, "HTTP address of istiod's monitoring port: /metrics, "
         "/debug/connections, /debug/syncz; 'off' disables it, port 0 picks one."),
    Flag("workload-entry-grace-period", None, "How long an auto-registered WorkloadEntry outlives its proxy's last "
         "stream [default: $PILOT_WORKLOAD_ENTRY_GRACE_PERIOD, else 10s].", non_negative_duration, "duration",
         env=(GRACE_PERIOD.name,)),
), variables=WORKLOAD_ENTRY_VARIABLES)
POD_FILES = Command("pod-files", "Write the root certificate and service-account token Kubernetes would mount into "
                    "a pod.", (
    STATE_DIR, NAMESPACE, SERVICE_ACCOUNT, POD, TOKEN_TTL,
    Flag("out", None, "Pod root: files go under OUT/var/run/secrets/.", type_name="path", required=True),
    TRUST_DOMAIN,
))
TOKEN = Command("token", "Print a service-account token istiod-local accepts.",
                (STATE_DIR, NAMESPACE, SERVICE_ACCOUNT, POD, TOKEN_TTL, TRUST_DOMAIN))
KUBECONFIG = Command("kubeconfig", "Write a kubeconfig (and optionally a service-account directory) for "
                     "istiod-local's Kubernetes API.", (
    STATE_DIR,
    Flag("out", None, "The kubeconfig to write (0600).", type_name="path", required=True),
    Flag("server", "https://127.0.0.1:6443", "The API server URL the kubeconfig names."),
    Flag("identity", "kube-system/istiod-local-admin",
         "namespace/serviceaccount the token speaks for (istio-system/istio-cni for the CNI)."),
    Flag("token-ttl", "24h", "Token lifetime.", positive_duration, "duration"),
    Flag("service-account-dir", None, "Also write token, ca.crt and namespace here, as Kubernetes mounts a service "
         "account.", type_name="path"),
    TRUST_DOMAIN,
))
WORKLOAD_ENTRY = Command("workload-entry", "VMs and other machines outside Kubernetes (the role of `istioctl x "
                         "workload entry`).")
WORKLOAD_ENTRY_CONFIGURE = Command(
    "workload-entry configure", "Write cluster.env, mesh.yaml, root-cert.pem, istio-token and hosts for a "
    "WorkloadGroup's VMs.", (
        STATE_DIR,
        Flag("name", "", "The WorkloadGroup's name."),
        Flag("namespace", "", "The namespace the workload instances belong to.", short="n"),
        Flag("file", None, "A WorkloadGroup object (YAML), when the registry defines no such group.", type_name="path",
             short="f", dest="filename"),
        Flag("registry", None, "istiod-local's registry: the group is taken from it when it defines one.",
             type_name="path"),
        Flag("output", None, "Output directory for the generated files.", type_name="path", short="o",
             aliases=("out",), required=True),
        Flag("autoregister", False, "Create a WorkloadEntry when the VM's proxy connects.", go_bool, "bool"),
        Flag("capture-dns", "true", "Capture the VM's outgoing DNS (port 53) for the agent.", boolean, "bool",
             takes_value=True),
        Flag("clusterID", "Kubernetes", "The ID of the cluster (ISTIO_META_CLUSTER_ID).", dest="cluster_id"),
        Flag("externalIP", "", "External IP address of the workload.", dest="external_ip"),
        Flag("internalIP", "", "Internal IP address of the workload.", dest="internal_ip"),
        Flag("ingressIP", "", "The address `hosts` maps istiod's name to (default: the host of --discovery-address).",
             dest="ingress_ip"),
        Flag("ingressService", "istio-eastwestgateway",
             "Accepted for istioctl's sake; istiod-local has no ingress gateway to look up.", dest="ingress_service",
             support=ACCEPTED, note="istiod-local has no ingress gateway to look up"),
        Flag("tokenDuration", 3600, "The token's lifetime in seconds.", integer, "int", dest="token_duration"),
        Flag("revision", "", "Control plane revision (istiod-<revision> names).", short="r"),
        Flag("istio-namespace", "istio-system", "istiod's namespace (its name in mesh.yaml and hosts)."),
        Flag("discovery-address", DEFAULT_SECURE_GRPC_ADDR, "host:port where the VM reaches istiod-local's TLS port: "
             "its port goes into mesh.yaml's discoveryAddress, its host (an IP) into hosts."),
        TRUST_DOMAIN,
    ))
UP = Command(
    "up", "Bring up the mesh MESH_FILE describes (default examples/mesh.yaml) on a local node; Ctrl-C removes it.", (
        Flag("dir", "run", "istiod-local's state, the registry, the node's logs and the run lock go here.",
             type_name="path", dest="directory"),
        Flag("capture", "cni", "Who programs a sidecar pod's capture: the Istio CNI plugin or istio-init.",
             choices=("cni", "init")),
        Flag("cni", "istio-agent", "The node's CNI agent (with --capture cni): our install-cni and istio-cni, or "
             "upstream Istio's Go ones (installed by `make upstream`, or in ISTIO_UPSTREAM_BIN).",
             choices=("istio-agent", "upstream")),
        Flag("control-plane", "istiod-local", "Whose xDS and certificates the pods get: istiod-local's, or upstream's "
             "real istiod (pilot-discovery, installed by `make upstream`, or in ISTIO_UPSTREAM_BIN) run beside "
             "istiod-local, which keeps the Kubernetes API, the token issuer and the root CA (needs --capture cni). "
             "Only the real istiod applies the Istio config a mesh file names (istioConfig) and runs gateways.",
             choices=("istiod-local", "istiod")),
        Flag("scale", 1, "Multiply every deployment's replicas.", integer, "int"),
        Flag("check", False, "Probe every pair of workloads against the file's policies, print the table, exit 0 if "
             "every expectation held, 1 otherwise.", go_bool, "bool"),
        Flag("once", False, "Exit once every pod is ready.", go_bool, "bool"),
        Flag("timeout", 120.0, "Seconds to wait for each step (a pod's readiness, istiod-local's start).", floating,
             "float"),
        Flag("pod-cidr", "10.244.0.0/24", "The node's pod network."),
        Flag("live", None, "The live view (default on a terminal) or the plain one-line-per-event log.", go_bool,
             "bool", off="plain"),
    ), (Argument("mesh_file", None, "The mesh file (default examples/mesh.yaml).", type_name="path",
                 required=False),))

_ALL: tuple[Any, ...] = (SERVE, POD_FILES, TOKEN, KUBECONFIG, WORKLOAD_ENTRY, WORKLOAD_ENTRY_CONFIGURE, UP)
ISTIOD_LOCAL = Program(
    "istiod-local",
    "A local stand-in for istiod: a CA (IstioCertificateService), a service-account token issuer, xDS from a "
    "registry file, the slice of the Kubernetes API the CNI uses, VM onboarding files; and `up`, a whole mesh "
    "from one file on a local node. Not upstream: this project's local environment.",
    (Command("", "A local stand-in for istiod: a CA (IstioCertificateService) and a service-account token "
             "issuer."), *_ALL),
    "istiod-local/src/istiod_local/cli/flags.py",
    upstream=False,
)

"""The registry: every environment variable the agent reads, declared once.

Each entry has upstream's name and default, what it means, and how much of it
this agent honours (see `config/envvar.py`). Only `config/` reads these; the
options resolver turns them into per-component options. `docs/ENVIRONMENT.md`
is generated from this file.
"""

from __future__ import annotations

from istio_agent.config.envvar import (
    PARTIAL,
    REGISTRY,
    Environment,
    EnvVar,
    boolean,
    duration,
    floating,
    integer,
    parse_bool,
    string,
)

__all__ = ["REGISTRY", "EnvVar", "Environment", "parse_bool"]

# --- identity of the pod --------------------------------------------------------------------------
POD_NAME = string("POD_NAME", "", "Name of the pod, part of the node id.")
POD_NAMESPACE = string("POD_NAMESPACE", "", "Namespace of the pod; SPIFFE id and default domain.")
INSTANCE_IP = string("INSTANCE_IP", "", "The pod IP; first IP of the node id.")
INSTANCE_IPS = string("INSTANCE_IPS", "", "Not upstream. Comma-separated pod IPs (dual stack), after INSTANCE_IP.",
                      upstream=False)
SERVICE_ACCOUNT = string("SERVICE_ACCOUNT", "", "Kubernetes service account; SPIFFE id.")
ISTIO_META_CLUSTER_ID = string("ISTIO_META_CLUSTER_ID", "Kubernetes", "Cluster id sent as ClusterID.")
ISTIO_VERSION = string("ISTIO_VERSION", "", "Not upstream. Istio version reported in node metadata.",
                       upstream=False)
TRUST_DOMAIN = string("TRUST_DOMAIN", "cluster.local", "SPIFFE trust domain of workload ids.")
HOST_IP = string("HOST_IP", "", "The node's IP: replaces $(HOST_IP) in tracing addresses and the bootstrap override.")

# --- configuration layers --------------------------------------------------------------------------
PROXY_CONFIG = string("PROXY_CONFIG", "", "ProxyConfig (YAML or JSON) layered over the mesh defaults.")
PROXY_CONFIG_XDS_AGENT = boolean(
    "PROXY_CONFIG_XDS_AGENT", False, "Receive ProxyConfig (PCDS) over xDS and apply trust bundles."
)
ISTIO_CPU_LIMIT = integer(
    "ISTIO_CPU_LIMIT", 0, "CPU limit of the container, rounded up; Envoy's concurrency when none is configured.")

# --- control plane and CA --------------------------------------------------------------------------
CA_ADDR = string("CA_ADDR", "", "Address of the CA; defaults to the ProxyConfig discoveryAddress.")
CA_PROVIDER = string("CA_PROVIDER", "Citadel", "Name of the CA implementation.", support=PARTIAL,
                     note="only Citadel (istiod's IstioCertificateService); any other is refused at start")
PILOT_CERT_PROVIDER = string(
    "PILOT_CERT_PROVIDER", "istiod",
    "Who signs istiod's certificate: istiod (the mounted root), custom (./etc/certs/root-cert.pem), none.")
XDS_ROOT_CA = string("XDS_ROOT_CA", "", "Root certificate file for istiod's xDS TLS, or SYSTEM.")
CA_ROOT_CA = string("CA_ROOT_CA", "", "Root certificate file for the CA's TLS, or SYSTEM.")
ISTIOD_SAN = string("ISTIOD_SAN", "", "Expected server name of istiod, overriding the address host.")
PROV_CERT = string("PROV_CERT", "", "Directory of a provisioning certificate used as a client cert to the CA.")
XDS_AUTH = boolean("XDS_AUTH", True, "Send the bearer token to istiod.")
XDS_AUTH_PROVIDER = string(
    "XDS_AUTH_PROVIDER", "",
    "Provider of xDS credentials (e.g. gcp): upstream's agent reads it into its options and nothing there uses "
    "it any more; istiod is sent the credential fetcher's token (CREDENTIAL_FETCHER_TYPE), as upstream.")
JWT_POLICY = string("JWT_POLICY", "third-party-jwt",
                    "Which Kubernetes token the pod has; as upstream, first-party-jwt is read as third-party-jwt "
                    "(./var/run/secrets/tokens/istio-token).")
KUBERNETES_SERVICE_HOST = string(
    "KUBERNETES_SERVICE_HOST", "", "Set in every Kubernetes pod: OUTPUT_CERTS files are then 0644, to share them.")
CREDENTIAL_FETCHER_TYPE = string(
    "CREDENTIAL_FETCHER_TYPE", "JWT",
    "Where the bearer token sent to the CA and istiod comes from: JWT (the token file, read per call) or "
    "GoogleComputeEngine (the VM's identity token from the GCE metadata server, for the trust domain as audience, "
    "asked per call and written to the token file); any other value fails the start.")
CREDENTIAL_IDENTITY_PROVIDER = string(
    "CREDENTIAL_IDENTITY_PROVIDER", "GoogleComputeEngine",
    "Identity provider the credential fetcher reports: upstream hands it to the fetcher, and nothing asks it "
    "for it.")
GRPC_KEEPALIVE_INTERVAL = duration("GRPC_KEEPALIVE_INTERVAL", 30.0, "Keepalive ping interval on istiod connections.")
GRPC_KEEPALIVE_TIMEOUT = duration("GRPC_KEEPALIVE_TIMEOUT", 10.0, "Keepalive ping timeout on istiod connections.")
# Upstream's spelling (GPRC), from istiod's gRPC server options, which the agent's XDS server shares.
ISTIO_GPRC_MAXRECVMSGSIZE = integer(
    "ISTIO_GPRC_MAXRECVMSGSIZE", 4 * 1024 * 1024,
    "Largest request the XDS proxy accepts from Envoy, in bytes; a larger one ends that stream.")
ISTIO_GPRC_MAXSTREAMS = integer(
    "ISTIO_GPRC_MAXSTREAMS", 100000, "Most concurrent streams per connection on the XDS proxy's socket.")

# --- workload certificates --------------------------------------------------------------------------
SECRET_TTL = duration("SECRET_TTL", 24 * 3600.0, "Requested lifetime of workload certificates.")
SECRET_GRACE_PERIOD_RATIO = floating(
    "SECRET_GRACE_PERIOD_RATIO", 0.5, "Fraction of a certificate's lifetime left when it is rotated."
)
SECRET_GRACE_PERIOD_RATIO_JITTER = floating(
    "SECRET_GRACE_PERIOD_RATIO_JITTER", 0.01, "Random spread added to the grace ratio, so pods do not rotate together."
)
WORKLOAD_RSA_KEY_SIZE = integer("WORKLOAD_RSA_KEY_SIZE", 2048, "RSA key size of workload keys: 2048 to 8192 bits.")
ECC_SIGNATURE_ALGORITHM = string("ECC_SIGNATURE_ALGORITHM", "", "ECDSA for elliptic-curve workload keys.")
ECC_CURVE = string("ECC_CURVE", "P256", "Curve for ECDSA workload keys: P256 or P384.")
PKCS8_KEY = boolean("PKCS8_KEY", False, "Write workload keys as PKCS#8 rather than PKCS#1 (RSA) / SEC1 (EC).")
OUTPUT_CERTS = string("OUTPUT_CERTS", "", "Directory to which workload certificates are written.")
FILE_MOUNTED_CERTS = boolean("FILE_MOUNTED_CERTS", False, "Use mounted certificates instead of the CA.")
FILE_DEBOUNCE_DURATION = duration(
    "FILE_DEBOUNCE_DURATION", 0.1, "How long a changed certificate file settles before it is read again.")
CERT_SIGNER_DOMAIN = string("CERT_SIGNER_DOMAIN", "", "Domain of the Kubernetes CSR signer: read by istiod, which "
                            "builds the signer name; upstream's agent does nothing with it either.")
ISTIO_META_CERT_SIGNER = string("ISTIO_META_CERT_SIGNER", "", "Signer name sent as CertSigner metadata.")
ISTIO_MULTIROOT_MESH = boolean("ISTIO_MULTIROOT_MESH", False, "Several trust roots at once: read by istiod, which "
                               "sends them over PCDS (merged into ROOTCA here); upstream's agent does not read it.")
WORKLOAD_IDENTITY_SOCKET_FILE = string(
    "WORKLOAD_IDENTITY_SOCKET_FILE", "socket",
    "File name of Envoy's SDS socket in workload-spiffe-uds. When another server (SPIRE) answers there, the agent "
    "asks no CA and serves only file certificates on credential-uds/files-socket; a name other than 'socket' with "
    "nobody answering fails the start."
)

# --- Envoy and lifecycle ------------------------------------------------------------------------------
DISABLE_ENVOY = boolean("DISABLE_ENVOY", False, "Run no Envoy (proxyless gRPC).")
ISTIO_BOOTSTRAP = string("ISTIO_BOOTSTRAP", "", "Path of a custom bootstrap template.")
ISTIO_BOOTSTRAP_OVERRIDE = string("ISTIO_BOOTSTRAP_OVERRIDE", "", "Bootstrap fragment merged over the result.")
ISTIO_DELTA_XDS = boolean("ISTIO_DELTA_XDS", True, "Envoy uses delta xDS.")
ISTIO_DUAL_STACK = boolean("ISTIO_DUAL_STACK", False, "Listen and resolve on both IP families (bootstrap addresses).")
COMPLIANCE_POLICY = string(
    "COMPLIANCE_POLICY", "", "fips-140-2 (or fips-140-3) restricts TLS versions and ciphers.", support=PARTIAL,
    note="the bootstrap's settings, and gRPC's TLS 1.2 ciphers for Envoy and the agent; the agent's own gRPC "
         "cannot be held to TLS 1.2")
HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED = boolean(
    "HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED", True, "Envoy strips the #fragment from request paths.")
ISTIO_ENVOY_ENABLE_CORE_DUMP = boolean("ISTIO_ENVOY_ENABLE_CORE_DUMP", False, "Start Envoy with --enable-core-dump.")
ENVOY_SKIP_DEPRECATED_LOGS = boolean(
    "ENVOY_SKIP_DEPRECATED_LOGS", True, "Start Envoy with --skip-deprecated-logs.")
ENVOY_STATUS_PORT = integer("ENVOY_STATUS_PORT", 15021,
                            "Envoy's health listener port (bootstrap listener and node metadata).")
ENVOY_PROMETHEUS_PORT = integer(
    "ENVOY_PROMETHEUS_PORT", 15090,
    "Envoy's Prometheus listener port (bootstrap listener, node metadata, the merged scrape's source).")
ENVOY_SECURE_METRICS_PORT = integer(
    "ENVOY_SECURE_METRICS_PORT", 0, "mTLS listener for Envoy's stats (0: none); in node metadata too.")
ENVOY_SECURE_MERGED_METRICS_PORT = integer(
    "ENVOY_SECURE_MERGED_METRICS_PORT", 0, "mTLS listener for the merged stats (0: none); in node metadata too.")
ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL = boolean(
    "ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL", False, "PROXY protocol (optional) on Envoy's health listener.")
MINIMUM_DRAIN_DURATION = duration(
    "MINIMUM_DRAIN_DURATION", 5.0, "With EXIT_ON_ZERO_ACTIVE_CONNECTIONS, drain at least this long."
)
EXIT_ON_ZERO_ACTIVE_CONNECTIONS = boolean(
    "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", False, "Stop Envoy as soon as downstream connections reach zero."
)
ISTIO_META_GENERATOR = string("ISTIO_META_GENERATOR", "", "xDS generator istiod uses (grpc for proxyless).")
ISTIO_META_ENABLE_SELF_DISCOVERY = boolean(
    "ISTIO_META_ENABLE_SELF_DISCOVERY", False,
    "Add a local_cluster (EDS, zone-aware least-request) to the bootstrap and name it the cluster manager's "
    "local cluster.")
PEER_METADATA_DISCOVERY = boolean(
    "PEER_METADATA_DISCOVERY", False,
    "Envoy's peer metadata discovery extension (needs delta xDS); unset, it follows ISTIO_META_ENABLE_HBONE.")
ISTIO_AGENT_ENVOY_UID = integer(
    "ISTIO_AGENT_ENVOY_UID", 0,
    "Not upstream. When the agent runs as root, run Envoy as this uid (gid of the same number), e.g. 1337, "
    "so Envoy's own traffic bypasses capture as the istio-proxy user's does; 0 keeps the agent's user.",
    upstream=False,
)
GRPC_XDS_BOOTSTRAP = string(
    "GRPC_XDS_BOOTSTRAP", "./etc/istio/proxy/grpc-bootstrap.json", "Where the gRPC xDS bootstrap is written."
)
# Wasm modules of WasmPlugins: fetched, verified and cached by the agent (wasm/, docs/PILOT-AGENT.md "Wasm").
ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION = boolean(
    "ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION", True,
    "Intercept ECDS, fetch each remote Wasm module and give Envoy a local file instead.")
WASM_INSECURE_REGISTRIES = string(
    "WASM_INSECURE_REGISTRIES", "",
    "Comma-separated hosts (or *) whose Wasm modules are fetched without verifying their TLS certificate.")
WASM_MODULE_EXPIRY = duration("WASM_MODULE_EXPIRY", 24 * 3600.0,
                              "How long a cached Wasm module unused stays on disk.")
WASM_PURGE_INTERVAL = duration("WASM_PURGE_INTERVAL", 3600.0, "How often expired Wasm modules are removed.")
WASM_HTTP_REQUEST_TIMEOUT = duration("WASM_HTTP_REQUEST_TIMEOUT", 15.0, "Timeout of one Wasm module HTTP request.")
WASM_HTTP_REQUEST_MAX_RETRIES = integer("WASM_HTTP_REQUEST_MAX_RETRIES", 5,
                                        "Attempts of a Wasm module HTTP download.")
BLOCKED_CIDRS_IN_WASM_FETCH = string(
    "BLOCKED_CIDRS_IN_WASM_FETCH", "",
    "Comma-separated CIDR ranges Wasm modules are never fetched from, beside the link-local and cloud metadata "
    "addresses that always are.")
ISTIO_WASM_MAX_BINARY_SIZE_BYTES = integer("ISTIO_WASM_MAX_BINARY_SIZE_BYTES", 256 * 1024 * 1024,
                                           "The largest Wasm module (or image layer) fetched, in bytes.")
WASM_CACHE_MAX_BYTES = integer(
    "WASM_CACHE_MAX_BYTES", 1024 * 1024 * 1024,
    "Not upstream. Disk the Wasm module cache may use; the least recently used modules go first beyond it.",
    upstream=False)

# --- cloud platform (config/platform.py; the metadata servers asked at start by agent/cloud_probe.py) ------------
CLOUD_PLATFORM = string(
    "CLOUD_PLATFORM", "",
    "Cloud platform the proxy runs on: aws, azure, gcp or none (nothing asked); unset (or another value), it is "
    "detected at start, within 5 s: GCP from GCP_METADATA or the GCE metadata server, AWS from IMDS, Azure from "
    "the DMI vendor; PLATFORM_METADATA and the node's locality then come from its metadata server.",
    support=PARTIAL,
    note="off Kubernetes on GCE, upstream adds the instance's labels from compute.googleapis.com (an authenticated "
         "Google API call); this agent does not (warned). GCE detection asks the metadata address over HTTP, "
         "not also metadata.google.internal over DNS")
GCE_METADATA_HOST = string(
    "GCE_METADATA_HOST", "",
    "Host (and port) of the GCE metadata server, instead of 169.254.169.254; set, the agent takes it that it "
    "runs on GCE (the variable of the metadata client upstream's agent uses).")
GCP_METADATA = string(
    "GCP_METADATA", "",
    "PROJECT_ID|PROJECT_NUMBER|CLUSTER_NAME|CLUSTER_ZONE: PLATFORM_METADATA gcp_project, gcp_project_number, "
    "gcp_gke_cluster_name, gcp_location and gcp_gke_cluster_url (Stackdriver's project; gcp_project_number and, "
    "with an STS port, gcp_project_id for custom templates). Whenever it yields metadata the platform is GCP; "
    "a value of another number of parts gives none of those keys (warned).")
GCP_QUOTA_PROJECT = string("GCP_QUOTA_PROJECT", "",
                           "PLATFORM_METADATA gcp_quota_project; only with GCP_METADATA set, as upstream.")
GCP_ZONE = string(
    "GCP_ZONE", "",
    "PLATFORM_METADATA gcp_zone and, without a locality label, the node's zone (region: the zone less its last "
    "part); only with GCP_METADATA set, as upstream. Unset, the zone comes from resolv.conf's search list.")

# --- DNS ------------------------------------------------------------------------------------------------
ISTIO_META_DNS_CAPTURE = boolean("ISTIO_META_DNS_CAPTURE", False, "Run the DNS proxy (sidecar).")
ISTIO_META_ENABLE_DNS_SERVER = boolean("ISTIO_META_ENABLE_DNS_SERVER", False, "Run the DNS proxy.")
ISTIO_META_DNS_AUTO_ALLOCATE = boolean("ISTIO_META_DNS_AUTO_ALLOCATE", False, "Ask istiod for auto-allocated VIPs.")
DNS_PROXY_ADDR = string("DNS_PROXY_ADDR", "localhost:15053", "Address of the DNS proxy.")
DNS_FORWARD_PARALLEL = boolean("DNS_FORWARD_PARALLEL", False, "Ask every upstream resolver at once.")
DNS_FORWARD_TIMEOUT = duration("DNS_FORWARD_TIMEOUT", 5.0, "Timeout of a query forwarded to an upstream resolver.")

# --- status server ---------------------------------------------------------------------------------------
ISTIO_KUBE_APP_PROBERS = string("ISTIO_KUBE_APP_PROBERS", "", "Rewritten application probes (JSON).")
ISTIO_PROMETHEUS_ANNOTATIONS = string("ISTIO_PROMETHEUS_ANNOTATIONS", "", "Application scrape settings (JSON).")
PILOT_AGENT_MERGE_ENVOY_STATS = boolean(
    "PILOT_AGENT_MERGE_ENVOY_STATS", True, "Include Envoy's stats in the merged metrics."
)
PROMETHEUS_DISABLE_CREATED_SERIES = boolean(
    "PROMETHEUS_DISABLE_CREATED_SERIES", False,
    "Not upstream. prometheus_client's variable, honoured as it was: the agent's own counters and histograms "
    "without their `_created` series.", upstream=False)
METRICS_LOCALHOST_ACCESS_ONLY = boolean(
    "METRICS_LOCALHOST_ACCESS_ONLY", False, "Serve the merged metrics (and Envoy's stats listener) to localhost only.")
REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION = boolean(
    "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", False,
    "Send rewritten app probes, and the workload health checker's probes without a host, to localhost, not the "
    "pod IP (the proxy's first IP).")
ISTIO_ENABLE_HTTP2_PROBING = boolean(
    "ISTIO_ENABLE_HTTP2_PROBING", True,
    "HTTPS app probes offer HTTP/2 (ALPN h2, http/1.1) and use it when the app selects h2, with Kubernetes' "
    "ping settings; off: HTTP/1.1 only. Plain-HTTP probes are always HTTP/1.1.")
ENABLE_PROBE_KEEPALIVE_CONNECTIONS = boolean(
    "ENABLE_PROBE_KEEPALIVE_CONNECTIONS", False, "Reuse HTTP connections between app probes.")

ISTIO_META_PREFIX = "ISTIO_META_"
ISTIO_METAJSON_PREFIX = "ISTIO_METAJSON_"
XDS_HEADER_PREFIX = "XDS_HEADER_"
CA_HEADER_PREFIX = "CA_HEADER_"

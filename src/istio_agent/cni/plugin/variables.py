"""`istio-cni`'s table: the plugin has no flags, only what it reads from its environment (the shape is
`config/settings.py`'s).

The container runtime execs the plugin with the CNI protocol's variables
(`CNI_COMMAND`, `CNI_CONTAINERID`, ...), which `protocol.py` reads as the
CNI specification names them; the plugin's own are istio-iptables'
environment-only settings (`capture/flags.py`, applied to every pod's rules),
the dry-run recording file, and two tunables of ours. On the per-pod path:
nothing heavier than `config.settings` is imported.
"""

from __future__ import annotations

from istio_agent.capture.flags import ENV_ONLY, ENVOY_USER
from istio_agent.config.settings import Command, EnvVar, Program, integer, text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The CNI protocol (the CNI specification's names), read by `protocol.parse_request`.
CNI_COMMAND = EnvVar("CNI_COMMAND", "", "The operation: ADD, DEL, CHECK, STATUS, GC or VERSION (unset: the "
                     "plugin prints what it is and the versions it speaks).", text, "string")
CNI_CONTAINERID = EnvVar("CNI_CONTAINERID", "", "The container's id (required but for VERSION, STATUS and GC).",
                         text, "string")
CNI_NETNS = EnvVar("CNI_NETNS", "", "The path of the pod's network namespace, where ADD applies the rules.", text,
                   "string")
CNI_IFNAME = EnvVar("CNI_IFNAME", "", "The interface name inside the container (required but for VERSION, STATUS "
                    "and GC).", text, "string")
CNI_ARGS = EnvVar("CNI_ARGS", "", "Extra arguments, `K=V;...`: K8S_POD_NAMESPACE and K8S_POD_NAME name the pod.",
                  text, "string")
CNI_PATH = EnvVar("CNI_PATH", "", "Where the runtime looks for CNI plugins (unused: istio-cni calls none).", text,
                  "string")
PROTOCOL: tuple[EnvVar[Any], ...] = (CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS, CNI_PATH)

def go_duration(value: str) -> float:
    """Go's time.ParseDuration, as istio-iptables reads its timeout (the capture package's, without `re`)."""
    from istio_agent.capture.validation import parse_duration

    return parse_duration(value)


DRY_RUN_FILE_PATH = EnvVar("DRY_RUN_FILE_PATH", "", "Record the pod's rules to this file instead of applying them "
                           "(upstream's hook for tests).", text, "string")

# Not upstream: tunables, so tests need not wait 30 s for "API down".
POD_RETRIEVAL_MAX_RETRIES = EnvVar(
    "ISTIO_CNI_POD_RETRIEVAL_MAX_RETRIES", 30,
    "How many times ADD asks the API server for the pod before it fails with 'try again later' "
    "(upstream's fixed 30): a whole number of at least 1.", integer, "int", upstream=False)
POD_RETRIEVAL_INTERVAL = EnvVar(
    "ISTIO_CNI_POD_RETRIEVAL_INTERVAL", 1.0,
    "The pause between two of those attempts (upstream's fixed 1s), a Go duration.",
    go_duration, "duration", upstream=False)

ISTIO_CNI = Program(
    "istio-cni",
    "The CNI plugin the container runtime execs for every pod (chained after the pod network's plugins): ADD "
    "programs the pod's traffic capture (istio-iptables' rules in the pod's network namespace) unless the pod "
    "needs none; DEL, CHECK, STATUS and GC have nothing to do. It takes no flags: the CNI protocol is its "
    "environment and its standard input (the network configuration install-cni wrote). Exit codes: 0, or 1 "
    "with a CNI error object on standard output.",
    (Command("", "Answer one CNI call: the operation and the container in the CNI protocol's variables, the "
                 "network configuration on standard input, the result (or a CNI error) on standard output.",
             variables=PROTOCOL),),
    "src/istio_agent/cni/plugin/variables.py",
    variables=(DRY_RUN_FILE_PATH, ENVOY_USER, *(var for _, var in ENV_ONLY), POD_RETRIEVAL_MAX_RETRIES,
               POD_RETRIEVAL_INTERVAL),
)

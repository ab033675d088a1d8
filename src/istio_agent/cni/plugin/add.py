"""ADD for sidecar mode: decide from CNI_ARGS and the pod whether to capture, then program the pod's netns.

Upstream's order (`cni/pkg/plugin/plugin.go`): our own agent pod and pods
without Kubernetes args or in an excluded namespace are let through at once;
otherwise the pod is fetched, retried up to 30 times a second apart while
the API cannot give it (a 404 included: the pod may not be visible yet), and
when it still cannot be had ADD fails with "try again later" (11) naming the
API error: a pod that may need capture never starts without it
(istio/istio#17583). Then upstream's skip rules, the capture settings from
the pod (`podinfo`), and the project's istio-iptables run inside CNI_NETNS
(`capture.program.execute`), recorded instead with DRY_RUN_FILE_PATH (the
host facts still read inside CNI_NETNS when it is one, as upstream's dry run
reads them).

The kubeconfig is read on each attempt rather than once, so a kubeconfig
install-cni writes (or rotates) while we wait is picked up. `cmd_add` is the
one implementation of these rules: the in-process plugin and install-cni's
fast path (which passes its kept-alive `get`) both call it.
"""

from __future__ import annotations

import os
import time

from istio_agent.cni.plugin import variables
from istio_agent.cni.plugin.protocol import (
    ERR_INTERNAL,
    ERR_INVALID_ENVIRONMENT,
    ERR_INVALID_NETNS,
    ERR_TRY_AGAIN_LATER,
    CniError,
    parse_cni_args,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from istio_agent.capture.config import CaptureConfig
    from istio_agent.cni.plugin.log import PluginLog
    from istio_agent.cni.plugin.netconf import PluginConfig
    from istio_agent.cni.plugin.protocol import Request

    GetPod = Callable[[str, str, str], dict[str, object]]

KUBECONFIG_NAME = "istio-cni-kubeconfig"
CNI_POD_PREFIX = "istio-cni-node-"
POD_RETRIEVAL_MAX_RETRIES: int = variables.POD_RETRIEVAL_MAX_RETRIES.default  # upstream's podRetrievalMaxRetries
POD_RETRIEVAL_INTERVAL: float = variables.POD_RETRIEVAL_INTERVAL.default  # upstream's podRetrievalInterval, seconds
# Not upstream: tunables, so tests need not wait 30 s for "API down" (declared in `variables.py`).
RETRIES_ENV = variables.POD_RETRIEVAL_MAX_RETRIES.name
INTERVAL_ENV = variables.POD_RETRIEVAL_INTERVAL.name


def retry_settings(env: Mapping[str, str]) -> tuple[int, float]:
    """Attempts and interval: upstream's 30 x 1 s unless the (not upstream) variables say otherwise."""
    from istio_agent.capture.validation import parse_duration

    retries, interval = POD_RETRIEVAL_MAX_RETRIES, POD_RETRIEVAL_INTERVAL
    text = env.get(RETRIES_ENV, "")
    if text:
        if not (text.isascii() and text.isdigit()) or int(text) < 1:  # isdigit alone takes '²'
            raise CniError(ERR_INVALID_ENVIRONMENT, f"{RETRIES_ENV}={text!r}: expected a whole number of at least 1")
        retries = int(text)
    text = env.get(INTERVAL_ENV, "")
    if text:
        try:
            interval = parse_duration(text)
        except ValueError:
            raise CniError(ERR_INVALID_ENVIRONMENT,
                           f"{INTERVAL_ENV}={text!r}: expected a duration such as 1s or 50ms") from None
    return retries, interval


def fetch_pod_from_kubeconfig(kubeconfig: str, namespace: str, name: str) -> dict[str, object]:
    """One attempt: read the kubeconfig, GET the pod (ApiError / KubeconfigError / OSError on failure)."""
    from istio_agent.kube.client import get_pod, load_kubeconfig

    return get_pod(load_kubeconfig(kubeconfig), namespace, name)


def describe_failure(err: Exception, kubeconfig: str) -> str:
    if isinstance(err, FileNotFoundError):
        return f"kubeconfig {kubeconfig} does not exist (install-cni has not written it yet)"
    if isinstance(err, OSError) and not isinstance(err, ConnectionError):
        return f"kubeconfig {kubeconfig}: {err.strerror or err}"
    return str(err)


def fetch_pod(namespace: str, name: str, kubeconfig: str, retries: int, interval: float, log: PluginLog,
              get: GetPod, sleep: Callable[[float], None]) -> dict[str, object]:
    """The pod, retried as upstream does; CniError(11) naming the last API error when it never comes."""
    last = ""
    for attempt in range(1, retries + 1):
        try:
            return get(kubeconfig, namespace, name)
        except (OSError, ValueError, RuntimeError) as err:
            last = describe_failure(err, kubeconfig)
        log.debug(f"Failed to get pod info (attempt {attempt}/{retries}): {last}")
        if attempt == 1:
            log.warn(f"in a degraded state: cannot get pod {namespace}/{name} from the API server ({last}); "
                     f"retrying up to {retries} times")
        if attempt < retries:
            sleep(interval)
    log.error(f"Failed to get pod info: {last}")
    raise CniError(ERR_TRY_AGAIN_LATER,
                   f"failed to get pod {namespace}/{name} from the Kubernetes API after {retries} attempts: {last}")


def same_netns_as_plugin(netns: str) -> bool:
    """skel's check: CNI_NETNS must not be the plugin's own namespace (False when it cannot be opened).

    The calling thread's namespace (`/proc/thread-self`): in install-cni's fast
    path each call runs on a thread of its own, which is still in the node's namespace here.
    """
    try:
        target = os.stat(netns)
        own = os.stat("/proc/thread-self/ns/net")
    except OSError:
        return False
    return (target.st_dev, target.st_ino) == (own.st_dev, own.st_ino)


def cmd_add(req: Request, conf: PluginConfig, env: Mapping[str, str], log: PluginLog,
            get: GetPod = fetch_pod_from_kubeconfig, sleep: Callable[[float], None] = time.sleep) -> None:
    """Capture the pod's traffic if upstream would; CniError when it must not start."""
    args = parse_cni_args(req.args)
    namespace, name = args.get("K8S_POD_NAMESPACE", ""), args.get("K8S_POD_NAME", "")
    if name.startswith(CNI_POD_PREFIX) and namespace == conf.pod_namespace:
        log.info(f"{name} looks like our own agent pod, skipping")
        return
    if not namespace or not name:
        log.debug("Not a kubernetes pod")
        return
    log.labels["pod"] = f"{namespace}/{name}"
    if namespace in conf.exclude_namespaces:
        log.info(f"pod namespace {namespace} excluded")
        return
    if conf.ambient_enabled:
        log.info("ambient_enabled is set, but ambient mode is not supported by this istio-cni: "
                 "pods are handled as upstream handles pods not selected for ambient (sidecar rules)")
    dry_run = bool(env.get(variables.DRY_RUN_FILE_PATH.name, ""))
    if not dry_run and same_netns_as_plugin(req.netns):
        raise CniError(ERR_INVALID_NETNS, f"CNI_NETNS {req.netns}: plugin's netns and netns from CNI_NETNS should "
                       "not be the same")
    retries, interval = retry_settings(env)
    kubeconfig = os.path.join(conf.cni_agent_run_dir, KUBECONFIG_NAME)
    pod = fetch_pod(namespace, name, kubeconfig, retries, interval, log, get, sleep)

    from istio_agent.cni.plugin.podinfo import PodError, capture_config, extract_pod_info, skip_reason

    try:
        info = extract_pod_info(pod)
    except PodError as err:
        raise CniError(ERR_INTERNAL, f"pod {namespace}/{name}: {err}") from None
    if conf.ambient_enabled:
        warn_if_ambient(pod, namespace, name, conf, kubeconfig, log)
    reason = skip_reason(info)
    if reason is not None:
        log.info(reason)
        return
    try:
        cfg = capture_config(info, req.netns, dry_run=dry_run, native_nftables=conf.native_nftables, env=env,
                             warn=log.warn)
    except PodError as err:
        log.error(f"redirect failed due to bad params: {err}")
        raise CniError(ERR_INTERNAL, f"pod {namespace}/{name}: {err}") from None
    if not dry_run and not os.path.exists(req.netns):
        raise CniError(ERR_INVALID_ENVIRONMENT, f"CNI_NETNS {req.netns}: failed to open netns: no such file")
    program(cfg, env, log, name)


def warn_if_ambient(pod: dict[str, object], namespace: str, name: str, conf: PluginConfig, kubeconfig: str,
                    log: PluginLog) -> None:
    """Say so when upstream would have enrolled this pod in ambient mode, which is not supported here.

    Upstream then hands the pod to the ambient node agent instead of the sidecar
    logic; here the sidecar logic runs as for any pod not selected (and, the
    pod having no sidecar, leaves it without capture). One namespace GET, no retries.
    """
    from istio_agent.cni.plugin.ambient import SelectorError, selected_for_ambient

    if not conf.enablement_selectors:
        return
    try:
        from istio_agent.kube.client import get_namespace, load_kubeconfig

        ns_obj = get_namespace(load_kubeconfig(kubeconfig), namespace)
        metadata = ns_obj.get("metadata")
        labels = metadata.get("labels") if isinstance(metadata, dict) else None
        ns_labels = {k: v for k, v in labels.items() if isinstance(v, str)} if isinstance(labels, dict) else {}
        selected = selected_for_ambient(pod, ns_labels, conf.enablement_selectors)
    except SelectorError as err:
        log.warn(f"cannot evaluate enablement_selectors: {err}")
        return
    except (OSError, ValueError, RuntimeError) as err:
        log.warn(f"cannot tell whether pod {namespace}/{name} is selected for ambient: namespace {namespace}: {err}")
        return
    if selected:
        log.warn(f"pod {namespace}/{name} is selected for ambient mode by enablement_selectors, but ambient mode is "
                 "not supported by this istio-cni: it is handled as a pod not selected for ambient and gets no "
                 "capture from the ambient node agent")


def enter_for_dry_run(netns: str, log: PluginLog) -> None:
    """Upstream reads the host facts (the pod's addresses: the IPv6 mode) inside CNI_NETNS in a dry run too
    (`execute` enters it itself only to apply). A path that is no network namespace (a test's stand-in, as
    upstream's own dry-run test substitutes one) keeps this thread's, as before."""
    from istio_agent.capture.netns import enter_netns

    try:
        enter_netns(netns)
    except OSError as err:
        log.debug(f"dry run: host facts from the plugin's own netns ({netns}: {err})")


def program(cfg: CaptureConfig, env: Mapping[str, str], log: PluginLog, pod_name: str) -> None:
    """istio-iptables (or nftables) inside the pod's netns; any failure is an ADD error."""
    from istio_agent.capture.program import execute
    from istio_agent.capture.validation import ConfigError

    kind = "nftables" if cfg.native_nftables else "iptables"
    log.info(f"============= Start {kind} configuration for {pod_name} =============")
    try:
        if cfg.dry_run and cfg.network_namespace:
            enter_for_dry_run(cfg.network_namespace, log)
        execute(cfg, env, log=log.info)
    except ConfigError as err:  # host facts (e.g. resolv.conf) checked again after they are read
        raise CniError(ERR_INTERNAL, f"{kind} configuration rejected: {err}; nothing was applied") from None
    except (OSError, RuntimeError, ValueError) as err:
        raise CniError(ERR_INTERNAL, f"failed to program {kind} in {cfg.network_namespace}: {err}") from None
    finally:
        log.info(f"============= End {kind} configuration for {pod_name} =============")

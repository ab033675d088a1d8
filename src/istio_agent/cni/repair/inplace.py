"""In-place repair (`--repair-repair-pods`, upstream's REPAIR_REPAIR_PODS): a running pod that started without
capture gets it now, in its own network namespace, exactly as the plugin would have given it at ADD.

The pod is read from the API (the controller's watch), so its capture settings are the plugin's
(`cni.plugin.podinfo`: its skip rules, its annotations, istio-proxy's environment). Its namespace is found
through the host's procfs by the pod's IP (`podnetns.py`), then `capture.program.execute` enters it and
applies the rules, iptables or nftables (`--native-nftables`), as the plugin's ADD does. The pod's next
`istio-validation` run then passes: the kubelet restarts it on its crash-loop back-off.

Each repair runs on a thread of its own that ends with it: entering a namespace (setns) moves only the
calling thread, and a pooled thread that had entered a pod's namespace would carry it into unrelated work.

A pod the plugin would have left alone is left alone here too (not upstream: its repair applies the pod's
redirect whatever the plugin would have decided): a hostNetwork pod, a pod in one of `--exclude-namespaces`,
and the plugin's skip rules (istio-init present, no istio-proxy, DISABLE_ENVOY, injection disabled).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from istio_agent.cni.repair.podnetns import NetnsNotFound, PodNetns, find_pod_netns, own_netns

if TYPE_CHECKING:
    from istio_agent.capture.config import CaptureConfig

log = logging.getLogger("istio_agent.cni.repair")

T = TypeVar("T")


class InPlaceError(RuntimeError):
    """The pod could not be repaired in place (its namespace not found, or the rules not applied)."""


@dataclass(frozen=True)
class InPlaceOutcome:
    """A repair's result: the namespace programmed, or why the pod was left alone."""

    netns: PodNetns | None = None
    skipped: str = ""


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def left_alone(pod: Mapping[str, Any], exclude_namespaces: Collection[str]) -> str:
    """Why the plugin would not have captured this pod ('' when it would have): pure."""
    from istio_agent.cni.plugin.podinfo import PodError, extract_pod_info, skip_reason

    meta, spec = _mapping(pod.get("metadata")), _mapping(pod.get("spec"))
    if spec.get("hostNetwork") is True:
        return "a hostNetwork pod is in the node's network namespace"
    namespace = str(meta.get("namespace", ""))
    if namespace in exclude_namespaces:
        return f"pod namespace {namespace} excluded"
    try:
        return skip_reason(extract_pod_info(pod)) or ""
    except PodError:
        return ""  # reported by `capture_settings`, which fails on it


def run_on_own_thread(work: Callable[[], T], name: str) -> asyncio.Future[T]:
    """`work()` on a new thread that ends with it; its result (or exception) as a future on the running loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def target() -> None:
        try:
            result, error = work(), None
        except BaseException as exc:  # handed to the awaiting side, which decides
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed meanwhile (install-cni stopping): nobody waits for it
            pass

    threading.Thread(target=target, name=name, daemon=True).start()
    return future


class InPlaceRepair:
    """Programs broken pods' capture in their namespaces, found under `proc_dir` (the host's procfs)."""

    def __init__(self, proc_dir: str, native_nftables: bool = False,
                 exclude_namespaces: Collection[str] = ()) -> None:
        self.proc_dir = proc_dir.rstrip("/") or "/"
        self.native_nftables = native_nftables
        self.exclude_namespaces = frozenset(exclude_namespaces)

    def check(self) -> str:
        """'' when the host's processes can be listed; else what is wrong, for a warning at start."""
        try:
            with open(f"{self.proc_dir}/1/stat", "rb"):
                return ""
        except OSError as exc:
            return (f"in-place repair looks for pods' network namespaces in {self.proc_dir}, which cannot be read "
                    f"({exc.strerror or exc}): mount the host's /proc there (upstream's chart mounts it at "
                    "/host/proc when repair.repairPods is set) or give --repair-host-proc-dir")

    async def repair(self, pod: Mapping[str, Any]) -> InPlaceOutcome:
        """Capture `pod` in its namespace (InPlaceError when it cannot be done: the caller retries)."""
        reason = left_alone(pod, self.exclude_namespaces)
        if reason:
            return InPlaceOutcome(skipped=reason)
        meta, status = _mapping(pod.get("metadata")), _mapping(pod.get("status"))
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        pod_ip = str(status.get("podIP") or "")
        if not pod_ip:
            raise InPlaceError(f"pod {name} has no IP in its status yet")
        settings = self.capture_settings(pod, name)
        netns = await run_on_own_thread(lambda: self._program(settings, pod_ip, name), "cni-repair-netns")
        return InPlaceOutcome(netns=netns)

    def capture_settings(self, pod: Mapping[str, Any], name: str) -> CaptureConfig:
        """The pod's capture configuration, as the plugin derives it (InPlaceError naming a bad annotation)."""
        from istio_agent.cni.plugin.podinfo import PodError, capture_config, extract_pod_info

        def warn(message: str) -> None:
            log.warning("pod %s: %s", name, message)

        try:
            return capture_config(extract_pod_info(pod), "", dry_run=False, native_nftables=self.native_nftables,
                                  env={}, warn=warn)
        except PodError as exc:
            raise InPlaceError(f"pod {name}: redirect failed due to bad params: {exc}") from None

    def _program(self, settings: CaptureConfig, pod_ip: str, name: str) -> PodNetns:
        """On the repair's own thread: find the namespace, enter it, apply the rules."""
        from istio_agent.capture.program import execute
        from istio_agent.capture.validation import ConfigError

        try:
            found = find_pod_netns(self.proc_dir, pod_ip, exclude=own_netns())
        except (NetnsNotFound, ValueError) as exc:
            raise InPlaceError(f"get netns: {exc}") from None
        kind = "nftables" if self.native_nftables else "iptables"
        log.info("pod %s: programming %s in %s (pid %d, one of %d processes in the namespace)", name, kind,
                 found.path, found.pid, found.processes)
        try:
            execute(settings.replace(network_namespace=found.path), {},
                    log=lambda line: log.info("pod %s: %s", name, line))
        except ConfigError as exc:
            raise InPlaceError(f"{kind} configuration rejected: {exc}; nothing was applied") from None
        except (OSError, RuntimeError, ValueError) as exc:
            raise InPlaceError(f"failed to program {kind} in {found.path}: {exc}") from None
        return found

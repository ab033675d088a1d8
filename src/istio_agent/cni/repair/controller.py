"""The repair controller's I/O edge: list and watch the selected pods, act on the broken ones.

`run_repair` is what install-cni runs beside its installer (`--repair-enabled`). It lists the pods its selectors
name (this node's, by `spec.nodeName`, when a node name is set), watches from the list's resourceVersion with
bookmarks, resumes from the last version seen after a watch ends or breaks, lists again when the API answers 410
(Expired) or was unreachable (it may have restarted), and backs off while the API is unreachable or refuses.
Each pod `rules.diagnose` finds broken is acted on once per resourceVersion (`ledger.Ledger`): labelled through
`pods/{name}/status` or deleted with upstream's preconditions; a failure is logged with the API's message and
retried with backoff.

In-place repair (`repair_pods`, upstream's REPAIR_REPAIR_PODS, which wins over deletion and labelling) programs
the pod's capture in its network namespace, found through the host's procfs by the pod's IP (`inplace.py`); it
needs no API call beyond the watch. As upstream, each pod (uid) is repaired once: the pod stays broken in the
API's eyes until the kubelet restarts its validation, and the rules are in place meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Collection, Mapping
from typing import Any

from istio_agent.cni.repair.inplace import InPlaceError, InPlaceRepair
from istio_agent.cni.repair.ledger import Backoff, Ledger
from istio_agent.cni.repair.options import RepairOptions
from istio_agent.cni.repair.rules import (
    LABEL_PATCH_CONTENT_TYPE,
    REASON_DELETE,
    REASON_LABEL,
    RESULT_FAIL,
    RESULT_SKIP,
    RESULT_SUCCESS,
    Action,
    check_options,
    chosen_action,
    delete_options,
    diagnose,
    event,
    field_selector,
    has_label,
    label_patch,
    label_selector,
    pod_key,
    resource_version,
)
from istio_agent.kube.access import KubeAccess
from istio_agent.kube.pod_api import KubeApiError, PodApi
from istio_agent.metrics import CollectorRegistry, Counter

log = logging.getLogger("istio_agent.cni.repair")

WATCH_TIMEOUT = (300, 600)  # seconds a watch request lasts on the server, drawn as client-go's reflector does


class RepairMetrics:
    """Upstream's `istio_cni_repair_pods_repaired_total{type, result}` on the given registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.repaired = Counter(
            "istio_cni_repair_pods_repaired", "Total number of pods repaired by repair controller",
            ["type", "result"], registry=registry)

    def count(self, action: Action, result: str) -> None:
        self.repaired.labels(type=action, result=result).inc()


class RepairController:
    """One list+watch of the selected pods, a cache of their latest versions and one worker acting on them."""

    def __init__(self, options: RepairOptions, action: Action | None, api: PodApi, metrics: RepairMetrics,
                 backoff: Backoff | None = None, in_place: InPlaceRepair | None = None) -> None:
        self.options, self.action, self.api, self.metrics = options, action, api, metrics
        self.backoff = backoff or Backoff()
        self.ledger = Ledger(self.backoff)
        self.in_place = in_place or InPlaceRepair(options.host_proc_dir)
        self.pods: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.repaired: dict[tuple[str, str], str] = {}  # in-place repair: the uid repaired (or left alone) per pod
        self.resource_version = ""
        self.synced = asyncio.Event()  # set once the first list is in
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._retries: dict[tuple[str, str], asyncio.TimerHandle] = {}

    async def run(self) -> None:
        """Until cancelled."""
        worker = asyncio.create_task(self._work(), name="cni-repair-worker")
        try:
            await self._list_and_watch()
        finally:
            worker.cancel()
            for handle in self._retries.values():
                handle.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    # ---- the list+watch loop -----------------------------------------------------------------------------------

    async def _list_and_watch(self) -> None:
        failures = 0
        while True:
            try:
                if not self.resource_version:
                    listing = await self.api.list()
                    self._replace(listing.items)
                    self.resource_version = listing.resource_version
                    failures = 0
                    if not self.synced.is_set():
                        log.info("repair controller watching %d pods (field selector %r, label selector %r)",
                                 len(listing.items), field_selector(self.options), label_selector(self.options))
                    self.synced.set()
                async for kind, obj in self.api.watch(self.resource_version, random.randint(*WATCH_TIMEOUT)):
                    failures = 0
                    self.resource_version = resource_version(obj) or self.resource_version
                    self._event(kind, obj)
            except KubeApiError as exc:
                if exc.expired:
                    log.info("pod watch at resourceVersion %s expired (%s): listing again", self.resource_version,
                             exc.message)
                    self.resource_version = ""
                    continue
                failures += 1
                delay = self.backoff.delay(failures)
                log.warning("pod %s failed: %s; retrying in %.1fs", "watch" if self.resource_version else "list",
                            exc, delay)
                if exc.unreachable:
                    # The API server is down: once it is back, list again rather than trust a resourceVersion
                    # from before (a restarted server may have lost its watch window, or renumbered).
                    self.resource_version = ""
                await asyncio.sleep(delay)

    def _replace(self, items: list[Mapping[str, Any]]) -> None:
        """A fresh list: pods missing from it are gone; the others are judged as if just seen."""
        fresh = {(pod_key(p).namespace, pod_key(p).name): p for p in items}
        for key in self.pods.keys() - fresh.keys():
            self.ledger.forget(key)
            self.repaired.pop(key, None)
        self.pods = fresh
        for pod in items:
            self._consider(pod)

    def _event(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "BOOKMARK":
            return
        key = pod_key(obj)
        if kind == "DELETED":
            self.pods.pop((key.namespace, key.name), None)
            self.ledger.forget((key.namespace, key.name))
            self.repaired.pop((key.namespace, key.name), None)
        elif kind in ("ADDED", "MODIFIED"):
            self.pods[(key.namespace, key.name)] = obj
            self._consider(obj)

    def _consider(self, pod: Mapping[str, Any]) -> None:
        key = pod_key(pod)
        verdict = diagnose(pod, self.options)
        if not verdict.broken:
            self.ledger.settled((key.namespace, key.name))
        elif self.ledger.wants((key.namespace, key.name), key.uid, resource_version(pod)):
            log.info("pod %s is broken: %s", key, verdict.reason)
            self._queue.put_nowait((key.namespace, key.name))

    # ---- acting --------------------------------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            slot = await self._queue.get()
            pod = self.pods.get(slot)
            if pod is None:
                continue
            key = pod_key(pod)
            if not diagnose(pod, self.options).broken:
                self.ledger.settled(slot)
                continue
            version = resource_version(pod)
            if not self.ledger.due(slot, key.uid, version):
                continue
            try:
                await self._act(pod)
            except (KubeApiError, InPlaceError) as exc:
                delay = self.ledger.failed(slot, key.uid, version)
                if delay is None:
                    log.error("could not %s broken pod %s: %s; giving up until it changes", self.action, key, exc)
                else:
                    log.error("could not %s broken pod %s: %s; retrying in %.1fs", self.action, key, exc, delay)
                    self._retries[slot] = asyncio.get_running_loop().call_later(delay, self._retry, slot)
            else:
                self.ledger.done(slot, key.uid, version)

    def _retry(self, slot: tuple[str, str]) -> None:
        self._retries.pop(slot, None)
        self._queue.put_nowait(slot)

    async def _act(self, pod: Mapping[str, Any]) -> None:
        key = pod_key(pod)
        if self.action is None:
            log.warning("broken pod %s left as it is: none of --repair-repair-pods, --repair-delete-pods and "
                        "--repair-label-pods is set", key)
        elif self.action == "label":
            if has_label(pod, self.options.label_key):
                self.metrics.count("label", RESULT_SKIP)
                log.info("broken pod %s already has label %s", key, self.options.label_key)
                return
            await self._counted(pod, "label", self.api.patch_status(
                key.namespace, key.name, label_patch(self.options), LABEL_PATCH_CONTENT_TYPE))
            log.info("labelled broken pod %s with %s=%s", key, self.options.label_key, self.options.label_value)
        elif self.action == "delete":
            await self._counted(pod, "delete", self.api.delete(key.namespace, key.name, delete_options(pod)))
            log.info("deleted broken pod %s", key)
        elif self.action == "repair":
            await self._repair_in_place(pod)

    async def _repair_in_place(self, pod: Mapping[str, Any]) -> None:
        """Upstream's repairPod: once per pod uid; counted as type="repair"; no event (upstream writes none)."""
        key = pod_key(pod)
        slot = (key.namespace, key.name)
        if self.repaired.get(slot) == key.uid:
            log.debug("broken pod %s already repaired in place (uid %s)", key, key.uid)
            return
        log.info("repairing broken pod %s in place", key)
        try:
            outcome = await self.in_place.repair(pod)
        except InPlaceError:
            self.metrics.count("repair", RESULT_FAIL)
            raise
        self.repaired[slot] = key.uid
        if outcome.skipped:
            self.metrics.count("repair", RESULT_SKIP)
            log.info("broken pod %s not repaired in place: %s", key, outcome.skipped)
            return
        self.metrics.count("repair", RESULT_SUCCESS)
        assert outcome.netns is not None
        log.info("pod %s repaired in place (network namespace %s)", key, outcome.netns.path)

    async def _counted(self, pod: Mapping[str, Any], action: Action, call: Any) -> None:
        """Make the call, count it, and tell the pod's events, as upstream's recorder does."""
        reason, done = (REASON_DELETE, "deleted") if action == "delete" else (REASON_LABEL, "labelled")
        try:
            await call
        except KubeApiError as exc:
            self.metrics.count(action, RESULT_FAIL)
            await self._record(pod, reason, f"the istio-validation init container failed; could not be {done}: {exc}")
            raise
        self.metrics.count(action, RESULT_SUCCESS)
        await self._record(pod, reason, f"the istio-validation init container failed; pod {done}")

    async def _record(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        """Best effort: an event that cannot be written is logged, never retried."""
        try:
            await self.api.create_event(pod_key(pod).namespace, event(pod, reason, message, time.time()))
        except KubeApiError as exc:
            log.debug("event about pod %s not written: %s", pod_key(pod), exc)


async def run_repair(options: RepairOptions, access: KubeAccess, registry: CollectorRegistry, *,
                     native_nftables: bool = False, exclude_namespaces: Collection[str] = ()) -> None:
    """Run until cancelled: watch `options`' pods through the API at `access`, count on `registry`.

    In-place repair programs iptables (nftables with `native_nftables`) as the plugin does, and leaves pods in
    `exclude_namespaces` alone, as the plugin does.

    Raises `rules.RepairOptionsError` (naming the flag) at once for settings the API would refuse, and
    `kube.KubeApiError` when the CA file cannot be read.
    """
    if not options.enabled:
        log.info("CNI repair controller is disabled")
        return
    check_options(options)
    action = chosen_action(options)
    in_place = InPlaceRepair(options.host_proc_dir, native_nftables, exclude_namespaces)
    if action == "repair" and (problem := in_place.check()):
        log.warning("%s", problem)
    metrics = RepairMetrics(registry)
    api = PodApi(access, label_selector=label_selector(options), field_selector=field_selector(options))
    try:
        await RepairController(options, action, api, metrics, in_place=in_place).run()
    finally:
        await api.close()

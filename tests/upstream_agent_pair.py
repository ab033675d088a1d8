"""Our pilot-agent and upstream's Go pilot-agent side by side on one local node: the long-running pair the
agent-level differential tests (the DNS proxy, the status port) send their generated cases to.

Both are sidecars (real Envoy, CNI capture) in their own pod network namespace on the same node, served by the
same istiod-local (so the same NameTable), with the same environment and arguments but for the pod's name and
address. Each pod's /etc/resolv.conf is the same generated text: `ip netns exec`, which starts each agent,
mounts /etc/netns/<pod namespace>/resolv.conf over it, and both agents read /etc/resolv.conf.

What runs "in a pod" for a test (an app, a DNS server, a client) runs in this test process, on threads that
entered the pod's network namespace (`NetnsWorkers`): a socket belongs to the namespace of the thread that made
it, so a server whose listening socket was made there serves the pod from any thread.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from launchers import RegistryFile, local_node
from needs import need_root, need_tool, need_upstream_commands

from istiod_local.node.local_node import LocalNode, Pod
from istiod_local.node.plan import PodSpec, registry_workloads
from istiod_local.node.upstream import OURS, UPSTREAM

T = TypeVar("T")
SIDES = ("upstream", "ours")  # the order every pair of answers is given in
POD_NAMES = {"upstream": "go-pod-1", "ours": "py-pod-1"}


class NetnsWorkers:
    """A few threads that entered one network namespace, running what is submitted to them (their sockets, and
    so their connections and listeners, are the namespace's)."""

    def __init__(self, path: str, workers: int = 2) -> None:
        from istio_agent.capture.netns import enter_netns

        self.path = path
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix=f"netns-{Path(path).name}",
                                       initializer=enter_netns, initargs=(path,))

    def submit(self, function: Callable[[], T]) -> Future[T]:
        return self.pool.submit(function)

    def run(self, function: Callable[[], T]) -> T:
        return self.submit(function).result()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class Side:
    """One agent's pod: the node's view of it and workers inside its network namespace."""

    name: str  # "upstream" or "ours"
    pod: Pod
    inside: NetnsWorkers

    @property
    def ip(self) -> str:
        return self.pod.ip

    @property
    def netns_path(self) -> str:
        return self.pod.plan.netns_path()


@dataclass
class AgentPair:
    node: LocalNode
    sides: dict[str, Side]
    outside: NetnsWorkers  # threads in the node's namespace: a client from outside the pods (a kubelet's place)

    def both(self, work: Callable[[Side], T]) -> tuple[T, T]:
        """`work(side)` for upstream's and our side at once (each on its own thread); (upstream's, ours)."""
        with ThreadPoolExecutor(2, thread_name_prefix="pair") as pool:
            theirs, ours = (pool.submit(work, self.sides[name]) for name in SIDES)
            return theirs.result(), ours.result()

    def logs(self, side: str, lines: int = 40) -> str:
        path = self.node.logs / f"{POD_NAMES[side]}-agent.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"({exc})"


def _netns_etc(pod_netns: str) -> Path:
    return Path("/etc/netns") / pod_netns


@contextlib.contextmanager
def agent_pair(prefix: str, *, services: Sequence[Mapping[str, Any]] = (),
               service_entries: Sequence[Mapping[str, Any]] = (), agent_env: Mapping[str, str] | None = None,
               resolv_conf: str = "", labels: Mapping[str, str] | None = None,
               annotations: Mapping[str, str] | None = None) -> Iterator[AgentPair]:
    """Both agents on a fresh local node, ready (Envoy's :15021 answers 200), as sidecars in namespace
    `default` with service account `pair`, `agent_env` over the injector's environment, and `resolv_conf` as
    each pod's /etc/resolv.conf. What the agents reach in their pods (an app, a DNS server) is started by the
    test afterwards (`Side.inside`): neither agent contacts them before a case asks."""
    need_root()
    for tool in ("ip", "setpriv", "unshare", "mount", "iptables"):
        need_tool(tool)
    need_upstream_commands("pilot-agent")
    with contextlib.ExitStack() as stack, local_node(prefix, ready_timeout=90) as node:
        specs = [PodSpec(POD_NAMES[side], service_account="pair", labels={"app": "pair", **(labels or {})},
                         annotations=dict(annotations or {}), agent_env=dict(agent_env or {}),
                         agent_implementation=UPSTREAM if side == "upstream" else OURS)
                 for side in SIDES]
        plans = node.plan_pods(specs)
        for plan in plans:
            etc = _netns_etc(plan.netns)
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "resolv.conf").write_text(resolv_conf)
            stack.callback(_remove_etc, etc)
        RegistryFile(node.registry).write({
            "services": [dict(s) for s in services], "workloads": registry_workloads(plans),
            "serviceEntries": [dict(e) for e in service_entries], "peerAuthentication": {"default": "PERMISSIVE"}})
        node.start_istiod()
        pods = {pod.name: pod for pod in node.add_pods(plans)}
        node.wait_ready(pods.values())
        sides = {}
        for side in SIDES:
            pod = pods[POD_NAMES[side]]
            workers = NetnsWorkers(pod.plan.netns_path(), workers=4)
            stack.callback(workers.close)
            sides[side] = Side(side, pod, workers)
        outside = NetnsWorkers(node.plan.netns_path(), workers=4)
        stack.callback(outside.close)
        yield AgentPair(node, sides, outside)


def _remove_etc(etc: Path) -> None:
    for child in etc.glob("*"):
        with contextlib.suppress(OSError):
            child.unlink()
    with contextlib.suppress(OSError):
        etc.rmdir()


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True

"""Waiting for many pods at once without a process per pod: the kubelet's readiness probes, from the node.

`LocalNode.wait_ready` used to run `pilot-agent wait` inside each pod, one
after the other: a Python start-up (~0.2 s of CPU) per pod, which for fifty
pods on two cores was most of the wait. A kubelet instead probes each pod's
`:15021/healthz/ready` from the node over the pod network (Istio's injector
always excludes 15021 and 15020 from inbound capture, so the probe reaches
Envoy, or a proxyless agent, directly). That is what this does: a few
threads that entered the node's network namespace (a network namespace is
per thread; the rest of the process stays where it was) issue HTTP GETs to
every pod that is not ready yet, round after round, until all are ready,
one of the watched processes dies, or the deadline passes. An app port is
checked the way it was, from inside its pod (`localhost:port`), by
`connect_in_netns`.

`ReadinessRounds` is the sans-IO part: which targets are still pending, what
the last failure of each was, when the deadline is, and the message on
timeout; the probing itself is passed in.
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from istio_agent.capture.netns import enter_netns

ENVOY_STATUS_PORT = 15021  # Envoy's readiness listener (ENVOY_STATUS_PORT)
READY_PATH = "/healthz/ready"
PROBE_TIMEOUT = 1.0  # seconds per attempt (a kubelet's default timeoutSeconds)
ROUND_INTERVAL = 0.1  # seconds between rounds (pilot-agent wait's --periodMillis here)
PROBE_THREADS = 4  # enough to overlap a slow answer; each attempt is a connect and one GET


@dataclass(frozen=True)
class Target:
    """One thing to wait for: `key` (reported on timeout) and what `probe` needs to check it."""

    key: str
    what: str  # "pod client-1 to be ready": the failure message's wording
    host: str
    port: int
    path: str = ""  # "" for a TCP connect only
    netns: str = ""  # the namespace to probe from; "" for the prober's own (the node's)


@dataclass
class ReadinessRounds:
    """Which targets are still pending and why, against a deadline (time passed in)."""

    targets: Sequence[Target]
    deadline: float
    pending: list[Target] = field(init=False)
    last_error: dict[str, str] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.pending = list(self.targets)

    def record(self, outcomes: Mapping[str, str | None]) -> None:
        """One round's outcomes (key → None when ready, else the failure); ready targets leave `pending`."""
        for key, error in outcomes.items():
            if error is not None:
                self.last_error[key] = error
        self.pending = [t for t in self.pending if t.key not in outcomes or outcomes[t.key] is not None]

    @property
    def done(self) -> bool:
        return not self.pending

    def expired(self, now: float) -> bool:
        return now > self.deadline

    def timeout_message(self, timeout: float) -> str:
        first = self.pending[0]
        others = len(self.pending) - 1
        more = f" (and {others} more: {', '.join(t.key for t in self.pending[1:6])}{', ...' if others > 5 else ''})"
        return (f"timed out after {timeout:.0f}s waiting for {first.what}{more if others else ''}: "
                f"{self.last_error.get(first.key, 'not probed')}")


def probe_http(host: str, port: int, path: str, timeout: float = PROBE_TIMEOUT) -> str | None:
    """GET `path`: None on a 2xx answer, else what went wrong (refused, a status, a timeout)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"User-Agent": "kube-probe/1.31"})
        response = conn.getresponse()
        response.read()
        return None if 200 <= response.status < 300 else f"HTTP {response.status}"
    except (OSError, http.client.HTTPException) as exc:
        return f"{host}:{port}{path}: {exc or type(exc).__name__}"
    finally:
        conn.close()


def probe_tcp(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Connect (and close): None when something accepts, else the error."""
    try:
        socket.create_connection((host, port), timeout).close()
        return None
    except OSError as exc:
        return f"{host}:{port}: {exc}"


def probe_in_netns(netns_path: str, target: Target) -> str | None:
    """`target` probed from `netns_path` by a short-lived thread that entered it (its socket stays there)."""
    from istiod_local.node.cni_node import connect_in_netns

    try:
        sock = connect_in_netns(netns_path, target.host, target.port, PROBE_TIMEOUT)
    except OSError as exc:
        return f"{target.host}:{target.port}: {exc}"
    sock.close()
    return None


class Prober(Protocol):
    def round(self, targets: Iterable[Target]) -> dict[str, str | None]: ...


class NodeProber:
    """Threads inside the node's network namespace that probe pods as the kubelet does."""

    def __init__(self, node_netns_path: str, threads: int = PROBE_THREADS) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="node-probe", initializer=enter_netns,
                                        initargs=(node_netns_path,))

    def __enter__(self) -> NodeProber:
        return self

    def __exit__(self, *_: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def probe(self, target: Target) -> str | None:
        if target.netns:
            return probe_in_netns(target.netns, target)
        if target.path:
            return probe_http(target.host, target.port, target.path)
        return probe_tcp(target.host, target.port)

    def round(self, targets: Iterable[Target]) -> dict[str, str | None]:
        """Probe each target once (in-pod ones from the calling thread's helper threads); key → outcome."""
        pending = list(targets)
        futures = {t.key: self._pool.submit(self.probe, t) for t in pending if not t.netns}
        outcomes = {t.key: self.probe(t) for t in pending if t.netns}
        for key, future in futures.items():
            outcomes[key] = future.result()
        return outcomes


def wait_all(prober: Prober, targets: Sequence[Target], timeout: float,
             died: Callable[[Sequence[Target]], str | None], now: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Probe rounds until every target answered; None, or the error: what `died(pending)` names (a process the
    pending targets need has exited), or a timeout."""
    rounds = ReadinessRounds(targets, now() + timeout)
    while True:
        rounds.record(prober.round(rounds.pending))
        if rounds.done:
            return None
        dead = died(rounds.pending)
        if dead is not None:
            return f"while waiting for {rounds.pending[0].what}: {dead}"
        if rounds.expired(now()):
            return rounds.timeout_message(timeout)
        sleep(ROUND_INTERVAL)

"""Upstream Istio's own Go commands as test peers: where `make upstream` put them, the skip-with-reason check,
the differential tests' Hypothesis settings and tally, and scratch network namespaces to run both sides in.

The commands are built from the Go module proxy at the version pinned in `upstream.version` into
`.upstream/bin` (docs/UPSTREAM.md); `.upstream/bin/.version` names the version they were built
from, so a stale build (the pin moved, `make setup` not run since) skips like a missing one, with the reason.

Differential settings: CI runs a fixed seed (`derandomize`) and `UPSTREAM_DIFF_EXAMPLES` cases per area (300
by default); `make diff-long` sets more cases and a fresh `UPSTREAM_DIFF_SEED`, which replays a run exactly.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, seed, settings
from needs import need, need_root, need_tool
from support import ROOT

T = TypeVar("T")

UPSTREAM_VERSION_FILE = ROOT / "upstream.version"
UPSTREAM_BIN = ROOT / ".upstream" / "bin"
UPSTREAM_STAMP = UPSTREAM_BIN / ".version"
UPSTREAM_COMMANDS = ("pilot-agent", "pilot-discovery", "istio-cni", "install-cni")

DIFF_EXAMPLES = int(os.environ.get("UPSTREAM_DIFF_EXAMPLES") or 300)
DIFF_SEED = os.environ.get("UPSTREAM_DIFF_SEED") or ""
# Where each differential test appends its tally (one JSON line per run), for the note's table.
DIFF_TALLY = ROOT / ".upstream" / "differential.jsonl"


def upstream_version() -> str:
    """The pinned pseudo-version of istio.io/istio (one line of `upstream.version`)."""
    return UPSTREAM_VERSION_FILE.read_text().strip()


def need_upstream(command: str) -> Path:
    """The path of upstream's `command` built at the pinned version; skip (fail under REQUIRE_ALL) otherwise."""
    assert command in UPSTREAM_COMMANDS, command
    path = UPSTREAM_BIN / command
    need(path.exists(), f"needs upstream's {command} at {path}: run `make setup` (it needs `go` on PATH and the "
                        "Go module proxy)")
    built = UPSTREAM_STAMP.read_text().strip() if UPSTREAM_STAMP.exists() else "(no stamp)"
    need(built == upstream_version(),
         f"upstream's commands in {UPSTREAM_BIN} are {built}, the pin is {upstream_version()}: run `make setup`")
    return path


def differential(test: Callable[..., None] | None = None, *, cases_per_example: int = 1) -> Any:
    """Hypothesis settings of a differential test: fixed seed and DIFF_EXAMPLES cases unless a seed is given;
    no example database (a run is reproducible from its seed alone); no deadline (each case runs processes).

    `@differential(cases_per_example=n)` is for a test whose example is a batch of n cases (run together to
    share a slow step): DIFF_EXAMPLES / n examples, rounded up."""
    if test is None:
        return functools.partial(differential, cases_per_example=cases_per_example)
    configured = settings(
        max_examples=-(-DIFF_EXAMPLES // cases_per_example),
        derandomize=not DIFF_SEED,
        database=None,
        deadline=None,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        print_blob=True,
        report_multiple_bugs=False,
    )(test)
    return seed(int(DIFF_SEED))(configured) if DIFF_SEED else configured


@dataclass
class Tally:
    """What one differential test compared: cases, and per outcome how many (e.g. `equal`, `both-refused`,
    `deliberate:<name>`), printed at the end and appended to DIFF_TALLY."""

    area: str
    counts: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)

    def count(self, outcome: str) -> None:
        self.counts["cases"] += 1
        self.counts[outcome] += 1

    def report(self) -> str:
        elapsed = time.monotonic() - self.started
        record = {"area": self.area, "cases": self.counts["cases"], "seed": DIFF_SEED or "derandomized",
                  "examples": DIFF_EXAMPLES, "seconds": round(elapsed, 1),
                  "outcomes": {k: v for k, v in sorted(self.counts.items()) if k != "cases"}}
        with contextlib.suppress(OSError):
            DIFF_TALLY.parent.mkdir(parents=True, exist_ok=True)
            with DIFF_TALLY.open("a") as out:
                out.write(json.dumps(record) + "\n")
        return f"differential {self.area}: {json.dumps(record)}"


def run_in_thread(function: Callable[[], T]) -> T:
    """Run `function` on a fresh thread and return its result (or raise its exception): a thread that enters a
    network namespace (setns moves only the calling thread) must not be one the test keeps using."""
    result: list[T] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            result.append(function())
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def in_netns(path: str, function: Callable[[], T]) -> T:
    """`function()` run in the network namespace at `path` (e.g. /proc/<pid>/ns/net), on a throwaway thread."""
    from istio_agent.capture.netns import enter_netns

    def entered() -> T:
        enter_netns(path)
        return function()

    return run_in_thread(entered)


class NamedNetns:
    """A named network namespace (`ip netns add`) with an interface (a veth pair, both ends inside) holding
    `addresses`, and its /etc/netns/<name>/ directory, whose resolv.conf `ip netns exec` mounts over
    /etc/resolv.conf: the host facts upstream's istio-iptables reads (interface addresses, DNS servers), the
    same for both sides."""

    def __init__(self, name: str, addresses: tuple[str, ...]) -> None:
        self.name = name
        self.addresses = addresses
        self.etc = Path("/etc/netns") / name
        self.ip = need_tool("ip")

    def __enter__(self) -> NamedNetns:
        subprocess.run([self.ip, "netns", "del", self.name], capture_output=True, check=False)
        subprocess.run([self.ip, "netns", "add", self.name], check=True)
        self.etc.mkdir(parents=True, exist_ok=True)
        self.resolv_conf("")
        commands = [["link", "set", "lo", "up"]]
        if self.addresses:
            commands += [["link", "add", "eth0", "type", "veth", "peer", "name", "eth0-peer"],
                         ["link", "set", "eth0", "up"]]
            commands += [["addr", "add", a, "dev", "eth0", *(["nodad"] if ":" in a else [])] for a in self.addresses]
        try:
            for command in commands:
                subprocess.run([self.ip, "-n", self.name, *command], check=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run([self.ip, "netns", "del", self.name], capture_output=True, check=False)
        for child in self.etc.glob("*"):
            child.unlink()
        with contextlib.suppress(OSError):
            self.etc.rmdir()

    def resolv_conf(self, text: str) -> None:
        (self.etc / "resolv.conf").write_text(text)

    def run(self, argv: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.ip, "netns", "exec", self.name, *argv], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)


@contextlib.contextmanager
def named_netns(name: str, addresses: tuple[str, ...]) -> Iterator[NamedNetns]:
    need_root()
    with NamedNetns(name, addresses) as netns:
        yield netns


# A pod's network namespace as a capture differential needs it, by the addresses it holds (the order decides
# which family the pod's "first" address is).
POD_HOSTS: dict[str, tuple[str, ...]] = {
    "bare": (),  # loopback only: no pod address to find
    "v4": ("10.244.0.7/24",),
    "v6": ("fd00:10:244::7/64",),
    "dual-v4-first": ("10.244.0.7/24", "fd00:10:244::7/64"),
    "dual-v6-first": ("fd00:10:244::7/64", "10.244.0.7/24"),
}


@contextlib.contextmanager
def pod_hosts(tag: str) -> Iterator[dict[str, NamedNetns]]:
    """One named network namespace per `POD_HOSTS` shape, `<tag>-<shape>`, for a whole module (runs only read
    them)."""
    with contextlib.ExitStack() as stack:
        yield {key: stack.enter_context(named_netns(f"{tag}-{key}", addresses)) for key, addresses in POD_HOSTS.items()}


def downward_file(items: dict[str, str]) -> str:
    """A downward-API file: `key="value"` lines, values Go-quoted (what the kubelet writes)."""
    return "".join(f"{k}={json.dumps(v)}\n" for k, v in items.items())


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A child's environment: PATH and locale only (nothing of the runner's ISTIO_*, KUBERNETES_* ...)."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL")}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return {**env, **(extra or {})}


def describe(case: Any) -> str:
    """A case as one readable line for a failure message."""
    return json.dumps(case, sort_keys=True, default=str)

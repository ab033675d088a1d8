"""install-cni against upstream's, on generated CNI network directories and flags.

Each case is a net dir (primary configs as `.conf` and `.conflist`, chained plugins, a stale `istio-cni` entry,
an Istio-owned file name, files that are not configs, broken JSON, file modes) and install-cni's settings as
flags or as their environment variables (chained or standalone, `--cni-conf-name`, the Istio-owned config,
group read, kubeconfig mode, TLS verification, the plugin's log level). Both binaries run at once with the
same arguments and environment, each in its side's sandbox (`upstream_sandbox.Sandbox`, set up once per module
and joined per case): its own network namespace and a mount namespace under a private root where upstream's
fixed paths are scratch directories (`/opt/cni/bin` holds an `istio-cni` to install, `/host/opt/cni/bin` is the
bin dir, `/var/run/secrets/kubernetes.io/serviceaccount` has a token, a CA and a namespace) and nothing of them
exists on the host; repair is off, so no Kubernetes API is needed. Each serves /readyz on :8000 of its own
namespace. Every case checks both sandboxes still hold their layout, and the run fails when fewer than a
READY_SHARE of its cases reached ready (the files written are compared there).

Compared, once both report ready (or both show a state they keep without a change to their directories:
exited, waiting for a primary config, rewriting a config no runtime loads; or, under a log level that hides
those lines, nothing of either changed for QUIET seconds; SETTLE seconds at most when neither is ready) and
again after SIGTERM to both: every file left in the net dir (name, mode, content: JSON files as parsed JSON,
other files as bytes), in the bin dir (name and mode: upstream copies its binary, ours installs a launcher) and
in the run dir (the kubeconfig as parsed YAML, mode), and whether each became ready. The exit code after SIGTERM
is compared too.

Deliberate difference (docs/UPSTREAM.md): SIGTERM while install-cni still waits for a primary
config (chained, none in the net dir) ends upstream with exit 1 ("create CNI config file: context canceled":
its installer wraps the cancellation with %v, so the check that turns a cancellation into a clean exit misses
it); ours exits 0 as after any SIGTERM. Counted only with exactly that message and neither side ready.
Another: when the net dir holds no config a runtime loads after the write (`--cni-conf-name=x.json`, or a
standalone body under `--cni-conf-name=x.conflist`), both write it and stay unready, but upstream rewrites it in a
loop that never looks at its context, so SIGTERM does not end it (killed; seen in its log, it gets LOOP_GRACE
seconds, not GRACE) where ours cleans up and
exits 0. Counted only with upstream killed, that loop in its log (or, under a log level that hides it, nothing
changed by SIGTERM), and neither ready.
Another (docs/CNI.md): with `--istio-owned-cni-config` but no ambient the merge goes into the node's primary
file, which upstream's cleanup then deletes; ours takes its entry out and keeps the file. Counted only when the
files only ours kept are net files without an istio-cni entry.
Another (docs/CNI.md): cleanup puts the primary file back as it was (its bytes, its `.conf` name) when it still
holds what we wrote, where upstream leaves its rewrite minus our entry. Counted only when ours left exactly the
net dir the case started with and no file upstream changed holds an istio-cni entry.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from needs import need_file
from support import HTTP_NOT_YET, VENV_BIN, http_request
from upstream_peers import DIFF_EXAMPLES, Tally, base_env, describe, differential, in_netns, need_upstream
from upstream_sandbox import Sandbox, same_directory

# Upstream's error when SIGTERM ends its wait for a primary config (wrapped with %v, so its own check for a
# cancellation misses it and it exits 1).
CANCELLED_WAIT = "Error: create CNI config file: context canceled"
# Upstream's loop when the net dir holds no config a runtime loads after its write (our file under a
# `--cni-conf-name` such as `x.json`, or a standalone body named `.conflist`): it rewrites the file forever
# without looking at its context, so SIGTERM does not end it (killed).
UNLOADABLE_LOOP = re.compile(r"\(re\)writing CNI config file: no (valid )?networks found")
# Waiting for a primary config (upstream's two spellings, ours): a state kept until the net dir changes.
WAITING = re.compile(r"Waiting for CNI network config file to be written|does not exist\. Waiting for file to be "
                     r"written|cannot find existing CNI network config: .*; waiting for one in")
# Rewriting a config no runtime loads: upstream logs each pass of its loop (its first write logs one too), ours
# logs only rewrites, each a recheck that found its file still not in effect.
REWRITES = (re.compile(r"\(re\)writing CNI config file"), 2), (re.compile(r"\(re\)writing CNI config file"), 1)
QUIET = 1.0  # seconds without a change to either side's files or log that settle a case neither is ready in
SETTLE = 6.0  # seconds to wait for a side that shows none of those states (it never happened in a CI run)
SLOW_START = 15.0  # seconds a side may lag the other (start-up on a loaded machine)
POLL = 0.02
READY_SHARE = 0.3  # of a run's cases (from 50 on), at least this many must reach ready
GRACE = 10.0  # seconds from SIGTERM to SIGKILL, as a kubelet's grace period
LOOP_GRACE = 1.5  # for upstream in its loop, which never reads its context
# Upstream's fixed paths, scratch ones in each side's sandbox (a private root: nothing of them on the host).
HOST_BIN = Path("/host/opt/cni/bin")
SOURCE_BIN = Path("/opt/cni/bin")
SERVICE_ACCOUNT = Path("/run/secrets/kubernetes.io/serviceaccount")
PRIVATE = ("opt", "run", "host")
LAYOUT = """mkdir -p "$NEW/opt/cni/bin" && cp "$TOP/src/istio-cni" "$NEW/opt/cni/bin/"
mkdir -p "$NEW/host/opt/cni/bin" && mount --bind "$TOP/bin" "$NEW/host/opt/cni/bin"
mkdir -p "$NEW/run/secrets/kubernetes.io/serviceaccount"
mount --bind "$TOP/sa" "$NEW/run/secrets/kubernetes.io/serviceaccount"
"""

PLUGIN: st.SearchStrategy[dict[str, Any]] = st.sampled_from([
    {"type": "calico", "ipam": {"type": "calico-ipam"}, "policy": {"type": "k8s"}},
    {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
    {"type": "bandwidth", "capabilities": {"bandwidth": True}},
    {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipam": {"type": "host-local", "subnet": "10.244.0.0/24"}},
    {"type": "istio-cni", "log_level": "debug", "kubernetes": {"kubeconfig": "/old/path"}},  # a stale entry
    {"type": "tuning", "sysctl": {"net.core.somaxconn": "500"}},
])
CNI_VERSION = st.sampled_from(["0.3.1", "0.4.0", "1.0.0"])
NAME = st.from_regex(r"\A[a-z][a-z0-9-]{0,8}\Z", fullmatch=True)
CONFLIST = st.builds(lambda v, n, ps: {"cniVersion": v, "name": n, "plugins": ps},
                     CNI_VERSION, NAME, st.lists(PLUGIN, min_size=1, max_size=3, unique_by=lambda p: p["type"]))
def not_istio_cni(plugin: dict[str, Any]) -> bool:
    return plugin["type"] != "istio-cni"


CONF = st.builds(lambda v, n, p: {"cniVersion": v, "name": n, **p}, CNI_VERSION, NAME,
                 PLUGIN.filter(not_istio_cni))
FILE_NAME = st.one_of(
    st.builds(lambda n, s, ext: f"{n:02d}-{s}.{ext}", st.integers(0, 99), NAME, st.sampled_from(["conf", "conflist"])),
    st.sampled_from(["02-istio-cni.conflist", "10-calico.conflist", "05-bridge.conf", "README", "99-x.json"]))


@st.composite
def net_files(draw: st.DrawFn) -> dict[str, dict[str, Any]]:
    """name -> {"text": body, "mode": mode} of the net dir's files."""
    files: dict[str, dict[str, Any]] = {}
    for name in draw(st.lists(FILE_NAME, min_size=draw(st.sampled_from([1, 1, 1, 0])), max_size=3, unique=True)):
        kind = draw(st.sampled_from(["conflist", "conflist", "conf", "conflist", "conf", "broken", "empty-plugins"]))
        if kind == "conflist":
            body: Any = draw(CONFLIST)
        elif kind == "conf":
            body = draw(CONF)
        elif kind == "empty-plugins":
            body = {"cniVersion": "0.3.1", "name": "k8s", "plugins": []}
        else:
            body = None
        text = "{ not json" if body is None else json.dumps(body, indent=draw(st.sampled_from([None, 2])))
        files[name] = {"text": text, "mode": draw(st.sampled_from([0o644, 0o600, 0o640]))}
    return files


SETTINGS: dict[str, st.SearchStrategy[str]] = {
    "chained-cni-plugin": st.sampled_from(["true", "false"]),
    "cni-conf-name": st.one_of(FILE_NAME, st.just("")),
    "istio-owned-cni-config": st.sampled_from(["true", "false"]),
    "istio-owned-cni-config-filename": st.sampled_from(["02-istio-cni.conflist", "00-istio.conflist", ""]),
    "cni-conf-group-read": st.sampled_from(["true", "false"]),
    "kubeconfig-mode": st.sampled_from(["0600", "0644", "384", "0o640"]),
    "skip-tls-verify": st.sampled_from(["true", "false"]),
    "log-level": st.sampled_from(["debug", "info", "warn"]),
    "exclude-namespaces": st.sampled_from(["kube-system", "kube-system,istio-system", ""]),
}


# Settings upstream reads from the environment only (viper), with no flag: ours takes them as flags too (an
# extension, README "Not upstream"), which an upstream command line never uses.
ENV_ONLY = frozenset({"exclude-namespaces"})


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    args: list[str] = []
    environment: dict[str, str] = {}
    for name in draw(st.lists(st.sampled_from(sorted(SETTINGS)), max_size=4, unique=True)):
        value = draw(SETTINGS[name])
        if name not in ENV_ONLY and draw(st.booleans()):
            args.append(f"--{name}={value}")
        else:
            environment[name.upper().replace("-", "_")] = value
    if draw(st.integers(0, 3)) == 3:
        args.append(draw(st.sampled_from(["--log_output_level=cni-plugin:debug", "--log_output_level=all:error"])))
    return {"files": draw(net_files()), "args": args, "env": environment,
            "service_host": draw(st.sampled_from(["10.96.0.1", "fd00:10:96::1", "kubernetes.default.svc"]))}


# --- running both ---------------------------------------------------------------------------------------------
@dataclass
class Layout:
    """One side's long-lived namespaces (a `Sandbox` under a private root where upstream's fixed paths are
    scratch directories) and the host directories behind them."""

    box: Sandbox
    binary: Path
    bin_dir: Path  # what the sandbox's /host/opt/cni/bin is
    cases: Path  # each case's net and run directories, fresh per case

    def intact(self) -> bool:
        return self.box.alive() and same_directory(self.box.inside(str(HOST_BIN)), self.bin_dir)


def make_layout(top: Path, binary: Path) -> Sandbox:
    for sub in ("bin", "sa", "src", "cases"):
        (top / sub).mkdir(parents=True)
    (top / "src/istio-cni").write_text("#!/bin/sh\nexit 0\n")
    (top / "src/istio-cni").chmod(0o755)
    (top / "sa/token").write_text("token-1")
    (top / "sa/ca.crt").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    (top / "sa/namespace").write_text("istio-system")
    return Sandbox(top, PRIVATE, LAYOUT)


@pytest.fixture(scope="module")
def layouts() -> Iterator[tuple[Layout, Layout]]:
    """Upstream's and ours, for the whole module: set up once, each case only joins them."""
    theirs_binary = need_upstream("install-cni")
    ours_binary = need_file(VENV_BIN / "install-cni", "our install-cni")
    top = Path(tempfile.mkdtemp(prefix="icdiff-", dir="/tmp"))
    try:
        with make_layout(top / "upstream", theirs_binary) as theirs, make_layout(top / "ours", ours_binary) as ours:
            yield (Layout(theirs, theirs_binary, top / "upstream/bin", top / "upstream/cases"),
                   Layout(ours, ours_binary, top / "ours/bin", top / "ours/cases"))
    finally:
        shutil.rmtree(top, ignore_errors=True)


class Side:
    """One install-cni run of a case in its side's layout, over the case's own net and run directories."""

    def __init__(self, layout: Layout, case: dict[str, Any], number: int) -> None:
        self.layout = layout
        self.root = layout.cases / str(number)
        for sub in ("net", "run"):
            (self.root / sub).mkdir(parents=True)
        for leftover in layout.bin_dir.iterdir():  # a killed side's binary
            leftover.unlink()
        for name, spec in case["files"].items():
            (self.root / "net" / name).write_text(spec["text"])
            (self.root / "net" / name).chmod(spec["mode"])
        argv = [str(layout.binary), f"--mounted-cni-net-dir={self.root / 'net'}",
                f"--cni-agent-run-dir={self.root / 'run'}", "--repair-enabled=false", *case["args"]]
        environment = base_env({**case["env"], "KUBERNETES_SERVICE_HOST": case["service_host"],
                                "KUBERNETES_SERVICE_PORT": "443", "KUBERNETES_NODE_NAME": "node-1"})
        self.log = (self.root / "log.txt").open("w")
        self.proc = layout.box.popen(argv, environment, stdout=self.log, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        def get() -> bool:
            try:
                return http_request("127.0.0.1", 8000, "/readyz", timeout=0.5)[0] == 200
            except HTTP_NOT_YET:
                return False

        if self.proc.poll() is not None:
            return False
        with contextlib.suppress(OSError):
            return in_netns(self.layout.box.netns, get)
        return False

    def settled(self, ready: bool, markers: tuple[re.Pattern[str], int]) -> bool:
        """Whether this side has reached a state it keeps without a change to its directories: exited, ready,
        waiting for a primary config, or looping on a config no runtime loads (`markers`: its pattern and
        how many of its lines show that)."""
        if ready or self.proc.poll() is not None:
            return True
        text = self.output(full=True)
        return bool(WAITING.search(text)) or len(markers[0].findall(text)) >= markers[1]

    def files(self) -> dict[str, Any]:
        """What a directory comparison sees: per directory, name -> (mode, normalised content). Taken while the
        side runs too (to tell when it is quiet), so a file may go between the listing and its read."""
        seen: dict[str, Any] = {}
        for sub, where in (("net", self.root / "net"), ("bin", self.layout.bin_dir), ("run", self.root / "run")):
            for path in sorted(where.iterdir()):
                if path.is_socket() or path.name.startswith("."):
                    continue  # the plugin's log socket; a temporary file of an atomic write in flight
                try:
                    mode = path.stat().st_mode & 0o7777
                    data = path.read_bytes().replace(str(self.root).encode(), b"<root>")  # e.g. cni_agent_run_dir
                except FileNotFoundError:
                    continue  # renamed or removed since the listing: a change in flight, seen at the next look
                content: Any
                if sub == "bin":
                    content = None  # upstream copies its binary, ours installs a launcher
                elif sub == "run":
                    content = yaml.safe_load(data)
                else:
                    try:
                        content = json.loads(data)
                    except ValueError:
                        content = data.decode(errors="replace")
                seen[f"{sub}/{path.name}"] = (oct(mode), content)
        return seen

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, grace: float) -> int:
        try:
            code = self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = -9
        self.log.close()
        return code

    def output(self, full: bool = False) -> str:
        text = (self.root / "log.txt").read_text(errors="replace")
        return text if full else text[-1500:]


def stop_both(pair: tuple[Side, Side]) -> tuple[int, int]:
    """SIGTERM to both at once, then their exit codes (-9: killed after the grace period). Upstream looping on
    a config no runtime loads never reads its context, so it gets a short grace: it is killed either way."""
    for side in pair:
        side.terminate()
    looping = len(UNLOADABLE_LOOP.findall(pair[0].output(full=True))) >= 2
    return pair[0].wait(LOOP_GRACE if looping else GRACE), pair[1].wait(GRACE)


@contextlib.contextmanager
def sides(case: dict[str, Any], layouts: tuple[Layout, Layout], number: int) -> Iterator[tuple[Side, Side]]:
    started: list[Side] = []
    try:
        started = [Side(layouts[0], case, number), Side(layouts[1], case, number)]
        yield started[0], started[1]
    finally:
        for side in started:
            side.terminate()
        for side in started:
            side.wait(GRACE)
            shutil.rmtree(side.root, ignore_errors=True)


def silenced(case: dict[str, Any]) -> bool:
    """Whether the case's log level hides install-cni's info lines (those that show its state)."""
    return "--log_output_level=all:error" in case["args"]


def as_left(case: dict[str, Any]) -> dict[str, Any]:
    """The net dir as the case wrote it, in `Side.files`' form: what a cleanup that restores it leaves."""
    left: dict[str, Any] = {}
    for name, spec in sorted(case["files"].items()):
        if name.startswith("."):
            continue
        try:
            content: Any = json.loads(spec["text"])
        except ValueError:
            content = spec["text"]
        left[f"net/{name}"] = (oct(spec["mode"]), content)
    return left


def owned_primary_kept(case: dict[str, Any], theirs: dict[str, Any], ours: dict[str, Any]) -> bool:
    """docs/CNI.md: with --istio-owned-cni-config (and no ambient, so the merge went into the node's primary),
    upstream's cleanup deletes the file it wrote, the primary itself; ours takes its entry out and keeps it.
    True when that is the whole difference: the files only ours has are net files without an istio-cni entry."""
    setting = case["env"].get("ISTIO_OWNED_CNI_CONFIG", "")
    for arg in case["args"]:
        if arg.startswith("--istio-owned-cni-config="):
            setting = arg.split("=", 1)[1]
    if setting != "true" or not set(theirs) <= set(ours) or any(ours[k] != v for k, v in theirs.items()):
        return False
    extra = [k for k in ours if k not in theirs]
    return bool(extra) and all(k.startswith("net/") and "istio-cni" not in json.dumps(ours[k][1]) for k in extra)


def wait_ready(pair: tuple[Side, Side]) -> tuple[tuple[bool, bool], str]:
    """Poll both until both are ready, or both have settled (`Side.settled`), or neither is ready and nothing of
    either (files, log) changed for QUIET seconds (a log level that hides the states' lines), or neither is ready
    after SETTLE seconds, or one is and the other is not after SLOW_START seconds (a loaded machine may start one
    side late); then whether each is, and what ended the wait ("" when both settled)."""
    start = time.monotonic()
    last: tuple[Any, ...] = ()
    changed = start
    while True:
        states = (pair[0].ready(), pair[1].ready())
        now = time.monotonic()
        settled = [side.settled(up, marks) for side, up, marks in zip(pair, states, REWRITES, strict=True)]
        if all(states) or all(settled):
            return states, ""
        if not any(states):
            seen = tuple((side.files(), len(side.output(full=True))) for side in pair)
            if seen != last:
                last, changed = seen, now
            elif now - changed > QUIET:
                return states, "(settled when quiet)"
        if (not any(states) and now - start > SETTLE) or now - start > SLOW_START:
            return states, "(settled on the time limit)"
        time.sleep(POLL)


def settled_files(pair: tuple[Side, Side]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both sides' files once they agree, or as they are after SLOW_START seconds: a side that is not ready
    (waiting for a config) has written its binary and kubeconfig by then however late it started."""
    deadline = time.monotonic() + SLOW_START
    while True:
        snapshots = (pair[0].files(), pair[1].files())
        if snapshots[0] == snapshots[1] or time.monotonic() > deadline:
            return snapshots
        time.sleep(POLL)


def settle_exits(pair: tuple[Side, Side], timeout: float = 15.0) -> None:
    """When one side has exited (an installation that failed ends install-cni), give the other time to."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exited = [side.proc.poll() is not None for side in pair]
        if all(exited) or not any(exited):
            return
        time.sleep(POLL)


def test_scratch_layout_hides_the_host_paths(layouts: tuple[Layout, Layout]) -> None:
    """Inside a side's sandbox upstream's fixed paths are the scratch ones, and nothing of them reaches the host's
    own paths (which other users of this machine may create and remove)."""
    host_had = HOST_BIN.exists() and set(os.listdir(HOST_BIN))
    for layout in layouts:
        assert layout.intact()
        probe = ["sh", "-c", f"ls {SOURCE_BIN} {SERVICE_ACCOUNT}; touch {HOST_BIN}/marker"]
        listing = layout.box.run(probe, timeout=30)
        assert listing.returncode == 0, listing.stderr
        assert listing.stdout.split() == ["/opt/cni/bin:", "istio-cni", f"{SERVICE_ACCOUNT}:", "ca.crt", "namespace",
                                          "token"]
        assert (layout.bin_dir / "marker").exists()
        (layout.bin_dir / "marker").unlink()
    assert (HOST_BIN.exists() and set(os.listdir(HOST_BIN))) == host_had


@pytest.mark.timeout(120 + 8 * DIFF_EXAMPLES)  # one pytest test runs every generated case
def test_install_cni_differential(layouts: tuple[Layout, Layout]) -> None:
    tally = Tally("install-cni")
    numbers = count()

    @differential
    @given(case=cases())
    def compare(case: dict[str, Any]) -> None:
        for layout in layouts:
            assert layout.intact(), f"a side's sandbox lost its scratch layout ({layout.box.top})"
        with sides(case, layouts, next(numbers)) as (theirs, ours):
            ready, ended = wait_ready((theirs, ours))
            if ended:
                tally.counts[ended] += 1
            if not all(ready):
                settle_exits((theirs, ours))
            where = lambda: (f"case {describe(case)}\nupstream said:\n{theirs.output()}\n"  # noqa: E731
                             f"ours said:\n{ours.output()}")
            assert ready[1] == ready[0], f"readiness differs: upstream {ready[0]}, ours {ready[1]}\n{where()}"
            if ready[0]:
                tally.counts["(ready)"] += 1  # where the files written are compared
            running, ours_running = settled_files((theirs, ours)) if not all(ready) else (theirs.files(), ours.files())
            assert ours_running == running, f"files differ while running\n{where()}"
            codes = stop_both((theirs, ours))
            looped = UNLOADABLE_LOOP.search(theirs.output(full=True)) or (  # a log level that hides the loop's lines
                silenced(case) and theirs.files() == running)  # and SIGTERM changed nothing: no cleanup ran
            if codes == (-9, 0) and not ready[0] and looped:
                tally.count("deliberate: SIGTERM ends the wait for a config a runtime loads")
                return
            stopped, ours_stopped = theirs.files(), ours.files()
            left = as_left(case)
            restored = ours_stopped == left and not any(  # upstream's rewrite of the primary lacks our entry
                "istio-cni" in json.dumps(entry[1]) for name, entry in stopped.items() if left.get(name) != entry)
            if ours_stopped != stopped and restored:
                tally.count("deliberate: cleanup restored the primary file's original bytes")
                return
            if ours_stopped != stopped and owned_primary_kept(case, stopped, ours_stopped):
                tally.count("deliberate: the Istio-owned setting without ambient keeps the primary file")
                return
            assert ours_stopped == stopped, f"files differ after SIGTERM\n{where()}"
            if codes == (1, 0) and not ready[0] and CANCELLED_WAIT in theirs.output():
                tally.count("deliberate: exit 0 after SIGTERM while waiting for a primary config")
                return
            assert codes[1] == codes[0], f"exit codes after SIGTERM differ: {codes}\n{where()}"
            tally.count("equal, ready" if ready[0] else "equal, not ready")

    compare()
    print(tally.report())
    assert tally.counts["cases"] >= 1
    if tally.counts["cases"] >= 50:
        assert tally.counts["(ready)"] >= READY_SHARE * tally.counts["cases"], f"too few cases reached ready: {tally}"

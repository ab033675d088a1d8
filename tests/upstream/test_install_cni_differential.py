"""install-cni against upstream's, on generated CNI network directories and flags.

Each case is a net dir (primary configs as `.conf` and `.conflist`, chained plugins, a stale `istio-cni` entry,
an Istio-owned file name, files that are not configs, broken JSON, file modes) and install-cni's settings as
flags or as their environment variables (chained or standalone, `--cni-conf-name`, the Istio-owned config,
group read, kubeconfig mode, TLS verification, the plugin's log level). Both binaries run with the same
arguments and environment, each in its own network and mount namespace (`unshare`) where upstream's fixed
paths are scratch directories: `/opt/cni/bin` holds an `istio-cni` to install, `/host/opt/cni/bin` is the bin
dir, `/var/run/secrets/kubernetes.io/serviceaccount` has a token, a CA and a namespace; repair is off, so no
Kubernetes API is needed. Each serves /readyz on :8000 of its own namespace.

Compared, once both report ready (or after SETTLE seconds when neither does) and again after SIGTERM: every
file left in the net dir (name, mode, content: JSON files as parsed JSON, other files as bytes), in the bin dir
(name and mode: upstream copies its binary, ours installs a launcher) and in the run dir (the kubeconfig as
parsed YAML, mode), and whether each became ready. The exit code after SIGTERM is compared too.

Deliberate difference (docs/UPSTREAM.md): SIGTERM while install-cni still waits for a primary
config (chained, none in the net dir) ends upstream with exit 1 ("create CNI config file: context canceled":
its installer wraps the cancellation with %v, so the check that turns a cancellation into a clean exit misses
it); ours exits 0 as after any SIGTERM. Counted only with exactly that message and neither side ready.
Another: when the net dir holds no config a runtime loads after the write (`--cni-conf-name=x.json`, or a
standalone body under `--cni-conf-name=x.conflist`), both write it and stay unready, but upstream rewrites it in a
loop that never looks at its context, so SIGTERM does not end it (killed after 10 s) where ours cleans up and
exits 0. Counted only with upstream killed, that loop in its log, and neither ready.
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
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from needs import need_file, need_root, need_tool
from support import HTTP_NOT_YET, VENV_BIN, http_request
from upstream_peers import DIFF_EXAMPLES, Tally, base_env, describe, differential, in_netns, need_upstream

# Upstream's error when SIGTERM ends its wait for a primary config (wrapped with %v, so its own check for a
# cancellation misses it and it exits 1).
CANCELLED_WAIT = "Error: create CNI config file: context canceled"
# Upstream's loop when the net dir holds no config a runtime loads after its write (our file under a
# `--cni-conf-name` such as `x.json`, or a standalone body named `.conflist`): it rewrites the file forever
# without looking at its context, so SIGTERM does not end it (killed).
UNLOADABLE_LOOP = re.compile(r"\(re\)writing CNI config file: no (valid )?networks found")
SETTLE = 2.5  # seconds to wait for readiness before comparing a directory neither side is ready with
SLOW_START = 15.0  # seconds a side may lag the other (start-up on a loaded machine)
# Upstream's fixed paths, made in the mount namespace of each side (only /host is created on the host).
HOST_BIN = Path("/host/opt/cni/bin")
SOURCE_BIN = Path("/opt/cni/bin")
SERVICE_ACCOUNT = Path("/run/secrets/kubernetes.io/serviceaccount")
SIDE = """set -e
ip link set lo up
mount -t tmpfs tmpfs /opt && mkdir -p /opt/cni/bin && cp "$ROOT/src/istio-cni" /opt/cni/bin/
mount --bind "$ROOT/bin" /host/opt/cni/bin
mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount
mount --bind "$ROOT/sa" /run/secrets/kubernetes.io/serviceaccount
echo "scratch layout mounted"
exec "$@"
"""
MOUNTED = "scratch layout mounted"  # a side whose layout failed never ran its binary: the case proves nothing

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
@pytest.fixture(scope="module")
def host_bin_dir() -> Iterator[Path]:
    """/host/opt/cni/bin exists on the host (each side mounts its own over it); removed again if made here."""
    need_root()
    need_tool("unshare")
    made = [p for p in (HOST_BIN, HOST_BIN.parent, HOST_BIN.parent.parent, Path("/host")) if not p.exists()]
    HOST_BIN.mkdir(parents=True, exist_ok=True)
    try:
        yield HOST_BIN
    finally:
        for path in made:
            with contextlib.suppress(OSError):
                path.rmdir()


class Side:
    """One install-cni in its own namespaces, over its own scratch directories."""

    def __init__(self, root: Path, binary: Path, case: dict[str, Any]) -> None:
        self.root = root
        for sub in ("net", "bin", "run", "sa", "src"):
            (root / sub).mkdir(parents=True)
        (root / "src/istio-cni").write_text("#!/bin/sh\nexit 0\n")
        (root / "src/istio-cni").chmod(0o755)
        (root / "sa/token").write_text("token-1")
        (root / "sa/ca.crt").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
        (root / "sa/namespace").write_text("istio-system")
        for name, spec in case["files"].items():
            (root / "net" / name).write_text(spec["text"])
            (root / "net" / name).chmod(spec["mode"])
        argv = [str(binary), f"--mounted-cni-net-dir={root / 'net'}", f"--cni-agent-run-dir={root / 'run'}",
                "--repair-enabled=false", *case["args"]]
        environment = base_env({**case["env"], "ROOT": str(root), "KUBERNETES_SERVICE_HOST": case["service_host"],
                                "KUBERNETES_SERVICE_PORT": "443", "KUBERNETES_NODE_NAME": "node-1"})
        self.log = (root / "log.txt").open("w")
        self.proc = subprocess.Popen(["unshare", "--mount", "--net", "--propagation", "private", "sh", "-c", SIDE,
                                      "side", *argv], env=environment, stdout=self.log, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        def get() -> bool:
            try:
                return http_request("127.0.0.1", 8000, "/readyz", timeout=0.5)[0] == 200
            except HTTP_NOT_YET:
                return False

        if self.proc.poll() is not None:
            return False
        with contextlib.suppress(OSError):
            return in_netns(f"/proc/{self.proc.pid}/ns/net", get)
        return False

    def files(self) -> dict[str, Any]:
        """What a directory comparison sees: per directory, name -> (mode, normalised content)."""
        seen: dict[str, Any] = {}
        for sub in ("net", "bin", "run"):
            for path in sorted((self.root / sub).iterdir()):
                if path.is_socket() or path.name.startswith("."):
                    continue  # the plugin's log socket; a temporary file of an atomic write in flight
                mode = path.stat().st_mode & 0o7777
                data = path.read_bytes().replace(str(self.root).encode(), b"<root>")  # e.g. cni_agent_run_dir
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

    def stop(self, grace: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = -9
        self.log.close()
        return code

    def output(self, full: bool = False) -> str:
        text = (self.root / "log.txt").read_text(errors="replace")
        return text if full else text[-1500:]


@contextlib.contextmanager
def sides(case: dict[str, Any], theirs: Path, ours: Path) -> Iterator[tuple[Side, Side]]:
    top = Path(tempfile.mkdtemp(prefix="icdiff-", dir="/tmp"))
    started: list[Side] = []
    try:
        started = [Side(top / "upstream", theirs, case), Side(top / "ours", ours, case)]
        yield started[0], started[1]
    finally:
        for side in started:
            with contextlib.suppress(Exception):
                side.stop()
        shutil.rmtree(top, ignore_errors=True)


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


def wait_ready(pair: tuple[Side, Side]) -> tuple[bool, bool]:
    """Poll both until both are ready, or neither is after SETTLE seconds, or one is and the other is not after
    SLOW_START seconds (a loaded machine may start one side late); then whether each is."""
    start = time.monotonic()
    states = (False, False)
    while True:
        states = (pair[0].ready(), pair[1].ready())
        waited = time.monotonic() - start
        if all(states) or (not any(states) and waited > SETTLE) or waited > SLOW_START:
            return states
        time.sleep(0.05)


def settled_files(pair: tuple[Side, Side]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both sides' files once they agree, or as they are after SLOW_START seconds: a side that is not ready
    (waiting for a config) has written its binary and kubeconfig by then however late it started."""
    deadline = time.monotonic() + SLOW_START
    while True:
        snapshots = (pair[0].files(), pair[1].files())
        if snapshots[0] == snapshots[1] or time.monotonic() > deadline:
            return snapshots
        time.sleep(0.1)


def settle_exits(pair: tuple[Side, Side], timeout: float = 15.0) -> None:
    """When one side has exited (an installation that failed ends install-cni), give the other time to."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exited = [side.proc.poll() is not None for side in pair]
        if all(exited) or not any(exited):
            return
        time.sleep(0.05)


@pytest.mark.timeout(120 + 8 * DIFF_EXAMPLES)  # one pytest test runs every generated case
def test_install_cni_differential(host_bin_dir: Path) -> None:
    theirs_binary = need_upstream("install-cni")
    ours_binary = need_file(VENV_BIN / "install-cni", "our install-cni")
    tally = Tally("install-cni")

    @differential
    @given(case=cases())
    def compare(case: dict[str, Any]) -> None:
        with sides(case, theirs_binary, ours_binary) as (theirs, ours):
            ready = wait_ready((theirs, ours))
            for side in (theirs, ours):
                assert MOUNTED in side.output(full=True), f"a side's scratch layout failed:\n{side.output()}"
            if not all(ready):
                settle_exits((theirs, ours))
            where = lambda: (f"case {describe(case)}\nupstream said:\n{theirs.output()}\n"  # noqa: E731
                             f"ours said:\n{ours.output()}")
            assert ready[1] == ready[0], f"readiness differs: upstream {ready[0]}, ours {ready[1]}\n{where()}"
            running, ours_running = settled_files((theirs, ours)) if not all(ready) else (theirs.files(), ours.files())
            assert ours_running == running, f"files differ while running\n{where()}"
            codes = (theirs.stop(), ours.stop())
            if codes == (-9, 0) and not ready[0] and UNLOADABLE_LOOP.search(theirs.output()):
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


def test_scratch_layout_hides_the_host_paths(host_bin_dir: Path, tmp_path: Path) -> None:
    """Inside a side's namespaces upstream's fixed paths are the scratch ones, and nothing leaks to the host."""
    for sub in ("bin", "sa", "src"):
        (tmp_path / sub).mkdir()
    (tmp_path / "src/istio-cni").write_text("#!/bin/sh\n")
    (tmp_path / "sa/token").write_text("t")
    probe = ["sh", "-c", f"ls {SOURCE_BIN} {SERVICE_ACCOUNT}; touch {HOST_BIN}/marker"]
    listing = subprocess.run(["unshare", "--mount", "--net", "--propagation", "private", "sh", "-c", SIDE, "side",
                              *probe], env=base_env({"ROOT": str(tmp_path)}), capture_output=True, text=True,
                             check=False)
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.split("\n", 1)[0] == MOUNTED
    assert listing.stdout.split("\n", 1)[1].split() == ["/opt/cni/bin:", "istio-cni", f"{SERVICE_ACCOUNT}:", "token"]
    assert (tmp_path / "bin/marker").exists() and not (HOST_BIN / "marker").exists()
    assert os.listdir(HOST_BIN) == []

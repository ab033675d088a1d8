"""`istiod-local up` as a user runs it (root, real pods, Envoys, capture and CNI chain).

- `--check` on the default example (`istiod-local up --check`, the command `make run` runs):
  every expectation holds, exit 0, the table and the JSON line; nothing of the run is left.
- A mesh file declaring a plaintext client into a STRICT namespace allowed: the check sees the refusal, exit 1.
- A running `up` of a small mesh: a second `up` on its directory is refused naming the holder; an edit of
  the mesh file (replicas, PeerAuthentication) is applied and a bad one refused with its line and field;
  SIGINT removes every namespace, process and file.
- A SIGKILLed `up`: its pods die with it, and the next `up` on the directory takes the lock over and
  sweeps the killed run's namespaces and runtime directory.
- The bookinfo example on the embedded control plane: refused before anything is built, naming each kind of
  its Istio config that istiod-local does not apply and pointing at `--control-plane istiod`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from needs import need_root, need_tool
from support import ISTIOD_LOCAL, ROOT, LineCollector, open_workdir, poll, stop_process

from istiod_local.mesh.lock import LOCK_NAME
from istiod_local.node.processes import netns_pids, pid_alive
from istiod_local.node.runtime import RUNTIME_ROOT

SMALL = """\
namespaces:
- {name: default, peerAuthentication: PERMISSIVE}
services:
- name: web
  ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]
deployments:
- name: web
  app: {kind: http-echo, port: 8080}
- name: caller
  app: {kind: client, calls: [web], interval: 0.5}
- name: outside
  mode: none
"""


@pytest.fixture
def work() -> Iterator[Path]:
    need_root()
    for tool in ("ip", "setpriv", "iptables", "unshare", "mount"):
        need_tool(tool)
    with open_workdir("ia-mesh-up-") as base:
        yield base


def _ours(pid: int) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"ia-{pid}-")]


def _nothing_left(pid: int, run_dir: Path, pids: list[int]) -> None:
    assert _ours(pid) == []
    assert not [p for p in pids if pid_alive(p)]
    assert not list(RUNTIME_ROOT.glob(f"{pid}-*")) if RUNTIME_ROOT.exists() else True
    assert not (run_dir / LOCK_NAME).exists()
    assert not (run_dir / "node" / "pods").exists()


def _up(*args: str) -> list[str]:
    return [str(ISTIOD_LOCAL), "up", *args]


def _json_line(out: str) -> dict[str, object]:
    last = out.strip().splitlines()[-1]
    result: dict[str, object] = json.loads(last)
    return result


def _start(argv: list[str]) -> tuple[subprocess.Popen[str], LineCollector]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    return proc, LineCollector(proc.stdout)


def _wait_for(proc: subprocess.Popen[str], out: LineCollector, marker: str, timeout: float = 120.0) -> None:
    def seen() -> bool:
        if any(marker in line for line in list(out.lines)):
            return True
        if proc.poll() is not None:
            out.join(5)
            raise AssertionError(f"up exited with {proc.returncode} before {marker!r}:\n{out.text()}")
        return False

    poll(seen, f"{marker!r} in up's output", timeout, out.text)


def _pids(pid: int) -> list[int]:
    return [p for name in _ours(pid) for p in netns_pids(name)]


def test_check_on_the_default_mesh_holds_every_expectation_and_leaves_nothing(work: Path) -> None:
    istiod_local = str(Path(sys.executable).parent / "istiod-local")
    done = subprocess.run([istiod_local, "up", "--check", "--dir", str(work / "run")],
                          capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    out = done.stdout
    assert out.splitlines()[0].split()[0:1] != ["error:"]
    header = next(line for line in out.splitlines() if line.startswith("client "))
    assert header.split() == ["client", "target", "via", "expected", "observed", "ok"]
    assert "FAIL" not in out
    # the STRICT namespace refused the pod outside the mesh; the proxyless client's identity reached its server
    assert any(line.startswith("legacy-1 ") and "ratings-1:8080" in line and line.endswith(" ok")
               and line.count("refused") == 2 for line in out.splitlines()), out
    assert any(line.startswith("greeter-client-1 ") and "xDS" in line and
               line.count("spiffe://cluster.local/ns/default/sa/greeter-client") == 2 for line in out.splitlines())
    assert any("legacy.example.internal:80" in line and "DNS" in line for line in out.splitlines())
    total = next(line for line in out.splitlines() if line.endswith("expectations held"))
    held, _, rest = total.partition("/")
    assert int(held) == int(rest.split()[0]) >= 50, total
    result = _json_line(out)
    assert result["pods"] == 9 and result["check_passed"] is True, result
    assert isinstance(result["ready_s"], float) and isinstance(result["rss_per_pod_mb"], float), result
    assert "removed the mesh's namespaces" in done.stderr
    assert not (work / "run" / LOCK_NAME).exists()
    assert not [d for d in RUNTIME_ROOT.glob("*") if d.name.split("-")[0].isdigit()
                and not pid_alive(int(d.name.split("-")[0]))] if RUNTIME_ROOT.exists() else True


def test_a_broken_expectation_fails_the_check(work: Path) -> None:
    mesh = work / "strict.yaml"
    mesh.write_text(SMALL.replace("PERMISSIVE", "STRICT") +
                    "expectations:\n- {from: outside, to: web, outcome: plaintext}\n")
    done = subprocess.run(_up(str(mesh), "--check", "--dir", str(work / "run")), capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 1, done.stdout + done.stderr
    failed = [line for line in done.stdout.splitlines() if line.endswith("FAIL")]
    assert len(failed) == 1 and failed[0].startswith("outside-1 ") and "plaintext" in failed[0] \
        and "refused" in failed[0], done.stdout
    assert _json_line(done.stdout)["check_passed"] is False
    # the meshed client is still fine: one failure, not a broken mesh
    assert any(line.startswith("caller-1 ") and line.endswith(" ok") for line in done.stdout.splitlines())


def test_a_running_mesh_follows_its_file_refuses_a_second_up_and_cleans_up_on_sigint(work: Path) -> None:
    mesh, run_dir = work / "mesh.yaml", work / "run"
    mesh.write_text(SMALL)
    proc, out = _start(_up(str(mesh), "--dir", str(run_dir), "--plain"))
    pids: list[int] = []
    try:
        _wait_for(proc, out, "running; edit")
        assert (run_dir / LOCK_NAME).read_text().strip() == str(proc.pid)
        second = subprocess.run(_up(str(mesh), "--dir", str(run_dir), "--once"), capture_output=True, text=True,
                                timeout=60, cwd=ROOT)
        assert second.returncode == 1
        assert f"already running for this directory (pid {proc.pid}" in second.stderr, second.stderr
        assert len(_ours(proc.pid)) == 4  # node, web-1, caller-1, outside-1: the second up built nothing
        mesh.write_text(SMALL.replace("- name: web\n  app:", "- name: web\n  replicas: 2\n  app:"))
        _wait_for(proc, out, "pod default/web-2 ready", 90)
        _wait_for(proc, out, "mesh file change applied: 1 pods added", 30)
        mesh.write_text(SMALL.replace("PERMISSIVE", "sometimes"))
        _wait_for(proc, out, "mesh file refused, keeping the last good mesh", 30)
        assert any(f"{mesh}:2: namespaces[0].peerAuthentication: must be one of" in line for line in out.lines)
        mesh.write_text(SMALL.replace("PERMISSIVE", "STRICT"))  # web-2 goes, the namespace turns STRICT
        _wait_for(proc, out, "default STRICT", 60)
        assert web_pods(proc.pid) == ["web-1"]
        _wait_for(proc, out, "traffic caller-1: http://", 30)
        pids = _pids(proc.pid)
        assert pids
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"up did not finish its cleanup within 120 s of SIGINT:\n{out.text()}") from None
        out.join(10)
        assert proc.returncode == 0, out.text()
    finally:
        stop_process(proc)
        out.join(5)
    _nothing_left(proc.pid, run_dir, pids)


def web_pods(pid: int) -> list[str]:
    return sorted(name.split(f"ia-{pid}-0-", 1)[1] for name in _ours(pid) if "-web-" in name)


def test_after_sigkill_the_next_up_takes_the_lock_and_sweeps_the_dead_run(work: Path) -> None:
    mesh, run_dir = work / "mesh.yaml", work / "run"
    mesh.write_text(SMALL)
    proc, out = _start(_up(str(mesh), "--dir", str(run_dir), "--plain"))
    try:
        _wait_for(proc, out, "running; edit")
        pids = _pids(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        poll(lambda: not [p for p in pids if pid_alive(p)], "the pods' processes to die with up", 30,
             lambda: f"alive: {[p for p in pids if pid_alive(p)]}")
        assert (run_dir / LOCK_NAME).exists()  # left behind, but no longer held
        done = subprocess.run(_up(str(mesh), "--dir", str(run_dir), "--once"), capture_output=True, text=True,
                              timeout=300, cwd=ROOT)
        assert done.returncode == 0, done.stdout + done.stderr
        assert _json_line(done.stdout)["check_passed"] is None
        assert _ours(proc.pid) == []  # swept by the new run's node
        assert not (RUNTIME_ROOT / f"{proc.pid}-0").exists()
        assert not (run_dir / LOCK_NAME).exists()
    finally:
        stop_process(proc)
        out.join(5)
        for name in _ours(proc.pid):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def test_istio_config_on_the_embedded_control_plane_is_refused_by_kind(work: Path) -> None:
    done = subprocess.run(_up(str(ROOT / "examples" / "bookinfo.yaml"), "--once", "--dir", str(work / "run")),
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    error = done.stderr
    for named in ("the embedded control plane (istiod-local) does not apply DestinationRule: default/productpage "
                  "(examples/istio/destination-rules.yaml:4)", "VirtualService: default/bookinfo",
                  "default/reviews (examples/istio/routing.yaml:17)", "Gateway: default/bookinfo-gateway",
                  "AuthorizationPolicy: default/allow-nothing",
                  "PeerAuthentication with a selector or portLevelMtls: default/productpage",
                  "gateway deployments (istio-ingressgateway)", "`istiod-local up --control-plane istiod`"):
        assert named in error, error
    assert not (work / "run" / "node").exists()  # nothing was built

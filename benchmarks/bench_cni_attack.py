"""The CNI plugin and install-cni under the attacks of issue 23 (items 5-9): what a real pod's ADD waits, what
install-cni keeps doing.

Against real peers in this process tree: install-cni (the node agent, its fast path on `sidecar-add.sock`),
the installed `istio-cni` launcher and the console script (in-process), a pod API over HTTPS (`PodApi`) and one
that drips its answer (`DripApi`: the headers at once, then a byte every `DRIP_INTERVAL` seconds, as in the
issue), all from `tests/` helpers. Every ADD is for a pod without a sidecar (fetched, then let through), so the
figures are the plugin's path to the API and back, with no rules to apply.

- Slow-drip API: the in-process plugin's ADD against it with one attempt (`drip_inprocess_add_s`, the time to
  its code 11; the GET's whole-request deadline is 5 s); then `STUCK` launcher calls against it fill every
  fast-path slot (2 attempts each) and a normal pod's ADD against the good API is timed `ROUNDS` times while
  they are stuck (`add_with_16_stuck_s_max`, aim <= 2 s), against the same ADD unloaded
  (`add_unloaded_s_p50`); `stuck_calls_code_11` of `STUCK` end with code 11, the slowest after
  `stuck_call_s_max`.
- 100 idle connections held open on `sidecar-add.sock` (more than the slots and than the connections allowed
  to wait): a normal ADD behind them (`add_behind_100_idle_s_max`, aim: a second or two).
- Hostile conflists, each on a fresh install-cni: 100 KB of nested `[` replacing the merged file
  (`nested_conflist_survived`, `nested_cleanup_complete`); a valid `BIG_MB` MB conflist sorting first
  (install-cni's RSS before and at its peak, `big_conflist_rss_mb`, and the slowest `/healthz` while it is
  there, `big_conflist_healthz_s_max`); a 5 MB conflist written in place then replaced by a newer small file
  0.3 s later, `NONATOMIC_RUNS` times (`nonatomic_newer_file_lost_runs`, aim 0).
- A plugin log line carrying a forged `cni-agent` line after a newline (`forged_log_lines`, aim 0); stdin of
  100 KB of `[` to the plugin (`deep_stdin_code`, 6 expected: an error object, not a traceback).
- A writer taking our entry out every 5 ms for `WRITER_S` seconds while /readyz is sampled, with the file read
  just before and just after each request: `readyz_200_share` of the answers are 200 (the issue saw 85%), and
  `readyz_200_while_entry_absent` counts the 200s whose request fell between two reads that both lacked the
  entry (an upper bound: install-cni may have put the entry back, and the writer taken it out again, within
  one request).

Needs root (the fast path serves uid 0 only). Usage: python benchmarks/bench_cni_attack.py
Last line: one JSON object with the figures.
"""

from __future__ import annotations

import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
from cni_fastpath_peers import CONSOLE_SCRIPT, FastPathAgent, cni_env, run_plugin
from cni_install_peers import CALICO, InstallCni, write_atomically
from cni_peers import DripApi, PodApi, write_kubeconfig
from support import HTTP_NOT_YET, http_request, poll

STUCK = 16
ROUNDS = 5
DRIP_INTERVAL = 2.0
IDLE = 100
BIG_MB = 200
NONATOMIC_RUNS = 4
WRITER_S = 3.0
POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "app-1", "namespace": "shop", "labels": {}, "annotations": {}},
       "spec": {"containers": [{"name": "app"}]}}
NEWER = {**CALICO, "plugins": [*CALICO["plugins"], {"type": "bandwidth"}]}


def timed_add(agent: FastPathAgent) -> float:
    """One normal pod's ADD through the installed launcher (fast path, or in-process when refused); seconds."""
    started = time.perf_counter()
    done = run_plugin(agent.launcher, cni_env(pod_name="app-1"), agent.config())
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"a normal ADD failed: {done.stdout!r} {done.stderr[-500:]!r}")
    return elapsed


def drip_and_idle(folder: Path) -> dict[str, Any]:
    api = PodApi(folder / "api")
    api.add_pod(POD)
    drip = DripApi(folder / "drip", interval=DRIP_INTERVAL)
    drip_dir = Path(tempfile.mkdtemp(prefix="iacni-bd-"))
    write_kubeconfig(drip_dir, drip.url, drip.ca_pem)
    figures: dict[str, Any] = {}
    agent = FastPathAgent(api)
    stuck: list[tuple[float, subprocess.Popen[bytes]]] = []
    idle: list[socket.socket] = []
    try:
        config = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni",
                  "cni_agent_run_dir": str(drip_dir), "prevResult": {"cniVersion": "1.0.0", "ips": []}}
        started = time.perf_counter()
        done = run_plugin(CONSOLE_SCRIPT, cni_env(ISTIO_CNI_POD_RETRIEVAL_MAX_RETRIES="1"), config)
        figures["drip_inprocess_add_s"] = round(time.perf_counter() - started, 2)
        figures["drip_inprocess_code"] = json.loads(done.stdout).get("code")

        agent.start()
        figures["add_unloaded_s_p50"] = round(statistics.median(timed_add(agent) for _ in range(ROUNDS)), 3)
        slow_stdin = drip_dir / "stdin.json"
        slow_stdin.write_text(json.dumps(agent.config(cni_agent_run_dir=str(drip_dir))))
        for i in range(STUCK):
            with slow_stdin.open("rb") as stdin:
                stuck.append((time.perf_counter(), subprocess.Popen(
                    [str(agent.launcher)], env=cni_env(pod_name=f"slow-{i}"), stdin=stdin, stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL)))
        poll(lambda: drip.open_now >= STUCK, "every slot stuck on the dripping API", 60, agent.output)
        with_stuck = [timed_add(agent) for _ in range(ROUNDS)]
        figures["add_with_16_stuck_s_max"] = round(max(with_stuck), 3)
        figures["add_with_16_stuck_s_p50"] = round(statistics.median(with_stuck), 3)
        codes, durations = [], []
        for began, caller in stuck:
            out, _ = caller.communicate(timeout=120)
            durations.append(time.perf_counter() - began)
            codes.append(json.loads(out).get("code") if out else None)
        figures["stuck_calls_code_11"] = codes.count(11)
        figures["stuck_call_s_max"] = round(max(durations), 2)

        for _ in range(IDLE):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(str(agent.socket))
            idle.append(sock)
        behind = [timed_add(agent) for _ in range(ROUNDS)]
        figures["add_behind_100_idle_s_max"] = round(max(behind), 3)
    finally:
        for sock in idle:
            sock.close()
        for _, caller in stuck:
            if caller.poll() is None:
                caller.kill()
                caller.wait()
        agent.stop()
        drip.close()
        api.close()
        shutil.rmtree(drip_dir, ignore_errors=True)
    return figures


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def healthz_s(agent: InstallCni) -> float:
    started = time.perf_counter()
    try:
        http_request("127.0.0.1", agent.readiness_port, "/healthz")
    except HTTP_NOT_YET:
        return float("inf")
    return time.perf_counter() - started


def left_nothing(agent: InstallCni) -> bool:
    return (not agent.kubeconfig.exists() and not list(agent.bin_dir.iterdir())
            and not list(agent.run_dir.iterdir()))


def hostile_conflists(folder: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {}

    agent = InstallCni(folder / "nested")
    try:
        primary = agent.net_dir / "10-calico.conflist"
        primary.write_text(json.dumps(CALICO))
        agent.start()
        poll(agent.ready, "installed", 20, agent.output)
        write_atomically(primary, "[" * 100_000)
        poll(lambda: "nested deeper than" in agent.output(), "the nested file refused", 20, agent.output)
        figures["nested_conflist_survived"] = agent.proc is not None and agent.proc.poll() is None \
            and healthz_s(agent) < 5
        figures["nested_cleanup_complete"] = agent.terminate() == 0 and left_nothing(agent)
    finally:
        agent.close()

    agent = InstallCni(folder / "big")
    try:
        (agent.net_dir / "20-flannel.conflist").write_text(json.dumps({"cniVersion": "0.3.1", "name": "cbr0",
                                                                       "plugins": [{"type": "flannel"}]}))
        agent.start()
        poll(agent.ready, "installed", 20, agent.output)
        assert agent.proc is not None
        figures["rss_before_mb"] = rss_mb(agent.proc.pid)
        big = agent.net_dir / "10-big.conflist"
        with big.open("w") as out:
            out.write(json.dumps(CALICO)[:-1] + ', "pad": [')
            chunk = ", ".join(['"' + "x" * 1000 + '"'] * 1000)
            for i in range(BIG_MB):
                out.write(("" if i == 0 else ", ") + chunk)
            out.write("]}")
        worst = max(healthz_s(agent) for _ in range(50))
        poll(lambda: "over install-cni's limit" in agent.output(), "the big file named", 30, agent.output)
        figures["big_conflist_healthz_s_max"] = round(max(worst, *(healthz_s(agent) for _ in range(50))), 3)
        figures["big_conflist_rss_mb"] = rss_mb(agent.proc.pid)
        figures["big_conflist_rss_peak_mb"] = rss_mb(agent.proc.pid, "VmHWM")
        figures["big_conflist_ready"] = agent.ready()  # the runtime may load it first: install-cni waits
        big.unlink()
        agent.terminate()
    finally:
        agent.close()

    agent = InstallCni(folder / "nonatomic")
    lost = 0
    try:
        primary = agent.net_dir / "10-calico.conflist"
        primary.write_text(json.dumps(CALICO))
        agent.start()
        poll(agent.ready, "installed", 20, agent.output)
        for run in range(NONATOMIC_RUNS):
            large = json.dumps({**CALICO, "run": run, "pad": ["x" * 100] * 50_000})
            with primary.open("w") as out:
                for start in range(0, len(large), 1 << 16):
                    out.write(large[start:start + (1 << 16)])
            time.sleep(0.3)
            write_atomically(primary, json.dumps({**NEWER, "run": run}))

            def settled(run: int = run) -> bool:
                try:
                    text = json.loads(primary.read_text())
                except ValueError:
                    return False
                return "istio-cni" in [p.get("type") for p in text.get("plugins", [])]

            poll(settled, "our entry back", 30, agent.output)
            final = json.loads(primary.read_text())
            lost += int(final.get("run") != run or "pad" in final or "bandwidth" not in
                        [p.get("type") for p in final["plugins"]])
        figures["nonatomic_newer_file_lost_runs"] = lost
        figures["nonatomic_runs"] = NONATOMIC_RUNS
        agent.terminate()
    finally:
        agent.close()
    return figures


def log_and_readiness(folder: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    agent = InstallCni(folder / "ready")
    try:
        primary = agent.net_dir / "10-calico.conflist"
        primary.write_text(json.dumps(CALICO))
        agent.start()
        poll(agent.ready, "installed", 20, agent.output)
        forged = "x\n2026-12-01T10:00:00.000000Z\tinfo\tcni-agent\tforged"
        body = json.dumps([json.dumps({"level": "info", "time": "2026-12-01T10:00:00Z", "msg": forged})]).encode()
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(agent.socket_path))
            sock.sendall(b"POST /log HTTP/1.1\r\nHost: unix\r\nContent-Length: " + str(len(body)).encode()
                         + b"\r\nConnection: close\r\n\r\n" + body)
            while sock.recv(65536):
                pass
        poll(lambda: "forged" in agent.output(), "the plugin's line logged", 20, agent.output)
        figures["forged_log_lines"] = sum(line.split("\t")[2:] == ["cni-agent", "forged"]
                                          for line in agent.output().splitlines())

        def has_entry() -> bool:
            try:
                return "istio-cni" in [p.get("type") for p in json.loads(primary.read_text())["plugins"]]
            except (OSError, ValueError, KeyError):
                return False

        stop = threading.Event()

        def remove_entry() -> None:
            while not stop.is_set():
                write_atomically(primary, json.dumps(CALICO))
                stop.wait(0.005)

        writer = threading.Thread(target=remove_entry)
        writer.start()
        samples = ok = wrong = 0
        end = time.monotonic() + WRITER_S
        try:
            while time.monotonic() < end:
                before = has_entry()
                status = agent.status("/readyz")
                after = has_entry()
                samples += 1
                ok += status == 200
                wrong += status == 200 and not before and not after
        finally:
            stop.set()
            writer.join(10)
        figures["readyz_samples"] = samples
        figures["readyz_200_share"] = round(ok / samples, 3) if samples else None
        figures["readyz_200_while_entry_absent"] = wrong
        agent.terminate()
    finally:
        agent.close()

    deep = subprocess.run([str(CONSOLE_SCRIPT)], input=b"[" * 100_000, env=cni_env(), capture_output=True,
                          timeout=60, check=False)
    figures["deep_stdin_code"] = json.loads(deep.stdout).get("code") if deep.stdout else None
    figures["deep_stdin_traceback"] = b"Traceback" in deep.stderr
    return figures


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="iacni-attack-"))
    try:
        for name in ("api", "drip", "nested", "big", "nonatomic", "ready"):
            (folder / name).mkdir()
        figures = drip_and_idle(folder)
        figures.update(hostile_conflists(folder))
        figures.update(log_and_readiness(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"in-process ADD against a dripping API: code {figures['drip_inprocess_code']} after "
          f"{figures['drip_inprocess_add_s']} s")
    print(f"normal ADD: unloaded p50 {figures['add_unloaded_s_p50']} s; with {STUCK} calls stuck max "
          f"{figures['add_with_16_stuck_s_max']} s; behind {IDLE} idle connections max "
          f"{figures['add_behind_100_idle_s_max']} s")
    print(f"stuck calls: {figures['stuck_calls_code_11']}/{STUCK} code 11, slowest {figures['stuck_call_s_max']} s")
    print(f"{BIG_MB} MB conflist: RSS {figures['rss_before_mb']} -> {figures['big_conflist_rss_mb']} MB "
          f"(peak {figures['big_conflist_rss_peak_mb']}), slowest /healthz {figures['big_conflist_healthz_s_max']} s")
    print(f"non-atomic writer: newer file lost in {figures['nonatomic_newer_file_lost_runs']}/{NONATOMIC_RUNS} runs")
    print(f"/readyz while a writer removes our entry: 200 in {figures['readyz_200_share']} of "
          f"{figures['readyz_samples']} samples, {figures['readyz_200_while_entry_absent']} while it was absent")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

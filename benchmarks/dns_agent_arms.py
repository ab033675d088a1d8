"""Whole agents as `bench_dns.py`'s arms: our `pilot-agent` and upstream's Go one, each answering DNS on :15053.

`bench_dns.py` measures our DNS proxy component against dnsmasq; this puts the
same queries through each whole agent, as a pod's app reaches it, so that ours
and upstream's Go agent meet on the same ground. One network namespace per
implementation (both use the fixed ports), each with:

- istiod-local (15010/15012) whose registry has the benchmark's known names
  as services (`svc<i>.ns<i%10>.svc.cluster.local` at the clusterIPs
  `bench_dns` gives them): the agent's NameTable comes through NDS;
- a dnsmasq on 127.0.0.1:53 answering every `fwd.test` name, which the
  namespace's resolv.conf (`/etc/netns/<ns>/resolv.conf`, bound over
  /etc/resolv.conf by `ip netns exec`) names: where both agents forward;
- the sidecar agent (Envoy, ISTIO_META_DNS_CAPTURE=true) pinned to the
  server core; its Envoy, istiod-local, dnsmasq and dnsperf on the client
  core, so that the agent's own process has a core as the proxy under test
  has in `bench_dns`. Envoy and istiod-local run at nice 19 there: a push's
  work in them takes the client's idle time, not its share, so what a push
  costs the answers is what it costs inside the agent.

**Busy**: while dnsperf runs, the registry flips every `FLIP_SECONDS`
between the known names alone and the known names plus 1,000 services x 5
ports (`bench_xds`'s push: 5,000 clusters, and a NameTable twice as big), so a
push is always in flight through the agent: xDS relayed to Envoy, NDS taken in.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from bench_xds import PORTS, Arm
from launchers import PilotAgent, pod_files
from support import poll, stop_process
from upstream_arm import sidecar_environment, start_agent

AGENT_DNS_PORT = 15053
FLIP_SECONDS = 3.0
PUSH_SERVICES = 1000


def dns_registry(known: list[tuple[str, str]], busy: bool) -> str:
    """The known names as services with their clusterIPs (plus the push's services when `busy`), and the
    agent's own workload."""
    lines = ["services:\n"]
    for host, ip in known:
        name, namespace = host.split(".")[:2]
        lines.append(f"- {{name: {name}, namespace: {namespace}, clusterIP: {ip}, selector: {{app: {name}}},"
                     " ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]}\n")
    if busy:
        ports = ", ".join(f"{{name: {n}, port: {p}, targetPort: {p}, protocol: {proto}}}" for n, p, proto in PORTS)
        for i in range(PUSH_SERVICES):
            lines.append(f"- {{name: push-{i}, namespace: ns-{i % 10}, selector: {{app: push-{i}}},"
                         f" ports: [{ports}]}}\n")
    lines.append("workloads:\n")
    lines.append("- {name: echo-1, namespace: default, serviceAccount: echo, labels: {app: echo}, ip: 127.0.0.1}\n")
    return "".join(lines)


def query_answered(name: str) -> bool:
    """One A query for `name` to the agent's DNS port (from a thread in the arm's namespace) got an answer."""
    query = (0x1234).to_bytes(2, "big") + bytes.fromhex("01000001000000000000") + b"".join(
        bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\x00\x00\x01\x00\x01"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(0.5)
        sock.sendto(query, ("127.0.0.1", AGENT_DNS_PORT))
        reply = sock.recv(4096)
    return reply[:2] == query[:2] and reply[3] & 0x0F == 0 and int.from_bytes(reply[6:8], "big") > 0


class AgentDnsArm:
    """One implementation's agent in its own namespace, with its istiod-local and forwarding target."""

    def __init__(self, implementation: str, base: Path, known: list[tuple[str, str]], server_core: int | None,
                 client_core: int | None, pin: list[str], upstream_dnsmasq: list[str], label: str = "") -> None:
        self.implementation = implementation
        self.known = known
        self.arm = Arm(f"dns-{label or implementation}", base, base / "state")
        self.server_pin = pin if server_core is not None else []
        self.client_core = client_core
        self.upstream_dnsmasq = upstream_dnsmasq
        self.etc = Path("/etc/netns") / self.arm.netns
        self.dnsmasq: subprocess.Popen[bytes] | None = None
        self.agent: PilotAgent | None = None

    def prefix(self, core: int | None = None) -> list[str]:
        """`ip netns exec` into the arm's namespace, pinned to `core` (the client core by default)."""
        core = self.client_core if core is None else core
        taskset = shutil.which("taskset")
        return [*self.arm.prefix(), *([taskset, "-c", str(core)] if taskset and core is not None else [])]

    def start(self) -> AgentDnsArm:
        self.arm.create()
        self.etc.mkdir(parents=True, exist_ok=True)
        (self.etc / "resolv.conf").write_text("nameserver 127.0.0.1\n"
                                              "search default.svc.cluster.local svc.cluster.local cluster.local\n")
        self.dnsmasq = subprocess.Popen([*self.prefix(), *self.upstream_dnsmasq], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)
        pod = pod_files(self.arm.state, self.arm.dir / "pod", pod="echo-1")
        self.arm.start_istiod()
        self.arm.registry.write(dns_registry(self.known, busy=False))
        environment = sidecar_environment(ISTIO_META_DNS_CAPTURE="true")
        self.agent = start_agent(self.implementation, pod, environment, prefix=[*self.arm.prefix(), *self.server_pin],
                                 log_file=self.arm.dir / "agent.log")
        agent = self.agent
        last = self.known[-1][0]
        poll(lambda: agent.alive() and self.arm.admin_thread.submit(query_answered, last).result(),
             f"{self.implementation}'s DNS proxy to answer {last}", 90, agent.output, retry_on=(OSError,))
        poll(lambda: self.arm.admin_thread.submit(query_answered, "q0.fwd.test").result(),
             f"{self.implementation}'s DNS proxy to forward", 30, agent.output, retry_on=(OSError,))
        envoy = poll(agent.envoy_pid, "the agent's Envoy", 30, agent.output)
        assert self.arm.istiod is not None and self.arm.istiod.proc is not None
        for pid in (envoy, self.arm.istiod.proc.pid):  # beside the client, not the agent, and out of its way
            if self.client_core is not None and shutil.which("taskset"):
                subprocess.run(["taskset", "-a", "-p", "-c", str(self.client_core), str(pid)], check=True,
                               capture_output=True)
            for task in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, int(task), 19)
        return self

    @contextlib.contextmanager
    def busy(self) -> Iterator[list[int]]:
        """A push always in flight: the registry flipped every FLIP_SECONDS; yields the flip count so far."""
        flips = [0]
        stop = threading.Event()

        def flip() -> None:
            big = False
            while not stop.is_set():
                big = not big
                self.arm.registry.write(dns_registry(self.known, busy=big))
                flips[0] += 1
                stop.wait(FLIP_SECONDS)

        thread = threading.Thread(target=flip, daemon=True)
        thread.start()
        try:
            yield flips
        finally:
            stop.set()
            thread.join()
            self.arm.registry.write(dns_registry(self.known, busy=False))
            time.sleep(FLIP_SECONDS)  # the last push through before the next measurement

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.kill()
        stop_process(self.dnsmasq)
        self.arm.stop()
        shutil.rmtree(self.etc, ignore_errors=True)

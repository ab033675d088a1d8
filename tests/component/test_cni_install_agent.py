"""The real `install-cni` process on scratch directories: readiness, reinstall after conflicting writes, the
binary and the kubeconfig kept, SIGTERM cleanup, metrics (promtool), the plugin's log socket, bad input.

Each test writes its own service-account directory (token, ca.crt, namespace) and points
KUBERNETES_SERVICE_HOST/PORT at 127.0.0.1:6443 (nothing needs to answer there: install-cni only
writes the plugin's kubeconfig for it). Ports are free ones (`--readiness-port` is ours, so a dev
machine's busy :8000 does not matter); repair is off. Nothing here asserts timing: changes are
polled for (the benchmark measures how fast they come).
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cni_install_peers import CALICO, InstallCni, write_atomically
from launchers import IstiodLocal, RegistryFile
from needs import need_tool
from support import VENV_BIN, http_request, poll


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[InstallCni]:
    instance = InstallCni(tmp_path)
    yield instance
    instance.close()


def test_readyz_waits_for_the_primary_config_then_installs(agent: InstallCni) -> None:
    agent.start()
    # Chained mode and no network config yet: serving, not ready, nothing in the net dir.
    assert agent.status("/readyz") == 503
    poll(lambda: "waiting for one in" in agent.output(), "the waiting message", 10, agent.output)
    assert agent.status("/readyz") == 503
    assert list(agent.net_dir.iterdir()) == []
    write_atomically(agent.net_dir / "10-calico.conflist", json.dumps(CALICO, indent=4))
    poll(agent.ready, "/readyz 200 once the primary config exists", 10, agent.output)
    assert agent.has_entry("10-calico.conflist")
    assert (agent.bin_dir / "istio-cni").read_bytes() == agent.launcher()
    assert (agent.bin_dir / "istio-cni").stat().st_mode & 0o777 == 0o755
    assert 'istio_cni_installs_total{result="SUCCESS"} 1.0' in agent.metrics()
    assert "istio_cni_install_ready 1.0" in agent.metrics()


def test_kept_installed_and_cleaned_up_on_sigterm(agent: InstallCni) -> None:
    primary = agent.net_dir / "10-calico.conflist"
    original = json.dumps(CALICO, indent=4) + "\n"  # not Go's formatting: cleanup must restore the bytes
    primary.write_text(original)
    primary.chmod(0o644)
    other_config = agent.net_dir / "99-loopback.conf"
    other_config.write_text('{"cniVersion": "0.3.1", "name": "lo", "type": "loopback"}')
    other_file = agent.net_dir / "README"
    other_file.write_text("not a network config\n")
    other_binary = agent.bin_dir / "bridge"
    other_binary.write_bytes(b"\x7fELF not really")
    other_binary.chmod(0o755)
    agent.start()
    poll(agent.ready, "installed", 10, agent.output)
    assert agent.has_entry(primary.name)
    assert primary.stat().st_mode & 0o777 == 0o644  # the primary's permissions kept
    kubeconfig = agent.kubeconfig.read_text()
    assert "token: token-one" in kubeconfig and "server: https://127.0.0.1:6443" in kubeconfig
    assert agent.kubeconfig.stat().st_mode & 0o777 == 0o600

    # Another CNI rewrites its conflist after us, without our entry (rename, then in place).
    rewritten = json.dumps({**CALICO, "plugins": [*CALICO["plugins"], {"type": "bandwidth"}]}, indent=2)
    write_atomically(primary, rewritten)
    poll(lambda: agent.has_entry(primary.name), "our entry back after a conflicting rename", 10, agent.output)
    with primary.open("w") as out:
        out.write(rewritten)
    poll(lambda: agent.has_entry(primary.name), "our entry back after an in-place rewrite", 10, agent.output)
    poll(agent.ready, "ready again", 10, agent.output)
    assert [p["type"] for p in json.loads(primary.read_text())["plugins"]] == [
        "calico", "portmap", "bandwidth", "istio-cni"]

    # The binary deleted: restored.
    (agent.bin_dir / "istio-cni").unlink()
    poll(lambda: (agent.bin_dir / "istio-cni").exists(), "the binary restored", 10, agent.output)
    assert (agent.bin_dir / "istio-cni").read_bytes() == agent.launcher()

    # The token rotated (Kubernetes swaps the projected files by rename): the kubeconfig follows.
    write_atomically(agent.sa_dir / "token", "token-two")
    poll(lambda: "token: token-two" in agent.kubeconfig.read_text(), "the kubeconfig rewritten", 10, agent.output)
    # First install, two config repairs, the binary, the kubeconfig: each counted, each logged.
    assert 'istio_cni_installs_total{result="SUCCESS"} 5.0' in agent.metrics()
    assert agent.output().count("Istio CNI configuration and binaries reinstalled") == 4

    assert agent.terminate() == 0
    assert primary.read_text() == rewritten  # byte-identical to what the other CNI last wrote
    assert primary.stat().st_mode & 0o777 == 0o644
    assert not agent.kubeconfig.exists()
    assert not (agent.bin_dir / "istio-cni").exists()
    assert not agent.socket_path.exists() and not (agent.run_dir / "sidecar-add.sock").exists()
    assert other_config.read_text() == '{"cniVersion": "0.3.1", "name": "lo", "type": "loopback"}'
    assert other_file.read_text() == "not a network config\n"
    assert other_binary.read_bytes() == b"\x7fELF not really"
    assert sorted(p.name for p in agent.net_dir.iterdir()) == ["10-calico.conflist", "99-loopback.conf", "README"]
    assert sorted(p.name for p in agent.bin_dir.iterdir()) == ["bridge"]


def test_sigterm_stops_the_components_in_reverse_start_order_and_leaves_nothing_behind(agent: InstallCni) -> None:
    """The assembly on the lifecycle, for real: every component's start and stop logged (debug), the stops in
    reverse order, then no file, socket or port of install-cni's left and the node's files as they were."""
    primary = agent.net_dir / "10-calico.conflist"
    original = json.dumps(CALICO, indent=2)
    primary.write_text(original)
    agent.start("--log_output_level=cni-agent:debug")
    poll(agent.ready, "installed", 10, agent.output)
    assert agent.metrics()  # the monitoring port is served
    assert agent.terminate() == 0
    lines = agent.output().splitlines()
    started = [line.split("\tstarted ", 1)[1].split(":")[0] for line in lines if "\tstarted " in line]
    stopped = [line.split("\tstopped ", 1)[1] for line in lines if "\tstopped " in line]
    assert started == ["plugin log socket", "istio-cni fast path", "health server", "metrics server", "installation",
                       "installer loop"], agent.output()
    assert stopped == started[::-1], agent.output()
    assert any("\tcni-agent\tCNI node agent stopping" in line for line in lines)
    # Nothing left: our entry, kubeconfig and binary gone, both sockets removed, both ports closed.
    assert primary.read_text() == original
    assert sorted(p.name for p in agent.net_dir.iterdir()) == [primary.name]
    assert list(agent.bin_dir.iterdir()) == []
    assert sorted(p.name for p in agent.run_dir.iterdir()) == []
    for port in (agent.readiness_port, agent.monitoring_port):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_a_conf_primary_is_restored_under_its_name(agent: InstallCni) -> None:
    primary = agent.net_dir / "10-bridge.conf"
    original = '{"cniVersion": "0.3.1", "name": "br", "type": "bridge", "bridge": "cni0"}'
    primary.write_text(original)
    agent.start()
    poll(agent.ready, "installed", 10, agent.output)
    assert not primary.exists() and agent.has_entry("10-bridge.conflist")
    assert agent.terminate() == 0
    assert primary.read_text() == original
    assert not (agent.net_dir / "10-bridge.conflist").exists()


def test_metrics_pass_promtool(agent: InstallCni) -> None:
    promtool = need_tool("promtool")
    (agent.net_dir / "10-calico.conflist").write_text(json.dumps(CALICO))
    agent.start()
    poll(agent.ready, "installed", 10, agent.output)
    text = agent.metrics()
    assert "# TYPE istio_cni_installs_total counter" in text
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30,
                             check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert http_request("127.0.0.1", agent.monitoring_port, "/other")[0] == 404


def post_unix(path: Path, target: str, body: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        sock.sendall(f"POST {target} HTTP/1.1\r\nHost: unix\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    return response


def test_log_socket_logs_the_plugins_lines(agent: InstallCni) -> None:
    agent.start()
    assert agent.socket_path.stat().st_mode & 0o777 == 0o666
    entries = [json.dumps({"level": "info", "time": "2026-12-01T10:00:00.5Z", "msg": "istio-cni ADD for pod-7",
                           "pod": "default/pod-7"}),
               json.dumps({"level": "debug", "time": "2026-12-01T10:00:00.6Z", "msg": "below the agent's level"})]
    response = post_unix(agent.socket_path, "/log", json.dumps(entries).encode())
    assert response.startswith(b"HTTP/1.1 200")
    line = poll(lambda: next((x for x in (agent.log.lines if agent.log else []) if "ADD for pod-7" in x), None),
                "the plugin's line in install-cni's log", 10, agent.output)
    assert "\tinfo\tcni-plugin\tistio-cni ADD for pod-7\tpod=default/pod-7" in line
    assert line.startswith("2026-12-01T10:00:00.5")  # the plugin's time
    assert "below the agent's level" not in agent.output()
    assert post_unix(agent.socket_path, "/log", b"{not json").startswith(b"HTTP/1.1 200")
    poll(lambda: "Failed to unmarshal CNI plugin logs" in agent.output(), "the refusal logged", 10, agent.output)


def test_a_plugin_log_line_cannot_forge_another(agent: InstallCni) -> None:
    """log.sock is 0666 (as upstream): any pod user can post to it, but a message is one line of install-cni's log
    whatever it contains; a newline in it shows escaped, never as a forged `cni-agent` line."""
    agent.start()
    forged = "\n2026-12-01T10:00:00.000000Z\tinfo\tcni-agent\tIstio CNI configuration and binaries reinstalled (x)"
    entries = [json.dumps({"level": "info", "time": "2026-12-01T10:00:00.5Z", "msg": "pod-9 ADD" + forged,
                           "pod\rlabel": "v\u2028w"})]
    assert post_unix(agent.socket_path, "/log", json.dumps(entries).encode()).startswith(b"HTTP/1.1 200")
    line = poll(lambda: next((x for x in (agent.log.lines if agent.log else []) if "pod-9 ADD" in x), None),
                "the plugin's line in install-cni's log", 10, agent.output)
    assert "pod-9 ADD\\n2026-12-01T10:00:00.000000Z\\tinfo\\tcni-agent\\tIstio CNI configuration" in line, line
    assert "pod\\rlabel=v\\u2028w" in line, line
    assert not any(x.startswith("2026-12-01T10:00:00.000000Z") for x in agent.output().splitlines())
    assert post_unix(agent.socket_path, "/log", b"[" * 100_000).startswith(b"HTTP/1.1 200")  # too deep: refused
    poll(lambda: "nested deeper than 128 levels" in agent.output(), "the deep body refused", 10, agent.output)
    assert agent.status("/healthz") == 200


@pytest.mark.parametrize(("args", "env", "named"), [
    (["--chained-cni-plugin=yes"], {}, "--chained-cni-plugin ($CHAINED_CNI_PLUGIN): 'yes'"),
    ([], {"KUBECONFIG_MODE": "rw-r--r--"}, "--kubeconfig-mode ($KUBECONFIG_MODE): 'rw-r--r--'"),
    ([], {"KUBERNETES_SERVICE_HOST": ""}, "KUBERNETES_SERVICE_HOST"),
    ([f"--cni-bin-dir={VENV_BIN}"], {}, "holds the plugin install-cni copies"),
    (["--repair-enabled=true", "--repair-label-pods=true", "--repair-broken-pod-label-key=bad key!"], {},
     "--repair-broken-pod-label-key"),
])
def test_bad_input_fails_at_start_naming_it(agent: InstallCni, args: list[str], env: dict[str, str],
                                            named: str) -> None:
    done = subprocess.run(agent.args(*args), env=agent.env(**env), capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode != 0
    assert named in done.stderr, done.stderr
    assert list(agent.bin_dir.iterdir()) == [] and list(agent.run_dir.iterdir()) == []


def test_settings_from_the_environment(agent: InstallCni) -> None:
    """Each flag also comes from its variable (upstream's viper binding); the command line wins."""
    agent.start(f"--cni-agent-run-dir={agent.run_dir}", CHAINED_CNI_PLUGIN="false", CNI_CONF_NAME="50-istio.conf",
                EXCLUDE_NAMESPACES="kube-system,istio-system", KUBECONFIG_MODE="0640",
                CNI_AGENT_RUN_DIR="/nonexistent/run")
    poll(agent.ready, "installed standalone", 10, agent.output)
    entry = json.loads((agent.net_dir / "50-istio.conf").read_text())
    assert entry["type"] == "istio-cni" and entry["exclude_namespaces"] == ["kube-system", "istio-system"]
    assert entry["cni_agent_run_dir"] == str(agent.run_dir)
    assert agent.kubeconfig.stat().st_mode & 0o777 == 0o640
    assert agent.terminate() == 0
    assert list(agent.net_dir.iterdir()) == []


def test_against_istiod_locals_api_with_repair(agent: InstallCni, tmp_path: Path) -> None:
    """The kubeconfig install-cni writes is read by the official client against istiod-local's API, and the
    repair controller runs beside the installer without holding it up."""
    pytest.importorskip("kubernetes")
    from kubernetes import client as kclient
    from kubernetes import config as kconfig

    mesh = {"services": [], "workloads": [{"name": "echo-1", "namespace": "default", "serviceAccount": "echo",
                                           "ip": "10.244.0.5", "nodeName": "iacni-node"}]}
    registry = RegistryFile(tmp_path / "mesh.yaml", mesh)
    with IstiodLocal(tmp_path / "state", registry=registry, kube_api_addr="127.0.0.1:0") as istiod:
        for name in ("token", "ca.crt", "namespace"):
            (agent.sa_dir / name).unlink()
        istiod.kubeconfig(tmp_path / "unused.kubeconfig", identity="istio-system/istio-cni",
                          service_account_dir=agent.sa_dir)
        host, port = istiod.kube_api.rsplit(":", 1)
        (agent.net_dir / "10-calico.conflist").write_text(json.dumps(CALICO))
        agent.start("--repair-enabled=true", "--repair-label-pods=true", "--repair-node-name=iacni-node",
                    KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port)
        poll(agent.ready, "installed with repair running", 10, agent.output)
        poll(lambda: "repair controller watching 1 pods" in agent.output(), "repair listing this node's pods", 10,
             agent.output)
        configuration = kclient.Configuration()
        kconfig.load_kube_config(config_file=str(agent.kubeconfig), client_configuration=configuration)
        with kclient.ApiClient(configuration) as api_client:
            pod = kclient.CoreV1Api(api_client).read_namespaced_pod("echo-1", "default")
        assert pod.spec is not None and pod.spec.node_name == "iacni-node"
        assert agent.terminate() == 0
    assert "repair controller failed" not in agent.output()


def test_entry_follows_a_new_first_config(agent: InstallCni) -> None:
    """No --cni-conf-name: the runtime loads the lexically first valid file, so our entry moves there when
    another CNI adds one that sorts first, and the file it left is put back as it was (not upstream: upstream
    keeps writing the file it chose first)."""
    later = agent.net_dir / "20-flannel.conflist"
    later_text = json.dumps({"cniVersion": "0.3.1", "name": "cbr0", "plugins": [{"type": "flannel"}]})
    later.write_text(later_text)
    agent.start()
    poll(agent.ready, "installed", 10, agent.output)
    assert agent.has_entry(later.name)
    write_atomically(agent.net_dir / "10-calico.conflist", json.dumps(CALICO))
    poll(lambda: agent.has_entry("10-calico.conflist"), "our entry in the new first file", 10, agent.output)
    poll(lambda: later.read_text() == later_text, "the old file put back", 10, agent.output)
    assert agent.terminate() == 0
    assert json.loads((agent.net_dir / "10-calico.conflist").read_text()) == CALICO

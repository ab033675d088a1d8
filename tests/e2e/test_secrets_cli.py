"""`pilot-agent secrets` against the real Envoy that a real `pilot-agent proxy sidecar` feeds over SDS.

The agent runs on the host with the fixed sidecar ports (checked free first),
istiod-local on free loopback ports. The table and JSON are checked against
the certificates Envoy really holds; `--diff` against the agent's own
`/debug/secrets`. The mismatch is provoked with a second real Envoy (admin on
a free port) whose `default` comes from another issuer through file-based SDS
while its `ROOTCA` is byte-identical to the agent's: exactly what a stale
Envoy looks like to the diff.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from launchers import (
    IstiodLocal,
    PilotAgent,
    RegistryFile,
    agent_environment,
    echo_registry,
    host_sidecar_ports,
    pilot_agent_cli,
    port_in_use,
)
from needs import need_sidecar_binaries
from sidecar_harness import active_secret, config_dump, inline_bytes
from support import ENVOY, HTTP_NOT_YET, free_port, http_request, poll, stop_process

from istio_agent.pki.certs import build_csr, cert_to_pem, load_csr, new_root_ca, sign_workload_csr
from istio_agent.pki.keys import generate_key, key_to_pem
from istio_agent.status.secrets_debug import DIFF_COLUMNS, ITEM_COLUMNS

SPIFFE = "spiffe://cluster.local/ns/default/sa/echo"
ITEM_KEYS = ["resource_name", "cert", "source", "destination", "state", "trust_domain", "cert_valid",
             "serial_number", "not_after", "not_before", "type"]
SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"


@dataclass
class Pod:
    agent: PilotAgent
    default_serial: str
    root_serial: str
    root_bundle: bytes


def secrets_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return pilot_agent_cli("secrets", *args, timeout=30)


def envoy_serials() -> tuple[str, str, bytes] | None:
    """(default leaf serial, ROOTCA serial, ROOTCA bytes) once Envoy holds both actively."""
    dump = config_dump()
    default, root = active_secret(dump, "default"), active_secret(dump, "ROOTCA")
    if default is None or root is None:
        return None
    leaf = x509.load_pem_x509_certificates(inline_bytes(default["tls_certificate"]["certificate_chain"]))[0]
    bundle = inline_bytes(root["validation_context"]["trusted_ca"])
    return format(leaf.serial_number, "x"), format(x509.load_pem_x509_certificate(bundle).serial_number, "x"), bundle


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    need_sidecar_binaries()
    base = tmp_path_factory.mktemp("secrets-cli")
    registry = RegistryFile(base / "mesh.yaml", echo_registry())
    # The agent needs the host's 15000/15001/15006/15020/15021/15090: take the shared lock, then wait for them.
    with host_sidecar_ports(), IstiodLocal(base / "state", registry=registry) as istiod:
        agent = PilotAgent(istiod.pod_files(base / "pod", pod="echo-1"),
                           agent_environment(discovery=istiod.secure_address))
        try:
            agent.start().wait_ready()
            default_serial, root_serial, bundle = poll(envoy_serials, "Envoy to hold default and ROOTCA", 20,
                                                       agent.output, retry_on=HTTP_NOT_YET)
            yield Pod(agent, default_serial, root_serial, bundle)
        finally:
            agent.kill()


def rows(table: str) -> dict[str, list[str]]:
    """Table lines by resource name, cells split on the 5-space column gaps."""
    out = {}
    for line in table.splitlines()[1:]:
        cells = [c.strip() for c in line.split("     ") if c.strip()]
        out[cells[0]] = cells
    return out


def header_cells(table: str) -> list[str]:
    return [c.strip() for c in table.splitlines()[0].split("     ") if c.strip()]


def test_table_matches_what_envoy_holds(pod: Pod) -> None:
    done = secrets_cli()
    assert done.returncode == 0, done.stderr
    assert header_cells(done.stdout) == list(ITEM_COLUMNS)
    table = rows(done.stdout)
    assert table["default"][:5] == ["default", "Cert Chain", "ACTIVE", "true", pod.default_serial]
    assert table["ROOTCA"][:5] == ["ROOTCA", "CA", "ACTIVE", "true", pod.root_serial]
    for cells in table.values():
        assert all(time.strptime(c, "%Y-%m-%dT%H:%M:%SZ") for c in cells[5:7])


def test_json_items(pod: Pod) -> None:
    done = secrets_cli("-o", "json")
    assert done.returncode == 0, done.stderr
    items = {item["resource_name"]: item for item in json.loads(done.stdout)}
    assert set(items) == {"default", "ROOTCA"}
    assert all(list(item) == ITEM_KEYS for item in items.values())
    default = items["default"]
    assert (default["state"], default["type"], default["cert_valid"], default["serial_number"]) == (
        "ACTIVE", "Cert Chain", True, pod.default_serial)
    leaf = x509.load_pem_x509_certificate(default["cert"].encode())
    assert leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.UniformResourceIdentifier) == [SPIFFE]
    assert items["ROOTCA"]["cert"].encode() == pod.root_bundle


def test_agent_debug_endpoint_lists_its_cache(pod: Pod) -> None:
    status, body = http_request("127.0.0.1", 15020, "/debug/secrets")
    assert status == 200
    items = {item["resource_name"]: item for item in json.loads(body)}
    assert items["default"]["serial_number"] == pod.default_serial
    assert items["default"]["source"] == "ca"
    assert "PRIVATE KEY" not in body.decode()


def test_diff_in_sync_on_a_healthy_pod(pod: Pod) -> None:
    done = secrets_cli("--diff")
    assert done.returncode == 0, done.stdout + done.stderr
    assert header_cells(done.stdout) == list(DIFF_COLUMNS)
    table = rows(done.stdout)
    assert table["default"] == ["default", "Cert Chain", "true", "PRESENT", "ACTIVE", pod.default_serial,
                                *table["default"][6:]]
    assert table["ROOTCA"][3:5] == ["PRESENT", "ACTIVE"]

    as_json = secrets_cli("--diff", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    diffs = json.loads(as_json.stdout)
    assert {(d["resource_name"], d["agent"], d["proxy"]) for d in diffs} == {
        ("default", "PRESENT", "ACTIVE"), ("ROOTCA", "PRESENT", "ACTIVE")}
    assert all(list(d) == ["agent", "proxy", *ITEM_KEYS] for d in diffs)


def sds_file(path: Path, secret: dict[str, Any]) -> dict[str, Any]:
    path.write_text(json.dumps({"version_info": "1", "resources": [{"@type": SECRET_TYPE, **secret}]}))
    return {"path_config_source": {"path": str(path)}, "resource_api_version": "V3"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def stale_envoy(pod: Pod, tmp_path: Path) -> Iterator[tuple[int, str]]:
    """A second real Envoy with the agent's ROOTCA but a `default` from another issuer: (admin port, serial)."""
    now = time.time()
    other_ca = new_root_ca(generate_key("ECDSA"), "cluster.local", now, 3600)
    key = generate_key("ECDSA")
    leaf = sign_workload_csr(other_ca, load_csr(build_csr(key, [SPIFFE])), SPIFFE, now, 3600)
    default = sds_file(tmp_path / "default.json", {"name": "default", "tls_certificate": {
        "certificate_chain": {"inline_bytes": b64((cert_to_pem(leaf)).encode() + other_ca.cert_pem)},
        "private_key": {"inline_bytes": b64(key_to_pem(key))}}})
    rootca = sds_file(tmp_path / "rootca.json", {"name": "ROOTCA", "validation_context": {
        "trusted_ca": {"inline_bytes": b64(pod.root_bundle)}}})
    admin_port = free_port()
    endpoint = {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 9}}}}
    bootstrap = {
        "node": {"id": "stale-envoy", "cluster": "stale-envoy"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {"clusters": [{
            "name": "mtls-upstream", "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": "mtls-upstream", "endpoints": [{"lb_endpoints": [endpoint]}]},
            "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {
                    "tls_certificate_sds_secret_configs": [{"name": "default", "sds_config": default}],
                    "combined_validation_context": {
                        "default_validation_context": {},
                        "validation_context_sds_secret_config": {"name": "ROOTCA", "sds_config": rootca}}}}},
        }]},
    }
    (tmp_path / "envoy.json").write_text(json.dumps(bootstrap))
    log = (tmp_path / "envoy.log").open("wb")
    proc = subprocess.Popen([str(ENVOY), "-c", str(tmp_path / "envoy.json"), "--disable-hot-restart",
                             "-l", "warning", "--concurrency", "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        def holds_default() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the second Envoy exited: {(tmp_path / 'envoy.log').read_text()}")
            return port_in_use(admin_port) and b'"default"' in http_request(
                "127.0.0.1", admin_port, "/config_dump?mask=dynamic_active_secrets")[1]

        poll(holds_default, "the second Envoy to load its secrets", 20, retry_on=HTTP_NOT_YET)
        yield admin_port, format(leaf.serial_number, "x")
    finally:
        stop_process(proc)
        log.close()


def test_diff_reports_a_stale_envoy(pod: Pod, stale_envoy: tuple[int, str]) -> None:
    admin_port, stale_serial = stale_envoy
    done = secrets_cli("--diff", "--admin-port", str(admin_port))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines()[1:]]
    assert ["ROOTCA", "CA", "true", "PRESENT", "ACTIVE", pod.root_serial] == lines[0][:6]
    assert ["default", "Cert", "Chain", "true", "ACTIVE", stale_serial] == lines[1][:6]  # Envoy only
    assert ["default", "Cert", "Chain", "true", "PRESENT", pod.default_serial] == lines[2][:6]  # the agent only
    assert f"default: Envoy holds serial {stale_serial} (ACTIVE), the agent does not" in done.stderr
    assert f"default: the agent holds serial {pod.default_serial}, Envoy does not" in done.stderr

    diffs = json.loads(secrets_cli("--diff", "-o", "json", "--admin-port", str(admin_port)).stdout)
    assert sorted((d["resource_name"], d["agent"], d["proxy"], d["serial_number"]) for d in diffs) == sorted([
        ("ROOTCA", "PRESENT", "ACTIVE", pod.root_serial), ("default", "", "ACTIVE", stale_serial),
        ("default", "PRESENT", "", pod.default_serial)])


def test_unreachable_side_is_exit_2(pod: Pod) -> None:
    closed = free_port()
    done = secrets_cli("--admin-port", str(closed))
    assert done.returncode == 2
    assert f"cannot reach Envoy's admin API at http://localhost:{closed}" in done.stderr
    done = secrets_cli("--diff", "--status-port", str(closed))
    assert done.returncode == 2
    assert "the agent's status server" in done.stderr

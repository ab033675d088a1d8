"""Bad start-up configuration through the installed `pilot-agent proxy`: a non-zero exit with one line naming it.

Each case is a file, field or variable upstream's agent refuses (or that would make
Envoy die on its command line); the agent must stop before starting anything, with
`Error: <what> <value>` and no traceback.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from launchers import PILOT_AGENT, agent_environment, pilot_agent_cli
from needs import need_file

CASES: dict[str, tuple[dict[str, object], dict[str, str], str]] = {
    # name: (ProxyConfig, other variables, what the error line must say)
    "drain_duration_beyond_go": ({"drainDuration": "999999999999h"}, {},
                                 "field drainDuration: duration '999999999999h' is out of range"),
    "drain_duration_beyond_envoy": ({"drainDuration": "2000000h"}, {},
                                    "invalid drainDuration: 7200000000s is more than Envoy's --drain-time-s"),
    "drain_duration_fraction": ({"drainDuration": "1.5s"}, {}, "drain time only supports durations to seconds"),
    "negative_concurrency": ({"concurrency": -3}, {}, "invalid concurrency: -3 is negative"),
    "metadata_number": ({"proxyMetadata": {"A": 1}}, {}, "field proxyMetadata.A: expected a string, got 1"),
    "status_port_zero": ({"statusPort": 0}, {}, "invalid statusPort: port number 0 must be in the range 1..65535"),
    "discovery_without_port": ({"discoveryAddress": "istiod"}, {},
                               "invalid discoveryAddress 'istiod': unable to split 'istiod': missing port"),
    "zipkin_bad_host": ({"tracing": {"zipkin": {"address": "Not_A_Host:9411"}}}, {},
                        "invalid tracing.zipkin: 'Not_A_Host' is not a valid hostname or an IP address"),
    "other_sds_socket_absent": ({}, {"WORKLOAD_IDENTITY_SOCKET_FILE": "spire.sock"},
                                "WORKLOAD_IDENTITY_SOCKET_FILE='spire.sock': no SDS server answers"),
    "secret_ttl_beyond_go": ({}, {"SECRET_TTL": "999999999999h"}, "SECRET_TTL"),
}


def assert_one_line_error(done: subprocess.CompletedProcess[str], expected: str) -> None:
    assert done.returncode != 0
    stderr = done.stderr
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and expected in errors[0], stderr


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_configuration_stops_the_start_with_one_line(tmp_path: Path, case: str) -> None:
    need_file(PILOT_AGENT)
    proxy_config, variables, expected = CASES[case]
    environment = agent_environment(discovery="localhost:1")
    environment.update(variables)
    layer = json.loads(environment.get("PROXY_CONFIG", "{}"))
    layer.update(proxy_config)
    environment["PROXY_CONFIG"] = json.dumps(layer)
    assert_one_line_error(pilot_agent_cli("proxy", "sidecar", cwd=tmp_path, env=environment, timeout=30), expected)


def test_a_mesh_config_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    need_file(PILOT_AGENT)
    mesh = tmp_path / "etc/istio/config/mesh"
    mesh.parent.mkdir(parents=True)
    mesh.write_bytes(b"defaultConfig:\n  serviceCluster: caf\xe9\n")
    done = pilot_agent_cli("proxy", "sidecar", cwd=tmp_path, env=agent_environment(discovery="localhost:1"),
                           timeout=30)
    assert_one_line_error(done, f"mesh config {mesh} line 2: not UTF-8 text (byte 0xe9")

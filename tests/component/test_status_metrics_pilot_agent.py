"""The merged metrics through a real `pilot-agent proxy` process (proxyless: no Envoy, free ports).

Checks the wiring: one registry for the agent's metrics, the DNS proxy's and the process
collector; the app named by ISTIO_PROMETHEUS_ANNOTATIONS merged after them; a reserved port
there stops the agent at start with the field named.
"""

from __future__ import annotations

import json
from pathlib import Path

from fixtures import AgentStarter
from launchers import agent_environment, pilot_agent_cli
from needs import need_file
from support import PILOT_AGENT, free_port, scrape_metrics
from test_status_metrics_peers import (
    PROMETHEUS_ACCEPT,
    assert_promtool_parses,
    names,
    parse,
    prometheus_client_app,
)


def environment(status_port: int, annotations: str) -> dict[str, str]:
    return agent_environment(proxy_config={"statusPort": status_port, "discoveryAddress": "127.0.0.1:1"},
                             DISABLE_ENVOY="true", ISTIO_META_DNS_CAPTURE="true",
                             DNS_PROXY_ADDR=f"127.0.0.1:{free_port()}", ISTIO_PROMETHEUS_ANNOTATIONS=annotations)


def test_agent_serves_its_dns_process_and_app_metrics(tmp_path: Path, start_agent: AgentStarter) -> None:
    status_port = free_port()
    with prometheus_client_app() as app_port:
        annotations = json.dumps({"scrape": "true", "port": str(app_port), "path": "/metrics"})
        agent = start_agent(tmp_path, environment(status_port, annotations))
        agent.wait_answering(status_port, "/stats/prometheus")
        ctype, body = scrape_metrics(status_port, PROMETHEUS_ACCEPT)
        assert_promtool_parses(body)
        got = names(parse(body, ctype))  # OpenMetrics: the app speaks it, strict parser
        assert {"istio_agent_scrapes_total", "istio_agent_dns_requests_total",
                "istio_agent_process_resident_memory_bytes", "istio_agent_num_outgoing_requests",
                "app_requests_total"} <= got
        assert not any(name.startswith("envoy_") for name in got)  # no Envoy: nothing to merge


def test_reserved_port_in_the_annotations_stops_the_agent(tmp_path: Path) -> None:
    need_file(PILOT_AGENT)
    done = pilot_agent_cli("proxy", "sidecar", cwd=tmp_path,
                           env=environment(free_port(), '{"scrape": "true", "port": "15000"}'))
    assert done.returncode != 0
    assert "ISTIO_PROMETHEUS_ANNOTATIONS: port: port 15000 is reserved for Istio (Envoy admin)" in done.stderr

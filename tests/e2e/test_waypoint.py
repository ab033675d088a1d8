"""`pilot-agent proxy waypoint`, as Istio's waypoint template starts it, with istiod-local and the real Envoy.

The waypoint gets the waypoint bootstrap (node id `waypoint~...`, delta xDS), no
capture and no app probes; istiod-local serves it the mesh's clusters and no
listeners. It turns ready through Envoy's 15021 listener and drains on SIGTERM.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from fixtures import AgentStarter
from launchers import IstiodLocal, agent_environment, pod_files
from sidecar_harness import active_listener_names, config_dump, dump_section, stats

WAYPOINT_ARGS = ("proxy", "waypoint", "--domain", "default.svc.cluster.local")


def test_waypoint_starts_with_its_bootstrap_and_turns_ready(tmp_path: Path, istiod: IstiodLocal,
                                                           start_agent: AgentStarter) -> None:
    pod = pod_files(istiod.state_dir, tmp_path / "pod", pod="waypoint-7d9f", service_account="waypoint")
    environment = agent_environment(pod="waypoint-7d9f", service_account="waypoint",
                                    discovery=istiod.secure_address,
                                    proxy_config={"terminationDrainDuration": "1s"})
    agent = start_agent(pod, environment, args=WAYPOINT_ARGS)
    agent.wait_ready(timeout=60)

    bootstrap = json.loads((pod / "etc/istio/proxy/envoy-rev.json").read_text())
    assert bootstrap["node"]["id"] == "waypoint~127.0.0.1~waypoint-7d9f.default~default.svc.cluster.local"
    assert bootstrap["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"
    # Upstream's waypoint bootstrap asks for istio-proxy's metadata_discovery; this stock Envoy lacks it.
    assert [e["name"] for e in bootstrap["bootstrap_extensions"]] == ["envoy.bootstrap.internal_listener"]
    assert "lacks istio-proxy's istio.workload.BootstrapExtension" in agent.output()
    dump = config_dump()
    assert active_listener_names(dump) == set(), "istiod-local serves a waypoint no listeners"
    active = dump_section(dump, "ClustersConfigDump").get("dynamic_active_clusters", [])
    clusters = {item["cluster"]["name"] for item in active}
    assert any(name.startswith("outbound|") for name in clusters), clusters
    assert stats()["listener_manager.lds.update_success"] >= 1

    agent.signal(signal.SIGTERM)
    assert agent.wait_exit(30) == 0, agent.output()

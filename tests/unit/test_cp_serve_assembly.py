"""`istiod-local serve`'s assembly in-process: which components, in which order and wired how; run on the lifecycle
with stand-ins, SIGTERM stops them in reverse (logged as istiod-local logs it), a failed start stops what started."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import pytest
from fakes import RecordingPart as Part

from istio_agent.lifecycle import Component, Lifecycle, component_name
from istiod_local.controlplane.assembly import PROGRAM, ServeAssembly, ServeOptions, run_until_signal
from istiod_local.controlplane.kubeapi.server import KubeApiOptions
from istiod_local.controlplane.server import ControlPlaneOptions

REGISTRY = """\
services:
- {name: echo, namespace: default, ports: [{port: 80, name: http}]}
workloads:
- {name: echo-1, namespace: default, serviceAccount: echo, ip: 10.1.0.5, labels: {app: echo}}
"""


def plane_options(tmp_path: Path) -> ControlPlaneOptions:
    return ControlPlaneOptions(tmp_path / "state", "127.0.0.1:0", "127.0.0.1:0")


def test_every_server_in_dependency_order_and_wired_to_the_registry(tmp_path: Path) -> None:
    registry = tmp_path / "mesh.yaml"
    registry.write_text(REGISTRY)
    assembly = ServeAssembly(ServeOptions(plane_options(tmp_path), str(registry),
                                          KubeApiOptions("127.0.0.1:0", "node-1"), monitoring_addr="127.0.0.1:0"))
    assert [component_name(c) for c in assembly.components()] == [
        "CA and xDS gRPC", "monitoring", "Kubernetes API", "registry watcher"]
    assert assembly.api is not None and assembly.xds is not None and assembly.monitoring is not None
    # The API serves the registry's pods from the start, and the monitoring port shows that ADS server.
    assert assembly.api.store.get("pods", "default", "echo-1")["spec"]["serviceAccountName"] == "echo"
    assert assembly.monitoring.server.monitor is assembly.xds.ads.monitor


def test_without_registry_api_or_monitoring_only_the_grpc_servers_run(tmp_path: Path) -> None:
    assembly = ServeAssembly(ServeOptions(plane_options(tmp_path)))
    assert [component_name(c) for c in assembly.components()] == ["CA and xDS gRPC"]


def test_a_broken_registry_stops_serve_before_anything_listens(tmp_path: Path) -> None:
    registry = tmp_path / "mesh.yaml"
    registry.write_text("services: [\n")
    with pytest.raises(ValueError, match=r"mesh\.yaml"):
        ServeAssembly(ServeOptions(plane_options(tmp_path), str(registry)))


def parts(log: list[str], fail: str = "") -> list[Component]:
    names = ["CA and xDS gRPC", "monitoring", "Kubernetes API", "registry watcher"]
    return [Part(n, log, OSError(f"{n}: address in use") if n == fail else None) for n in names]


async def test_sigterm_stops_every_server_in_reverse(caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    lifecycle = Lifecycle(parts(log), name=PROGRAM, logger=logging.getLogger("istiod_local.controlplane"))
    with caplog.at_level(logging.INFO, "istiod_local.controlplane"):
        run = asyncio.create_task(run_until_signal(lifecycle))
        while len(lifecycle.started) < 4:
            await asyncio.sleep(0)
        # The handler must be there: SIGTERM's default action would end the test run.
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        signal.raise_signal(signal.SIGTERM)
        assert await asyncio.wait_for(run, 5) == 0
    assert log == ["start CA and xDS gRPC", "start monitoring", "start Kubernetes API", "start registry watcher",
                   "stop registry watcher", "stop Kubernetes API", "stop monitoring", "stop CA and xDS gRPC"]
    messages = [r.getMessage() for r in caplog.records]
    assert messages.index("signal received, shutting down") < messages.index("istiod-local stopping")
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "the handler goes with the run"


async def test_sigint_too() -> None:
    log: list[str] = []
    lifecycle = Lifecycle(parts(log), name=PROGRAM)
    run = asyncio.create_task(run_until_signal(lifecycle))
    while len(lifecycle.started) < 4:
        await asyncio.sleep(0)
    assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    signal.raise_signal(signal.SIGINT)
    assert await asyncio.wait_for(run, 5) == 0
    assert log[-1] == "stop CA and xDS gRPC"


async def test_a_failed_start_stops_what_started_and_raises() -> None:
    log: list[str] = []
    with pytest.raises(OSError, match="Kubernetes API: address in use"):
        await run_until_signal(Lifecycle(parts(log, fail="Kubernetes API"), name=PROGRAM))
    assert log == ["start CA and xDS gRPC", "start monitoring", "start Kubernetes API", "stop monitoring",
                   "stop CA and xDS gRPC"]

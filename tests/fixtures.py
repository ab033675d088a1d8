"""The fixtures built on `launchers.py`, defined once and exposed by each tier's conftest.py.

- `registry`: this test's istiod-local registry file (the echo service and
  workload until the test writes its own, or a module overrides the fixture
  with its own content, or with None for istiod-local's CA alone);
- `istiod`: `istiod-local serve` on free loopback ports with its state in the
  test's tmp directory, serving `registry`; stopped after the test, whatever
  the test did to it (stopped it, restarted it);
- `start_agent`: starts `pilot-agent` processes (`PilotAgent` arguments) and
  kills each, with its Envoy, after the test. An Envoy sidecar on the host
  network first takes the host's sidecar ports lock, held until the test ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from launchers import (
    IstiodLocal,
    PilotAgent,
    RegistryFile,
    echo_registry,
    host_sidecar_ports,
    wait_sidecar_ports_free,
)
from needs import need_file
from support import ENVOY, ISTIOD_LOCAL, PILOT_AGENT

AgentStarter = Callable[..., PilotAgent]


@pytest.fixture
def registry(tmp_path: Path) -> RegistryFile:
    return RegistryFile(tmp_path / "mesh.yaml", echo_registry())


@pytest.fixture
def istiod(tmp_path: Path, registry: RegistryFile | None) -> Iterator[IstiodLocal]:
    need_file(ISTIOD_LOCAL)
    server = IstiodLocal(tmp_path / "istiod-state", registry=registry)
    with server:
        yield server


@pytest.fixture
def start_agent() -> Iterator[AgentStarter]:
    need_file(PILOT_AGENT)
    started: list[PilotAgent] = []
    with contextlib.ExitStack() as host_ports:
        holding = False

        def start(pod_dir: Path, env: Mapping[str, str], **options: Any) -> PilotAgent:
            nonlocal holding
            agent = PilotAgent(pod_dir, env, **options)
            if agent.runs_envoy:
                need_file(ENVOY)
            if agent.uses_host_sidecar_ports:
                if not holding:
                    host_ports.enter_context(host_sidecar_ports())
                    holding = True
                else:
                    wait_sidecar_ports_free()  # a previous agent of this test may still be letting go
            started.append(agent)
            return agent.start()

        try:
            yield start
        finally:
            for agent in started:
                agent.kill()

"""The agent: composes the components that run beside one proxy.

Each component is a plain object with `async start()` / `async stop()`. The
agent starts them in dependency order, waits for a stop signal (SIGTERM,
SIGINT, or a component that ends), and stops them in reverse order. There is
no global state: two agents can run in one process (tests do this).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from istio_agent.config import env
from istio_agent.config.errors import ConfigError
from istio_agent.config.loader import AgentConfig, load_agent_config

log = logging.getLogger(__name__)


class Component(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class AgentFlags:
    """`pilot-agent proxy` command-line flags, as upstream names them."""

    proxy_type: str = "sidecar"
    domain: str = ""
    mesh_config: str = "./etc/istio/config/mesh"
    service_cluster: str = "istio-proxy"
    proxy_log_level: str = "warning,misc:error"
    proxy_component_log_level: str = ""
    concurrency: int = 0
    template_file: str = ""
    outlier_log_path: str = ""


class Agent:
    """One agent: builds its components from the config and runs them until told to stop."""

    def __init__(self, config: AgentConfig, flags: AgentFlags) -> None:
        self.config = config
        self.flags = flags
        self.components: list[Component] = []
        self._stopping = asyncio.Event()
        self.exit_code = 0

    def build(self) -> None:
        from istio_agent.security.identity import WorkloadIdentity
        from istio_agent.security.options import SecurityOptions

        environment = self.config.environment
        disable_envoy = environment.get(env.DISABLE_ENVOY)
        security = SecurityOptions.from_config(self.config, run_sds_server=not disable_envoy)
        self.identity = WorkloadIdentity(security)
        self.components.append(self.identity)
        if not disable_envoy:
            log.warning(
                "Envoy lifecycle is not implemented yet: serving SDS on %s for an Envoy started elsewhere",
                security.sds_socket_path,
            )

    def request_stop(self, exit_code: int = 0) -> None:
        self.exit_code = self.exit_code or exit_code
        self._stopping.set()

    async def run(self) -> int:
        self.build()
        started: list[Component] = []
        try:
            for component in self.components:
                await component.start()
                started.append(component)
            log.info("agent started: node %s", self.config.identity.id)
            await self._stopping.wait()
        finally:
            for component in reversed(started):
                try:
                    await component.stop()
                except Exception:
                    log.exception("stopping %s failed", type(component).__name__)
        return self.exit_code


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(flags: AgentFlags, workdir: Path | None = None) -> int:
    """Entry point of `pilot-agent proxy`: returns the process exit code."""
    try:
        config = load_agent_config(
            env.Environment(),
            workdir or Path.cwd(),
            proxy_type=flags.proxy_type,
            domain=flags.domain or None,
            mesh_config_path=flags.mesh_config,
            concurrency=flags.concurrency,
            service_cluster=flags.service_cluster,
        )
    except ConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    loop = _new_event_loop()
    asyncio.set_event_loop(loop)
    agent = Agent(config, flags)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.request_stop)
    try:
        return loop.run_until_complete(agent.run())
    except ConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    finally:
        loop.close()

"""How one Envoy is started, supervised and drained, resolved once at agent start.

The options resolver (`agent/options.py`) builds `EnvoyOptions` from the
environment, flags and ProxyConfig; `EnvoySupervisor` (`envoy/supervisor.py`)
runs it. Light on purpose: the resolver imports this before it knows whether
there is an Envoy at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from istio_agent.envoy.argv import EnvoyLaunch
from istio_agent.envoy.bootstrap.options import BootstrapOptions
from istio_agent.envoy.drain import DrainPolicy


@dataclass(frozen=True)
class BootstrapSource:
    """Where the bootstrap comes from: the built-in rendering or a custom template, and what is merged over it."""

    istio_bootstrap: str = ""  # ISTIO_BOOTSTRAP: a custom template
    template_file: str = ""  # --templateFile
    override_path: str = ""  # ISTIO_BOOTSTRAP_OVERRIDE: a fragment Envoy merges over the file
    host_ip: str = ""  # HOST_IP, for $(HOST_IP) in the override


@dataclass(frozen=True)
class EnvoyOptions:
    """One Envoy: its bootstrap, its command line (the config file filled in at start), its user and its drain.

    `launch.config_file` and `launch.config_override_json` are left empty here: the
    supervisor fills them in when it writes the bootstrap and reads the override.
    """

    bootstrap: BootstrapOptions
    source: BootstrapSource
    launch: EnvoyLaunch
    workdir: Path
    binary_path: str = "/usr/local/bin/envoy"
    run_as: tuple[int, int] | None = None  # (uid, gid) when the agent runs as root and Envoy must not
    admin_port: int = 15000
    drain: DrainPolicy = field(default_factory=lambda: DrainPolicy(5.0, False, 5.0))
    drain_inbound_only: bool = True  # sidecars drain only their inbound listeners, as upstream
    stop_grace: float = 5.0  # SIGTERM, then SIGKILL after this long
    extra_env: tuple[tuple[str, str], ...] = ()  # added to Envoy's environment (upstream: FIPS gRPC ciphers)

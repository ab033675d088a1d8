"""Envoy's command line, exactly as pilot-agent builds it, and where the binary is.

`envoy_argv(EnvoyLaunch(...))` is pure; `read_bootstrap_override()` and
`resolve_envoy_binary()` are the small I/O edges (a file read, a stat).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from istio_agent.config.errors import ConfigError

log = logging.getLogger(__name__)


def split_component_log(level: str) -> tuple[str, list[str]]:
    """`info,misc:error` -> (`info`, [`misc:error`]); the last plain level wins, bad parts are dropped."""
    log_level = ""
    components: list[str] = []
    for part in level.split(","):
        pieces = part.split(":")
        if len(pieces) == 1:
            log_level = pieces[0]
        elif len(pieces) == 2:
            components.append(part)
        else:
            log.warning("dropping invalid log level %r", part)
    return log_level, components


def all_ipv6(ips: Sequence[str]) -> bool:
    """True when every address is IPv6 (an empty list counts, as upstream's helper does)."""
    for ip in ips:
        try:
            if ipaddress.ip_address(ip).version != 6:
                return False
        except ValueError:
            return False
    return True


@dataclass(frozen=True)
class EnvoyLaunch:
    """What Envoy's command line is made of: the bootstrap file and pilot-agent's flags."""

    config_file: str
    drain_duration: float = 45.0
    node_ips: tuple[str, ...] = ()
    log_level: str = "warning"
    component_log_level: str = ""
    concurrency: int | None = None
    skip_deprecated_logs: bool = False
    enable_core_dump: bool = False
    config_override_json: str = ""
    file_flush_interval_ms: int = 1000  # ProxyConfig fileFlushInterval (upstream's default 1 s)
    file_flush_min_size_kb: int = 0  # ProxyConfig fileFlushMinSizeKb (0: Envoy's default)


def envoy_argv(launch: EnvoyLaunch) -> list[str]:
    """Envoy's arguments (without the binary), in upstream's order.

    `--proxyLogLevel` may carry component levels (`info,misc:error`); those win over
    `--proxyComponentLogLevel`. A bootstrap override is passed as `--config-yaml`, which
    Envoy merges over the file (proto merge: messages merge, lists append).
    """
    args = [
        "-c", launch.config_file,
        "--drain-time-s", str(int(launch.drain_duration)),
        "--drain-strategy", "immediate",
        "--local-address-ip-version", "v6" if launch.node_ips and all_ipv6(launch.node_ips) else "v4",
        "--file-flush-interval-msec", str(launch.file_flush_interval_ms),
        "--disable-hot-restart",
        "--allow-unknown-static-fields",
    ]
    if launch.file_flush_min_size_kb > 0:
        args += ["--file-flush-min-size-kb", str(launch.file_flush_min_size_kb)]
    level, components = split_component_log(launch.log_level)
    if level:
        args += ["-l", level]
    if components:
        args += ["--component-log-level", ",".join(components)]
    elif launch.component_log_level:
        args += ["--component-log-level", launch.component_log_level]
    if launch.skip_deprecated_logs:
        args.append("--skip-deprecated-logs")
    if launch.enable_core_dump:
        args.append("--enable-core-dump")
    if launch.config_override_json:
        args += ["--config-yaml", launch.config_override_json]
    if launch.concurrency and launch.concurrency > 0:
        args += ["--concurrency", str(launch.concurrency)]
    return args


def override_to_json(text: str, host_ip: str = "") -> str:
    """An ISTIO_BOOTSTRAP_OVERRIDE file's content (YAML or JSON) as a JSON string.

    `$(HOST_IP)` is replaced by HOST_IP (bracketed when IPv6), as Kubernetes would have.
    """
    if ":" in host_ip:
        text = text.replace("[$(HOST_IP)]", f"[{host_ip}]")
        host_ip = f"[{host_ip}]"
    text = text.replace("$(HOST_IP)", host_ip)
    import yaml  # only with ISTIO_BOOTSTRAP_OVERRIDE: PyYAML is ~1 MB the agent otherwise never loads

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"bootstrap override: not valid YAML or JSON: {exc}") from None
    return json.dumps(value if value is not None else {}, separators=(",", ":"))


def read_bootstrap_override(path: str, host_ip: str = "") -> str:
    """Read the override file named by ISTIO_BOOTSTRAP_OVERRIDE; "" (and a warning) when unreadable,
    as upstream starts Envoy without it rather than failing."""
    if not path:
        return ""
    try:
        return override_to_json(Path(path).read_text(), host_ip)
    except (OSError, ConfigError) as exc:
        log.warning("failed to read bootstrap override %s: %s", path, exc)
        return ""


def resolve_envoy_binary(binary_path: str) -> Path:
    """ProxyConfig `binaryPath` when that file exists, else the `envoy` installed beside this Python."""
    configured = Path(binary_path) if binary_path else None
    if configured is not None and configured.is_file():
        return configured
    beside = Path(sys.executable).parent / "envoy"
    if beside.is_file():
        return beside
    raise ConfigError(f"no Envoy binary: {binary_path or '(binaryPath unset)'} does not exist and none at {beside}")


def envoy_command(binary_path: str, launch: EnvoyLaunch) -> list[str]:
    """The full command: resolved binary, then `envoy_argv`."""
    return [str(resolve_envoy_binary(binary_path)), *envoy_argv(launch)]

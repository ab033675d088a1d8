"""`pilot-agent proxy`'s flags and the root logging flags, declared once, without click.

Two parsers read this table: click's (`cli/pilot_agent.py` builds its options
from it: help, errors, every unusual form) and the light one
(`cli/proxy_argv.py`), which takes the command lines Istio's injection templates
write without importing click. click and what it pulls in (uuid, platform,
gettext) cost every running agent ~1.2 MB of anonymous memory and ~20 ms of
start-up, and the agent never needs them after its flags are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Flag:
    """One long flag: `--name`, stored under `dest`. A bool flag takes no value (`--name` sets it); a
    `multiple` flag collects every occurrence, in order."""

    name: str
    dest: str
    default: Any
    help: str
    kind: type = str
    multiple: bool = False

    @property
    def takes_value(self) -> bool:
        return self.kind is not bool


# Upstream's root logging flags, accepted on the root command and on every subcommand.
LOG_FLAGS: tuple[Flag, ...] = (
    Flag("log_output_level", "log_output_level", "default:info",
         "Per-scope minimum level: <scope>:<level>,... (debug, info, warn, error, fatal, none)."),
    Flag("log_as_json", "log_as_json", False, "Log as JSON lines.", kind=bool),
    Flag("log_target", "log_target", ("stdout",), "Where logs go: stdout, stderr or a file path (repeatable).",
         multiple=True),
    Flag("log_caller", "log_caller", "", "Scopes whose lines carry the caller."),
    Flag("log_stacktrace_level", "log_stacktrace_level", "default:none",
         "Per-scope level at which lines carry the stack: <scope>:<level>,..."),
)

PROXY_TYPE_DEFAULT = "sidecar"

# `pilot-agent proxy [sidecar|router]`'s own flags (upstream's names).
PROXY_FLAGS: tuple[Flag, ...] = (
    Flag("domain", "domain", "", "DNS domain suffix; default <POD_NAMESPACE>.svc.cluster.local."),
    Flag("meshConfig", "mesh_config", "./etc/istio/config/mesh", "Mesh configuration file."),
    Flag("serviceCluster", "service_cluster", "istio-proxy", "Service cluster (deprecated)."),
    Flag("proxyLogLevel", "proxy_log_level", "warning,misc:error", "Envoy log level[,comp:lvl]."),
    Flag("proxyComponentLogLevel", "proxy_component_log_level", "", "Envoy component levels."),
    Flag("concurrency", "concurrency", 0, "Envoy worker threads (0: from ProxyConfig).", kind=int),
    Flag("templateFile", "template_file", "", "Bootstrap template file."),
    Flag("outlierLogPath", "outlier_log_path", "", "Outlier detection log path."),
    Flag("stsPort", "sts_port", 0, "Security token service port (0: off).", kind=int),
    Flag("tokenManagerPlugin", "token_manager_plugin", "GoogleTokenExchange", "Token plugin."),
    Flag("profiling", "profiling", "true", "Enable profiling endpoints."),
)


def defaults(flags: tuple[Flag, ...]) -> dict[str, Any]:
    """Every flag's default, by `dest`."""
    return {flag.dest: flag.default for flag in flags}

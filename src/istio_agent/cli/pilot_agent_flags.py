"""`pilot-agent`'s table: every command's arguments and flags, declared once (the shape is
`config/settings.py`'s); its environment variables are the agent's registry (`config/env.py`).

Two parsers read it: click's (`cli/pilot_agent.py` and `cli/secrets.py` build
every command's options from it through `config/clickflags.py`: help, errors,
every unusual form) and the light one (`cli/proxy_argv.py`), which takes the
command lines Istio's injection templates write without importing click.
click and what it pulls in (uuid, platform, gettext) cost every running agent
~1.2 MB of anonymous memory and ~20 ms of start-up, and the agent never needs
them after its flags are read; so this module imports nothing but
`config.settings`. `docs/reference/pilot-agent.md` is generated from it.
"""

from __future__ import annotations

from istio_agent.config.settings import (
    ACCEPTED,
    PARTIAL,
    Argument,
    Command,
    Flag,
    Program,
    defaults,
    floating,
    go_bool,
    integer,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["LOG_FLAGS", "PILOT_AGENT", "PROXY", "PROXY_FLAGS", "PROXY_TYPE_DEFAULT", "Flag", "defaults"]

# Upstream's root logging flags, accepted on the root command and on every subcommand of upstream's.
LOG_FLAGS: tuple[Flag[Any], ...] = (
    Flag("log_output_level", "default:info",
         "Per-scope minimum level: <scope>:<level>,... (debug, info, warn, error, fatal, none)."),
    Flag("log_as_json", False, "Log as JSON lines.", go_bool, "bool"),
    Flag("log_target", ("stdout",), "Where logs go: stdout, stderr or a file path (repeatable).", multiple=True),
    Flag("log_caller", "", "Scopes whose lines carry the caller."),
    Flag("log_stacktrace_level", "default:none", "Per-scope level at which lines carry the stack: <scope>:<level>,..."),
)

PROXY_TYPE = Argument("proxy_type", "sidecar", "sidecar or router (gateways).", required=False)
PROXY_TYPE_DEFAULT = PROXY_TYPE.default

# `pilot-agent proxy [sidecar|router]`'s own flags (upstream's names).
PROXY_FLAGS: tuple[Flag[Any], ...] = (
    Flag("domain", "", "DNS domain suffix; default <POD_NAMESPACE>.svc.cluster.local."),
    Flag("meshConfig", "./etc/istio/config/mesh", "Mesh configuration file.", dest="mesh_config"),
    Flag("serviceCluster", "istio-proxy", "Service cluster (deprecated).", dest="service_cluster"),
    Flag("proxyLogLevel", "warning", "Envoy's log level (trace, debug, info, warning, error, critical, off), "
         "optionally with component levels: info,misc:error,upstream:debug.", dest="proxy_log_level"),
    Flag("proxyComponentLogLevel", "", "Envoy's component log levels (deprecated: put them in --proxyLogLevel), "
         "used when --proxyLogLevel names none.", dest="proxy_component_log_level"),
    Flag("concurrency", 0, "Envoy worker threads (0: from ProxyConfig).", integer, "int"),
    Flag("templateFile", "", "Bootstrap template file.", dest="template_file"),
    Flag("outlierLogPath", "", "Outlier detection log path.", dest="outlier_log_path"),
    Flag("stsPort", 0, "Security token service port (0: off).", integer, "int", dest="sts_port", support=PARTIAL,
         note="sent as STS_PORT node metadata (custom bootstrap templates read it); no token service listens"),
    Flag("tokenManagerPlugin", "", "Token provider plugin of the security token service.",
         dest="token_manager_plugin", support=ACCEPTED, note="no security token service is served"),
    Flag("profiling", True, "Serve profiles on the status port's /debug/pprof/ (localhost only).", go_bool, "bool",
         takes_value=True, support=PARTIAL,
         note="Python's, not Go's: profile (a sampling profile of every thread, as collapsed stacks), goroutine "
              "(every thread's and asyncio task's stack) and cmdline; symbol, trace and Go's runtime profiles "
              "answer 501"),
)

ROOT = Command("", "Istio Pilot agent: runs beside Envoy (or a proxyless gRPC app) and bootstraps it.", LOG_FLAGS)
PROXY = Command("proxy", "Run the agent: identity (SDS), XDS proxy, DNS, status server, and Envoy.",
                (*PROXY_FLAGS, *LOG_FLAGS), (PROXY_TYPE,))
WAIT = Command("wait", "Wait until the proxy is ready (the injector's postStart hook).", (
    Flag("url", "http://localhost:15021/healthz/ready", "URL to poll until it answers 200."),
    Flag("timeoutSeconds", 60, "Give up after this long.", integer, "int", dest="timeout_seconds"),
    Flag("periodMillis", 500, "Time between attempts.", integer, "int", dest="period_millis"),
    Flag("requestTimeoutMillis", 500, "Per-attempt timeout.", integer, "int", dest="request_timeout_millis"),
    *LOG_FLAGS,
))
REQUEST = Command(
    "request", "Send an HTTP request to a local debug port (Envoy admin or the agent) and print the body.",
    (Flag("debug-port", 15000, "Local port to send the request to.", integer, "int"), *LOG_FLAGS),
    (Argument("method", "", "The HTTP method (GET, POST, ...)."),
     Argument("path", "", "The path, with or without its leading slash."),
     Argument("body", "", "The request body.", required=False)),
)
VERSION = Command("version", "Prints out build version information", (
    Flag("short", False, "Use --short=false to generate full version information", go_bool, "bool", short="s",
         takes_value=True),
    Flag("output", "", "One of 'yaml' or 'json'.", short="o"),
    *LOG_FLAGS,
))
SECRETS = Command(
    "secrets", "Show the secrets Envoy holds (as `istioctl proxy-config secret`), or diff them with the agent's.",
    (Flag("output", "short", "Output format.", short="o", choices=("short", "json"), upstream=False),
     Flag("diff", False, "Compare Envoy's secrets with the agent's cache.", go_bool, "bool", upstream=False),
     Flag("admin-port", 15000, "Envoy's admin port.", integer, "int", upstream=False),
     Flag("status-port", 15020, "The agent's status port.", integer, "int", upstream=False),
     Flag("timeout", 5.0, "Seconds to wait for each side.", floating, "float", upstream=False)),
)
SHELLS = ("bash", "zsh", "fish", "powershell")
COMPLETION = Command(
    "completion", "Print the shell completion script of pilot-agent for SHELL (click's: bash, zsh, fish).",
    (Flag("no-descriptions", False, "Leave completion descriptions out.", go_bool, "bool", support=ACCEPTED,
          note="click's scripts take the descriptions the shell shows"), *LOG_FLAGS),
    (Argument("shell", "", "bash, zsh or fish; powershell is refused (click has no PowerShell completion)."),),
)
COLLATERAL = Command(
    "collateral", "Write pilot-agent's documentation and completion files (one file per command for Markdown, "
    "YAML and man pages) into --outputDir.", (
        Flag("all", False, "Every kind of file below.", go_bool, "bool"),
        Flag("bash", False, "The bash completion script (pilot-agent.bash).", go_bool, "bool"),
        Flag("zsh", False, "The zsh completion script (_pilot-agent).", go_bool, "bool"),
        Flag("markdown", False, "Markdown, one page per command (pilot-agent_proxy.md, ...).", go_bool, "bool"),
        Flag("yaml", False, "YAML, one document per command (pilot-agent_proxy.yaml, ...).", go_bool, "bool"),
        Flag("man", False, "Man pages, one per command (pilot-agent-proxy.1, ...).", go_bool, "bool",
             support=PARTIAL, note="named `<command>.1`, where upstream's cobra names them with its section "
                                   "title (`pilot-agent-proxy.pilot-agent CLI`)"),
        Flag("html_fragment_with_front_matter", False,
             "One HTML fragment with Hugo front matter: every command's flags and the environment variables "
             "(pilot-agent.html).", go_bool, "bool"),
        Flag("outputDir", ".", "Directory where the files are written.", short="o", dest="output_dir"),
        *LOG_FLAGS,
    ))
ISTIO_IPTABLES = Command(
    "istio-iptables", "Set up iptables (or nftables) rules that redirect a pod's traffic through the Istio sidecar: "
    "[istio-iptables](istio-iptables.md) itself, with its flags and variables (Istio's istio-init container runs "
    "it so).")

PILOT_AGENT = Program(
    "pilot-agent",
    "The command Istio's injector puts into every istio-proxy container. Unknown flags are accepted and ignored "
    "(but by `secrets` and `istio-iptables`), as upstream does to keep old pod specs working. "
    "`pilot-agent istio-iptables` takes [istio-iptables](istio-iptables.md)' flags and variables; "
    "`pilot-agent secrets` is this project's own (not upstream).",
    (ROOT, PROXY, WAIT, REQUEST, VERSION, SECRETS, ISTIO_IPTABLES, COMPLETION, COLLATERAL),
    "src/istio_agent/cli/pilot_agent_flags.py",
    variables_page="../ENVIRONMENT.md",
)

"""`pilot-agent`: the command Istio's injector puts into every istio-proxy container.

Subcommands keep upstream's names and flags: `proxy`, `wait`, `request`,
`istio-iptables`, `version`. Unknown flags are accepted and ignored, as
upstream does to keep old pod specs working. Heavy modules are imported only
by the subcommand that needs them, so `wait` and `request` (run in lifecycle
hooks) start fast.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import click

from istio_agent.cli.logging_setup import configure_logging

LENIENT = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": ["-h", "--help"]}

# Subcommands that live in their own modules, loaded only when invoked.
LAZY_COMMANDS = {
    "istio-iptables": "istio_agent.cli.iptables:command",
    "secrets": "istio_agent.cli.secrets:command",
}


class PilotAgentGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS:
            module_name, attr = LAZY_COMMANDS[cmd_name].split(":")
            command = getattr(importlib.import_module(module_name), attr)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=PilotAgentGroup, context_settings=LENIENT)
def main() -> None:
    """Istio Pilot agent: runs beside Envoy (or a proxyless gRPC app) and bootstraps it."""


@main.command(context_settings=LENIENT)
@click.argument("proxy_type", required=False, default="sidecar")
@click.option("--domain", default="", help="DNS domain suffix; default <POD_NAMESPACE>.svc.cluster.local.")
@click.option("--meshConfig", "mesh_config", default="./etc/istio/config/mesh", help="Mesh configuration file.")
@click.option("--serviceCluster", "service_cluster", default="istio-proxy", help="Service cluster (deprecated).")
@click.option("--proxyLogLevel", "proxy_log_level", default="warning,misc:error", help="Envoy log level[,comp:lvl].")
@click.option("--proxyComponentLogLevel", "proxy_component_log_level", default="", help="Envoy component levels.")
@click.option("--concurrency", default=0, type=int, help="Envoy worker threads (0: from ProxyConfig).")
@click.option("--templateFile", "template_file", default="", help="Bootstrap template file.")
@click.option("--outlierLogPath", "outlier_log_path", default="", help="Outlier detection log path.")
@click.option("--stsPort", "sts_port", default=0, type=int, help="Security token service port (0: off).")
@click.option("--tokenManagerPlugin", "token_manager_plugin", default="GoogleTokenExchange", help="Token plugin.")
@click.option("--profiling", default="true", help="Enable profiling endpoints.")
@click.option("--log_output_level", "log_output_level", default="default:info", help="scope:level,...")
@click.option("--log_as_json", "log_as_json", is_flag=True, default=False, help="Log as JSON lines.")
@click.pass_context
def proxy(ctx: click.Context, proxy_type: str, **flags: Any) -> None:
    """Run the agent: identity (SDS), XDS proxy, DNS, status server, and Envoy."""
    configure_logging(flags["log_output_level"], flags["log_as_json"])
    from istio_agent.agent import run
    from istio_agent.config.options import AgentFlags

    if ctx.args:
        click.echo(f"ignoring unknown arguments: {' '.join(ctx.args)}", err=True)
    # Flags the agent uses go into AgentFlags by name; the rest (sts, profiling...) are accepted and unused.
    wanted = {f.name for f in dataclasses.fields(AgentFlags)}
    agent_flags = AgentFlags(proxy_type=proxy_type, **{k: v for k, v in flags.items() if k in wanted})
    sys.exit(run(agent_flags))


@main.command(context_settings=LENIENT)
@click.option("--url", default="http://localhost:15021/healthz/ready", help="URL to poll until it answers 200.")
@click.option("--timeoutSeconds", "timeout_seconds", default=60, type=int, help="Give up after this long.")
@click.option("--periodMillis", "period_millis", default=500, type=int, help="Time between attempts.")
@click.option("--requestTimeoutMillis", "request_timeout_millis", default=500, type=int, help="Per-attempt timeout.")
def wait(url: str, timeout_seconds: int, period_millis: int, request_timeout_millis: int) -> None:
    """Wait until the proxy is ready (the injector's postStart hook)."""
    click.echo(f"Waiting for Envoy proxy to be ready (timeout: {timeout_seconds} seconds)...")
    deadline = time.monotonic() + timeout_seconds
    last_error = "no attempt made"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=request_timeout_millis / 1000) as resp:
                if resp.status == 200:
                    click.echo("Envoy is ready!")
                    return
                last_error = f"HTTP status code {resp.status}"
        except urllib.error.HTTPError as exc:
            last_error = f"HTTP status code {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            last_error = str(getattr(exc, "reason", exc))
        if time.monotonic() + period_millis / 1000 > deadline:
            click.echo(f"Error: timeout waiting for Envoy proxy to become ready. Last error: {last_error}", err=True)
            sys.exit(1)
        time.sleep(period_millis / 1000)


ALLOWED_DEBUG_PORTS = (15000, 15020, 15021, 15004)


@main.command(context_settings=LENIENT)
@click.argument("method")
@click.argument("path")
@click.argument("body", required=False, default="")
@click.option("--debug-port", "debug_port", default=15000, type=int, help="Local port to send the request to.")
def request(method: str, path: str, body: str, debug_port: int) -> None:
    """Send an HTTP request to a local debug port (Envoy admin or the agent) and print the body."""
    if debug_port not in ALLOWED_DEBUG_PORTS:
        allowed = ", ".join(str(p) for p in ALLOWED_DEBUG_PORTS)
        click.echo(f"Error: debug port {debug_port} is not allowed; use one of {allowed}", err=True)
        sys.exit(1)
    url = f"http://localhost:{debug_port}/{path.lstrip('/')}"
    req = urllib.request.Request(url, data=body.encode() if body else None, method=method.upper())
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            sys.stdout.buffer.write(resp.read())
    except urllib.error.HTTPError as exc:
        sys.stdout.buffer.write(exc.read())
        click.echo(f"Error: {method.upper()} {url}: status {exc.code}", err=True)
        sys.exit(1)
    except (urllib.error.URLError, OSError) as exc:
        click.echo(f"Error: {method.upper()} {url}: {getattr(exc, 'reason', exc)}", err=True)
        sys.exit(1)


@main.command(context_settings=LENIENT)
@click.option("--short", "-s", is_flag=True, help="Print just the version number.")
@click.option("--output", "-o", type=click.Choice(["", "json", "yaml"]), default="", help="Output format.")
def version(short: bool, output: str) -> None:
    """Print the version."""
    from istio_agent.version import build_info

    info = build_info()
    if short:
        click.echo(info["Version"])
    elif output == "json":
        click.echo(json.dumps({"clientVersion": info}, indent=2))
    elif output == "yaml":
        click.echo("clientVersion:\n" + "".join(f"  {k}: {v}\n" for k, v in info.items()), nl=False)
    else:
        fields = ", ".join(f'{k}:"{v}"' for k, v in info.items())
        click.echo(f"version.BuildInfo{{{fields}}}")


if __name__ == "__main__":
    main()

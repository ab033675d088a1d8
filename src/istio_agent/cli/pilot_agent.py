"""`pilot-agent`: the command Istio's injector puts into every istio-proxy container.

Subcommands keep upstream's names and flags: `proxy`, `wait`, `request`,
`istio-iptables`, `version`, `completion`, `collateral`; each one's arguments, flags and help are
declared in the program's table (`pilot_agent_flags.py`) and built into click
options here. Unknown flags are accepted and ignored, as upstream does to keep
old pod specs working. Heavy modules are imported only by the subcommand that
needs them, so `wait` and `request` (run in lifecycle hooks) start fast.
"""

from __future__ import annotations

import importlib
import sys
import time
from typing import Any

import click

from istio_agent.cli.logging_setup import LogOptions, configure_logging
from istio_agent.cli.pilot_agent_flags import LOG_FLAGS, PROXY, REQUEST, ROOT, VERSION, WAIT
from istio_agent.cli.proxy_argv import merged_log_options
from istio_agent.cli.proxy_run import run_proxy
from istio_agent.config.clickflags import arguments, options

LENIENT = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": ["-h", "--help"]}

# Subcommands that live in their own modules, loaded only when invoked.
LAZY_COMMANDS = {
    "istio-iptables": "istio_agent.cli.iptables:command",
    "secrets": "istio_agent.cli.secrets:command",
    "completion": "istio_agent.cli.completion:command",
    "collateral": "istio_agent.cli.collateral:command",
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


def log_options(ctx: click.Context, flags: dict[str, Any]) -> LogOptions:
    """The root's log flags, overridden by what the subcommand was given explicitly."""
    root = dict(ctx.obj or {}) if isinstance(ctx.obj, dict) else {}
    explicit = [flag.dest for flag in LOG_FLAGS if flag.dest in flags
                and ctx.get_parameter_source(flag.dest) not in (None, click.core.ParameterSource.DEFAULT)]
    return merged_log_options(root, flags, explicit)


@click.group(cls=PilotAgentGroup, context_settings=LENIENT, help=ROOT.summary)
@options(ROOT.flags)
@click.pass_context
def main(ctx: click.Context, **flags: Any) -> None:
    ctx.obj = flags  # the root's logging flags, for the subcommand to merge
    configure_logging(log_options(ctx, flags))


@main.command(context_settings=LENIENT, help=PROXY.summary)
@arguments(PROXY.arguments)
@options(PROXY.flags)
@click.pass_context
def proxy(ctx: click.Context, proxy_type: str, **flags: Any) -> None:
    # Istio's own command lines never get here: `pilot_agent_entry` hands them to the same run_proxy.
    run_proxy(proxy_type, flags, log_options(ctx, flags), ctx.args)


@main.command(context_settings=LENIENT, help=WAIT.summary)
@options(WAIT.flags)
@click.pass_context
def wait(ctx: click.Context, url: str, timeout_seconds: int, period_millis: int, request_timeout_millis: int,
         **log: Any) -> None:
    import urllib.error  # here, not at the top: http.client and email cost every running agent ~1.3 MB
    import urllib.request

    configure_logging(log_options(ctx, log))
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


@main.command(context_settings=LENIENT, help=REQUEST.summary)
@arguments(REQUEST.arguments)
@options(REQUEST.flags)
@click.pass_context
def request(ctx: click.Context, method: str, path: str, body: str, debug_port: int, **log: Any) -> None:
    import urllib.error
    import urllib.request

    configure_logging(log_options(ctx, log))
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


@main.command(context_settings=LENIENT, help=VERSION.summary)
@options(VERSION.flags)
@click.pass_context
def version(ctx: click.Context, short: bool, output: str, **log: Any) -> None:
    """Upstream's output (`client version: version.BuildInfo{...}`, `-s`, `-o json|yaml`), as install-cni's."""
    configure_logging(log_options(ctx, log))
    from istio_agent.version import VersionOutputError, version_output

    try:
        click.echo(version_output(short, output), nl=False)
    except VersionOutputError as exc:
        failure = click.ClickException(str(exc))
        failure.exit_code = 255  # upstream's command exits -1 on an error
        raise failure from None


if __name__ == "__main__":
    main()

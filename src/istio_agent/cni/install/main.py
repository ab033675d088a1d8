"""`install-cni`: the Istio CNI node agent's command line (the edge: flags in, the node agent run).

Upstream's flags (each also read from its variable) and Istio's logging
flags, built from the program's table (`flags.py`); `main()` resolves them
into `InstallOptions` (`options.py`), checks
what the API access and the plugin's source need, then runs the node agent
`assembly.py` composes (the log socket, the istio-cni fast path, the health and
metrics servers, the installer loop and the repair controller, on the one
lifecycle) until SIGTERM or SIGINT.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from istio_agent.cni.install import binaries
from istio_agent.cni.install.flags import FLAGS, INSTALL_CNI, KUBERNETES_ENV, LOG_FLAGS, VERSION
from istio_agent.cni.install.options import OptionsError, resolve_install_options
from istio_agent.config import clickflags
from istio_agent.config.reference import default_text
from istio_agent.kube.access import KubeAccessError, in_cluster

log = logging.getLogger("istio_agent.cni.install")

# Istio scope -> our loggers (upstream's repair logs under cni-agent too).
SCOPES = {"default": ("istio_agent",), "cni-agent": ("istio_agent.cni.install", "istio_agent.cni.repair"),
          "cni-plugin": ("istio_agent.cni.plugin",)}
_SCOPE_OF = {"istio_agent.cni.install": "cni-agent", "istio_agent.cni.repair": "cni-agent",
             "istio_agent.cni.plugin": "cni-plugin"}
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "warning": logging.WARNING,
           "error": logging.ERROR, "fatal": logging.CRITICAL, "none": logging.CRITICAL + 10}
_LEVEL_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn", logging.ERROR: "error",
                logging.CRITICAL: "fatal"}
REPAIR_BACKOFF_MAX = 30.0


class _IstioFormatter(logging.Formatter):
    """Istio's line: RFC 3339 UTC time, level, scope, message (tab-separated), or one JSON object."""

    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        stamp += f".{int((record.created % 1) * 1e6):06d}Z"
        level = _LEVEL_NAMES.get(record.levelno, record.levelname.lower())
        scope = _SCOPE_OF.get(record.name, record.name)
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        if self.as_json:
            import json
            return json.dumps({"time": stamp, "level": level, "scope": scope, "msg": message})
        return f"{stamp}\t{level}\t{scope}\t{message}"


def configure_logging(output_level: str, as_json: bool) -> None:
    """`--log_output_level` (`scope:level,...`; `all` sets every scope) onto our loggers; lines to stdout."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_IstioFormatter(as_json))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("istio_agent").setLevel(logging.INFO)
    for part in filter(None, (p.strip() for p in output_level.split(","))):
        scope, sep, level_name = part.rpartition(":")
        if not sep:
            scope, level_name = "default", part
        if level_name.lower() not in _LEVELS:
            raise click.BadParameter(f"invalid level {level_name!r} in {part!r}", param_hint="--log_output_level")
        level = _LEVELS[level_name.lower()]
        names = [n for group in SCOPES.values() for n in group] if scope == "all" else SCOPES.get(scope, ())
        for name in names:
            logging.getLogger(name).setLevel(level)
    # Upstream filters the plugin's lines at the agent's level (its UDS logger takes cni-agent's).
    logging.getLogger("istio_agent.cni.plugin").setLevel(logging.getLogger("istio_agent.cni.install")
                                                          .getEffectiveLevel())


def _flag_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The table's flags as raw text (resolved with Go's rules by `resolve_install_options`), each from the
    command line or its variable."""
    for flag in reversed(FLAGS):
        extra: dict[str, Any] = {"is_flag": False, "flag_value": "true"} if flag.type_name == "bool" else {}
        variables = ", ".join(flag.env)
        function = click.option(f"--{flag.name}", flag.name.replace("-", "_"), default=None, envvar=list(flag.env),
                                metavar={"bool": "BOOL", "int": "INT"}.get(flag.type_name, "TEXT"),
                                help=f"{flag.description} [env {variables}; default {default_text(flag)!r}]",
                                **extra)(function)
    for variable in reversed(KUBERNETES_ENV):  # environment only, as upstream; hidden flags are how click reads it
        function = click.option(f"--{variable.name.lower().replace('_', '-')}", variable.name.lower(), default="",
                                envvar=variable.name, hidden=True)(function)
    return function


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 120}


@click.group(context_settings=CONTEXT, help=INSTALL_CNI.commands[0].summary, invoke_without_command=True)
@clickflags.options(LOG_FLAGS)
@_flag_options
@click.pass_context
def command(ctx: click.Context, log_output_level: str, log_as_json: bool, **raw: str | None) -> None:
    if ctx.invoked_subcommand is not None:  # `install-cni version`: the node agent does not run
        return
    configure_logging(log_output_level, log_as_json)
    values = {flag.name: raw[key] for flag in FLAGS if raw.get(key := flag.name.replace("-", "_")) is not None}
    env = {variable.name: raw.get(variable.name.lower()) or "" for variable in KUBERNETES_ENV}
    try:
        options = resolve_install_options({k: str(v) for k, v in values.items()}, env, socket.gethostname(),
                                          log_output_level)
    except OptionsError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        access = in_cluster(env, options.service_account_dir, options.kube_ca_file, options.skip_tls_verify)
    except KubeAccessError as exc:
        raise click.ClickException(f"{exc} (install-cni writes the plugin's kubeconfig for that API server)") from None
    if options.repair.enabled:
        try:
            from istio_agent.cni.repair.rules import check_options
        except ImportError:
            pass
        else:
            try:
                check_options(options.repair)
            except ValueError as exc:
                raise click.ClickException(str(exc)) from None
    try:
        source = binaries.find_plugin_source()
    except binaries.BinaryError as exc:
        raise click.ClickException(str(exc)) from None
    if (Path(options.cni_bin_dir) / binaries.PLUGIN_NAME).resolve() == source.resolve():
        raise click.ClickException(f"--cni-bin-dir {options.cni_bin_dir!r} holds the plugin install-cni copies "
                                   f"({source}): cleanup would delete it; give the node's CNI bin dir")
    from istio_agent.cni.install.assembly import run_install_cni

    sys.exit(run_install_cni(options, access, source))


@command.command("version", context_settings=CONTEXT, help=VERSION.summary)
@clickflags.options(VERSION.flags)
def version(short: bool, output: str) -> None:
    from istio_agent.version import VersionOutputError, version_output

    try:
        click.echo(version_output(short, output), nl=False)
    except VersionOutputError as exc:
        raise click.ClickException(str(exc)) from None


def main() -> None:
    command(prog_name="install-cni")

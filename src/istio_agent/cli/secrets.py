"""`pilot-agent secrets`: Envoy's SDS secrets as `istioctl proxy-config secret` shows them, and `--diff`.

Run inside the pod (it talks to localhost): the table (or `-o json`) comes from
Envoy's config dump; `--diff` also reads the agent's cache from the status
server's `/debug/secrets` and prints SecretItemDiff items. Exit codes: 0 in
sync (or no diff asked), 1 when the agent and Envoy disagree, 2 when either
side cannot be read.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import click

from istio_agent.cli.pilot_agent_flags import SECRETS
from istio_agent.config.clickflags import options
from istio_agent.status.secrets_debug import (
    CONFIG_DUMP_SECRETS_PATH,
    DEBUG_SECRETS_PATH,
    SecretView,
    diff_secrets,
    disagreements,
    proxy_views,
    render_diffs,
    render_items,
    to_json_text,
)

EXIT_DIFFERENT = 1
EXIT_UNREADABLE = 2


class Unreadable(Exception):
    """A side could not be fetched or parsed; the message says which and why."""


def _get_json(port: int, path: str, what: str, timeout: float) -> Any:
    url = f"http://localhost:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise Unreadable(f"{what} at {url} answered {exc.code}: {exc.read()[:200].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise Unreadable(f"cannot reach {what} at {url}: {getattr(exc, 'reason', exc)}") from None
    try:
        return json.loads(body)
    except ValueError as exc:
        raise Unreadable(f"{what} at {url} sent invalid JSON: {exc}") from None


def envoy_secrets(admin_port: int, now: float, timeout: float) -> list[SecretView]:
    dump = _get_json(admin_port, CONFIG_DUMP_SECRETS_PATH, "Envoy's admin API", timeout)
    try:
        return proxy_views(dump, now)
    except ValueError as exc:
        raise Unreadable(f"Envoy's config dump: {exc}") from None


def agent_secrets(status_port: int, timeout: float) -> list[SecretView]:
    items = _get_json(status_port, DEBUG_SECRETS_PATH, "the agent's status server", timeout)
    if not isinstance(items, list):
        raise Unreadable(f"the agent's {DEBUG_SECRETS_PATH} did not send a list")
    try:
        return [SecretView.from_json(obj) for obj in items]
    except (ValueError, TypeError) as exc:
        raise Unreadable(f"the agent's {DEBUG_SECRETS_PATH}: {exc}") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, help=SECRETS.summary)
@options(SECRETS.flags)
def command(output: str, diff: bool, admin_port: int, status_port: int, timeout: float) -> None:
    now = time.time()
    try:
        proxy = envoy_secrets(admin_port, now, timeout)
        agent = agent_secrets(status_port, timeout) if diff else []
    except Unreadable as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(EXIT_UNREADABLE)
    if not diff:
        click.echo(to_json_text(proxy) if output == "json" else render_items(proxy), nl=output == "json")
        return
    diffs = diff_secrets(agent, proxy)
    click.echo(to_json_text(diffs) if output == "json" else render_diffs(diffs), nl=output == "json")
    problems = disagreements(diffs)
    if problems:
        click.echo("Error: the agent and Envoy disagree:\n  " + "\n  ".join(problems), err=True)
        sys.exit(EXIT_DIFFERENT)

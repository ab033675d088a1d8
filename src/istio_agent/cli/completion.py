"""`pilot-agent completion SHELL`: the shell completion script, as upstream's cobra command prints it.

click writes the scripts (bash, zsh, fish): a script calls `pilot-agent` back with
`_PILOT_AGENT_COMPLETE` set, and click's group answers with the commands, flags and
choices of the table (`pilot_agent_flags.py`), the lazily loaded subcommands
included. click has no PowerShell completion, so `powershell` is refused with a
message (upstream's cobra writes one). Loaded only when the command is run.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from istio_agent.cli.pilot_agent_flags import COMPLETION, SHELLS
from istio_agent.config.clickflags import arguments, options

PROG_NAME = "pilot-agent"
COMPLETE_VAR = "_PILOT_AGENT_COMPLETE"  # what click's group reads, from the program's name
CLICK_SHELLS = ("bash", "zsh", "fish")


def completion_script(root: click.Command, shell: str) -> str:
    """click's completion script of `root` for `shell` (bash, zsh or fish)."""
    from click.shell_completion import get_completion_class

    completion = get_completion_class(shell)
    if completion is None:
        raise click.UsageError(f"no completion for shell {shell!r}")
    return completion(root, {}, PROG_NAME, COMPLETE_VAR).source()


@click.command("completion", context_settings={"help_option_names": ["-h", "--help"]}, help=COMPLETION.summary)
@arguments(COMPLETION.arguments, {"shell": {"type": click.Choice(SHELLS)}})
@options(COMPLETION.flags)
@click.pass_context
def command(ctx: click.Context, shell: str, **_flags: Any) -> None:
    if shell not in CLICK_SHELLS:
        reason = ("click, which this pilot-agent's command line is built on, has no PowerShell completion"
                  if shell == "powershell" else f"unknown shell {shell!r}")
        click.echo(f"Error: {reason}; shells: {', '.join(CLICK_SHELLS)}", err=True)
        sys.exit(1)
    click.echo(completion_script(ctx.find_root().command, shell), nl=False)

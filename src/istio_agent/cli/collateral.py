"""`pilot-agent collateral`: pilot-agent's documentation and completion files, written from its table.

Upstream's command writes cobra's renderings of its command tree; this one writes the same kinds of file
under the same names (but the man pages: `<command>.1`, where cobra uses its section title as extension)
from `pilot_agent_flags.py` and the agent's variable registry, the tables `make docs` renders too:

- `--markdown`: one page per command, `pilot-agent.md`, `pilot-agent_proxy.md`, ...;
- `--yaml`: one document per command (name, synopsis, usage, options with name, shorthand,
  default_value and usage: cobra's keys);
- `--man`: one roff page per command, `pilot-agent.1`, `pilot-agent-proxy.1`, ...;
- `--html_fragment_with_front_matter`: `pilot-agent.html`, every command's flags and the environment
  variables, after Hugo front matter (Istio's documentation site's form);
- `--bash`, `--zsh`: click's completion scripts, `pilot-agent.bash` and `_pilot-agent`;
- `--all`: all of them. With none, nothing is written (as upstream).

The rendering is pure (`render_*`: a table in, text out); `write_collateral` writes the files.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from istio_agent.cli.pilot_agent_flags import COLLATERAL, PILOT_AGENT
from istio_agent.config.clickflags import options
from istio_agent.config.reference import default_text, support_text
from istio_agent.config.settings import Command, EnvVar, Flag, Program, go_bool

HELP_FLAG = Flag("help", False, "Help for this command.", go_bool, "bool", short="h")


def _title(program: Program, command: Command) -> str:
    return f"{program.name} {command.name}" if command.name else program.name


def _own_flags(program: Program, command: Command) -> list[Flag[Any]]:
    if command.name == "istio-iptables":  # its flags are istio-iptables' own table's
        from istio_agent.capture.flags import ISTIO_IPTABLES

        return [*ISTIO_IPTABLES.commands[0].flags, HELP_FLAG]
    root = program.commands[0].flags
    return [flag for flag in command.flags if not command.name or flag not in root] + [HELP_FLAG]


def _usage(program: Program, command: Command) -> str:
    words = [_title(program, command)]
    words += [arg.name.upper() if arg.required else f"[{arg.name.upper()}]" for arg in command.arguments]
    return " ".join([*words, "[flags]"])


def _flag_spelling(flag: Flag[Any]) -> str:
    names = f"--{flag.name}"
    return f"-{flag.short}, {names}" if flag.short else names


def _usage_text(flag: Flag[Any], program: Program) -> str:
    if flag.support == "honoured" or not program.upstream:
        return flag.description
    return f"{flag.description} ({support_text(flag)})"


def file_stem(program: Program, command: Command, separator: str) -> str:
    return separator.join([program.name, *command.name.split()]) if command.name else program.name


def render_markdown(program: Program, command: Command) -> str:
    lines = [f"## {_title(program, command)}", "", command.summary, "", "```", _usage(program, command), "```", "",
             "### Options", "", "```"]
    for flag in _own_flags(program, command):
        default = default_text(flag)
        suffix = f" (default {default!r})" if default and flag.type_name != "bool" else ""
        lines.append(f"  {_flag_spelling(flag):<34} {_usage_text(flag, program)}{suffix}")
    lines.append("```")
    if command.name:
        lines += ["", "### See also", "", f"* [{program.name}]({program.name}.md)"]
    else:
        lines += ["", "### Commands", ""]
        lines += [f"* [{_title(program, c)}]({file_stem(program, c, '_')}.md): {c.summary}"
                  for c in program.commands[1:]]
    return "\n".join(lines) + "\n"


def render_yaml(program: Program, command: Command) -> str:
    """cobra's YAML document keys, written as JSON-compatible YAML (every value quoted)."""
    lines = [f"name: {json.dumps(_title(program, command))}", f"synopsis: {json.dumps(command.summary)}",
             f"usage: {json.dumps(_usage(program, command))}", "options:"]
    for flag in sorted(_own_flags(program, command), key=lambda f: f.name):
        lines.append(f"    - name: {json.dumps(flag.name)}")
        if flag.short:
            lines.append(f"      shorthand: {json.dumps(flag.short)}")
        default = default_text(flag)
        if default:
            lines.append(f"      default_value: {json.dumps(default)}")
        lines.append(f"      usage: {json.dumps(_usage_text(flag, program))}")
    return "\n".join(lines) + "\n"


def _roff(text: str) -> str:
    escaped = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + escaped if escaped.startswith((".", "'")) else escaped


def render_man(program: Program, command: Command) -> str:
    title = _title(program, command)
    lines = [f'.TH "{file_stem(program, command, "-").upper()}" "1" "" "istio-agent" "{program.name} CLI"',
             ".SH NAME", _roff(f"{title} - {command.summary}"), ".SH SYNOPSIS", f".B {_roff(_usage(program, command))}",
             ".SH OPTIONS"]
    for flag in _own_flags(program, command):
        default = default_text(flag)
        lines += [".TP", f".B {_roff(_flag_spelling(flag))}",
                  _roff(_usage_text(flag, program) + (f" (default {default})" if default else ""))]
    if command.name:
        lines += [".SH SEE ALSO", f".BR {program.name} (1)"]
    return "\n".join(lines) + "\n"


def render_html(program: Program, variables: Iterable[EnvVar[Any]]) -> str:
    commands = program.commands
    out = ["---", f"title: {program.name}", f"description: {program.commands[0].summary}",
           "generator: istio-agent-collateral", f"number_of_entries: {len(commands)}", "max_toc_level: 2",
           f"remove_toc_prefix: '{program.name} '", "---", f"<p>{html.escape(program.summary)}</p>"]
    for command in commands:
        if command.name:
            out.append(f'<h2 id="{html.escape(file_stem(program, command, "-"))}">'
                       f"{html.escape(_title(program, command))}</h2>")
            out.append(f"<p>{html.escape(command.summary)}</p>")
        out.append(f"<pre class=\"language-bash\"><code>{html.escape(_usage(program, command))}</code></pre>")
        out += ['<table class="command-flags">', "<thead>", "<tr>", "<th>Flags</th>", "<th>Description</th>", "</tr>",
                "</thead>", "<tbody>"]
        for flag in _own_flags(program, command):
            default = default_text(flag)
            out += ["<tr>", f"<td><code>{html.escape(_flag_spelling(flag))}</code></td>",
                    f"<td>{html.escape(_usage_text(flag, program))}"
                    f"{html.escape(f' (default `{default}`)') if default else ''}</td>", "</tr>"]
        out += ["</tbody>", "</table>"]
    out += ['<h2 id="envvars">Environment variables</h2>',
            "<p>These environment variables affect the behavior of the <code>pilot-agent</code> command.</p>",
            '<table class="envvars">', "<thead>", "<tr>", "<th>Variable Name</th>", "<th>Type</th>",
            "<th>Default Value</th>", "<th>Description</th>", "</tr>", "</thead>", "<tbody>"]
    for var in sorted(variables, key=lambda v: v.name):
        note = f" ({support_text(var)})" if var.support != "honoured" else ""
        out += ["<tr>", f"<td><code>{html.escape(var.name)}</code></td>", f"<td>{html.escape(var.type_name)}</td>",
                f"<td><code>{html.escape(default_text(var))}</code></td>",
                f"<td>{html.escape(var.description + note)}</td>", "</tr>"]
    out += ["</tbody>", "</table>"]
    return "\n".join(out) + "\n"


def write_collateral(root: click.Command, directory: Path, kinds: set[str]) -> list[Path]:
    """Write the files of `kinds` (markdown, yaml, man, html, bash, zsh) into `directory`; the paths written."""
    if not kinds:
        return []
    directory.mkdir(parents=True, exist_ok=True)
    program, written = PILOT_AGENT, []

    def write(name: str, text: str) -> None:
        path = directory / name
        path.write_text(text)
        written.append(path)

    for command in program.commands:
        if "markdown" in kinds:
            write(f"{file_stem(program, command, '_')}.md", render_markdown(program, command))
        if "yaml" in kinds:
            write(f"{file_stem(program, command, '_')}.yaml", render_yaml(program, command))
        if "man" in kinds:
            write(f"{file_stem(program, command, '-')}.1", render_man(program, command))
    if "html" in kinds:
        from istio_agent.config import env

        write(f"{program.name}.html", render_html(program, env.REGISTRY.values()))
    if kinds & {"bash", "zsh"}:
        from istio_agent.cli.completion import completion_script

        if "bash" in kinds:
            write(f"{program.name}.bash", completion_script(root, "bash"))
        if "zsh" in kinds:
            write(f"_{program.name}", completion_script(root, "zsh"))
    return written


KINDS = {"markdown": "markdown", "yaml": "yaml", "man": "man", "html_fragment_with_front_matter": "html",
         "bash": "bash", "zsh": "zsh"}


@click.command("collateral", context_settings={"help_option_names": ["-h", "--help"]}, help=COLLATERAL.summary)
@options(COLLATERAL.flags)
@click.pass_context
def command(ctx: click.Context, output_dir: str, **flags: Any) -> None:
    kinds = set(KINDS.values()) if flags.get("all") else {kind for flag, kind in KINDS.items() if flags.get(flag)}
    for path in write_collateral(ctx.find_root().command, Path(output_dir), kinds):
        click.echo(f"wrote {path}")

"""A program's reference page, generated from its table (`config/settings.py`): `docs/reference/<program>.md`.

Pure: a `Program` in, Markdown out. The pages are written by `make docs`
(`python -m istio_agent.cli.reference` for the product's programs, `python -m
istiod_local.cli.reference` for istiod-local's) and a test keeps each in
sync, so a page can never drift from what its program parses.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from istio_agent.config.settings import ACCEPTED, HONOURED, PARTIAL, Argument, Command, Flag, Program, Setting


def default_text(setting: Setting[Any]) -> str:
    """A default as the reference shows it: `true`/`false`, durations in seconds, lists comma-separated."""
    value = setting.default
    if value is None or value == "" or value == ():
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return ",".join(str(item) for item in value)
    if setting.type_name == "duration" and isinstance(value, int | float):
        return f"{value:g}s"
    return str(value)


def cell(content: str) -> str:
    """Text for a Markdown table cell: pipes escaped, line breaks as spaces, and `<`/`>` outside code spans
    as entities (a renderer would take `<scope>` for a tag)."""
    parts = content.replace("|", "\\|").replace("\n", " ").split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _code(content: str) -> str:
    return f"`{content}`" if content else ""


def support_text(setting: Setting[Any], program_upstream: bool = True) -> str:
    """The support column: the level, `(not upstream)` for this project's own, and what is missing."""
    level: str = setting.support
    if program_upstream and not setting.upstream:
        level += " (not upstream)"
    return f"{level}: {setting.note}" if setting.note else level


def _flag_names(flag: Flag[Any]) -> str:
    names = [f"--{name}" for name in (flag.name, *flag.aliases)]
    if flag.off:
        names.append(f"--{flag.off}")
    if flag.short:
        names.insert(0, f"-{flag.short}")
    return ", ".join(f"`{name}`" for name in names)


def _flag_type(flag: Flag[Any]) -> str:
    kind = flag.type_name
    if flag.choices:
        kind = "one of " + ", ".join(f"`{choice}`" if choice else '`""`' for choice in flag.choices)
    if flag.multiple:
        kind += " (repeatable)"
    if flag.required:
        kind += ", required"
    return kind


def _meaning(setting: Setting[Any], program_upstream: bool) -> str:
    """The meaning column; without a support column (a program of our own), a setting not honoured says so."""
    if program_upstream or setting.support == HONOURED or setting.note in setting.description:
        return cell(setting.description)
    return cell(f"{setting.description} ({support_text(setting, program_upstream)})")


def flag_table(flags: Iterable[Flag[Any]], program_upstream: bool) -> list[str]:
    """One row per flag; the support column only for an upstream program (ours honour all they declare)."""
    support = " Support |" if program_upstream else ""
    lines = [f"| Flag | Type | Default | Environment |{support} Meaning |",
             "|---|---|---|---|---|---|" if program_upstream else "|---|---|---|---|---|"]
    for flag in flags:
        env = ", ".join(f"`{name}`" for name in flag.env)
        support = f" {cell(support_text(flag, program_upstream))} |" if program_upstream else ""
        lines.append(f"| {_flag_names(flag)} | {cell(_flag_type(flag))} | {cell(_code(default_text(flag)))} | {env} |"
                     f"{support} {_meaning(flag, program_upstream)} |")
    return lines


def variable_table(variables: Iterable[Setting[Any]], program_upstream: bool) -> list[str]:
    support = " Support |" if program_upstream else ""
    lines = [f"| Variable | Type | Default |{support} Meaning |",
             "|---|---|---|---|---|" if program_upstream else "|---|---|---|---|"]
    for var in sorted(variables, key=lambda v: v.name):
        support = f" {cell(support_text(var, program_upstream))} |" if program_upstream else ""
        lines.append(f"| `{var.name}` | {var.type_name} | {cell(_code(default_text(var)))} |{support}"
                     f" {_meaning(var, program_upstream)} |")
    return lines


def _usage(program: Program, command: Command) -> str:
    words = [program.name, command.name] if command.name else [program.name]
    for arg in command.arguments:
        words.append(arg.name.upper() if arg.required else f"[{arg.name.upper()}]")
    if command.flags:
        words.append("[flags]")
    if not command.name and len(program.commands) > 1:
        words.append("COMMAND ...")
    return " ".join(words)


def _argument_lines(arguments: tuple[Argument[Any], ...]) -> list[str]:
    lines = []
    for arg in arguments:
        default = default_text(arg)
        optional = "" if arg.required else f" (optional, default `{default}`)" if default else " (optional)"
        lines.append(f"- `{arg.name.upper()}`{optional}: {arg.description}")
    return lines


def render_markdown(program: Program) -> str:
    lines = [
        f"# `{program.name}` reference",
        "",
        f"Generated from `{program.source}` by `make docs`; a test keeps it in sync.",
        "",
        program.summary,
    ]
    if program.upstream:
        lines += ["", f"Support levels: {HONOURED} (as upstream), {PARTIAL} (the note says what is missing),"
                      f" {ACCEPTED} (read and checked, no effect here: the note says why);"
                      " \"not upstream\" marks this project's own."]
    root_flags = program.commands[0].flags if program.commands and not program.commands[0].name else ()
    for command in program.commands:
        title = f"{program.name} {command.name}" if command.name else program.name
        lines += ["", f"## `{title}`", "", command.summary, "", "```", _usage(program, command), "```"]
        if command.arguments:
            lines += ["", *_argument_lines(command.arguments)]
        own = [flag for flag in command.flags if not command.name or flag not in root_flags]
        if own:
            lines += ["", *flag_table(own, program.upstream)]
        shared = [flag for flag in command.flags if flag not in own]
        if shared:
            names = ", ".join(f"`--{flag.name}`" for flag in shared)
            lines += ["", f"It also takes the flags of `{program.name}` itself (above): {names}."]
        if command.variables:
            lines += ["", "Environment variables it reads:", "", *variable_table(command.variables, program.upstream)]
    lines += ["", "## Environment variables", ""]
    if program.variables_page:
        lines.append(f"The variables `{program.name}` reads are listed in [{program.variables_page.rsplit('/', 1)[-1]}]"
                     f"({program.variables_page}).")
    if program.variables:
        if program.variables_page:
            lines.append("")
        lines.append("Besides those bound to a flag (above):" if any(f.env for c in program.commands
                                                                      for f in c.flags) else
                     f"What `{program.name}` reads from its environment:")
        lines += ["", *variable_table(program.variables, program.upstream)]
    elif not program.variables_page:
        lines.append("None besides those bound to a flag (above).")
    return "\n".join(lines) + "\n"


def write_pages(programs: Iterable[Program], directory: Path) -> list[Path]:
    """Write `<program>.md` for each program into `directory`; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for program in programs:
        path = directory / f"{program.name}.md"
        path.write_text(render_markdown(program))
        written.append(path)
    return written

"""Each program's table (issue 22, item 3): its generated reference page in sync, and its click command built
from it, option for option; plus the declaration shape's own rules (`config/settings.py`)."""

from __future__ import annotations

from typing import Any

import click
import pytest
from support import ROOT

from istio_agent.capture.flags import ISTIO_IPTABLES
from istio_agent.cli import pilot_agent, secrets
from istio_agent.cli import reference as product_reference
from istio_agent.cli.pilot_agent_flags import PILOT_AGENT
from istio_agent.cni.install import main as install_cni
from istio_agent.cni.install.flags import INSTALL_CNI, KUBERNETES_ENV
from istio_agent.config.reference import render_markdown
from istio_agent.config.settings import ACCEPTED, EnvVar, Flag, Program, defaults, go_bool, integer, read
from istiod_local.cli import main as istiod_local
from istiod_local.cli import reference as local_reference
from istiod_local.cli.flags import ISTIOD_LOCAL

PROGRAMS = (*product_reference.PROGRAMS, *local_reference.PROGRAMS)
REFERENCE = ROOT / "docs" / "reference"


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_the_generated_reference_is_in_sync(program: Program) -> None:
    page = REFERENCE / f"{program.name}.md"
    assert page.exists() and page.read_text() == render_markdown(program), \
        f"run `make docs` and commit docs/reference/{program.name}.md"


def test_every_reference_page_is_a_programs() -> None:
    assert sorted(path.name for path in REFERENCE.glob("*.md")) == sorted(f"{p.name}.md" for p in PROGRAMS)


def _options(command: click.Command) -> list[str]:
    """The long names of a click command's visible options, in order (help's own left out)."""
    names = []
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden and param.name != "help":
            names += [opt for opt in param.opts if opt.startswith("--")] + list(param.secondary_opts)
    return names


def _declared(flags: tuple[Flag[Any], ...]) -> list[str]:
    names = []
    for flag in flags:
        names += [f"--{name}" for name in (flag.name, *flag.aliases)] + ([f"--{flag.off}"] if flag.off else [])
    return names


def _subcommand(group: click.Group, path: str) -> click.Command:
    command: click.Command = group
    for word in path.split():
        assert isinstance(command, click.Group)
        found = command.get_command(click.Context(command), word)
        assert found is not None, path
        command = found
    return command


@pytest.mark.parametrize(("program", "group"), [(PILOT_AGENT, pilot_agent.main), (ISTIOD_LOCAL, istiod_local.main)],
                         ids=["pilot-agent", "istiod-local"])
def test_click_commands_are_built_from_the_table(program: Program, group: click.Group) -> None:
    for command in program.commands:
        if command.name == "istio-iptables":  # its own parser, from its own table (below)
            continue
        built = _subcommand(group, command.name)
        assert _options(built) == _declared(command.flags), command.name
        arguments = [param.name for param in built.params if isinstance(param, click.Argument)]
        assert arguments == [arg.name for arg in command.arguments], command.name
    assert _options(secrets.command) == _declared(PILOT_AGENT.command("secrets").flags)


def test_install_cni_is_built_from_its_table() -> None:
    command = install_cni.command
    assert _options(command) == _declared(INSTALL_CNI.commands[0].flags)
    hidden = [param for param in command.params if isinstance(param, click.Option) and param.hidden]
    assert [param.envvar for param in hidden] == [var.name for var in KUBERNETES_ENV]
    for param in command.params:
        flag = next((f for f in INSTALL_CNI.commands[0].flags if f"--{f.name}" in param.opts), None)
        if flag is not None and flag.env:
            assert param.envvar == list(flag.env) and flag.env == (flag.name.upper().replace("-", "_"),)
    assert isinstance(command, click.Group)
    assert _options(_subcommand(command, "version")) == _declared(INSTALL_CNI.command("version").flags)


def test_istio_iptables_usage_lists_its_table() -> None:
    from istio_agent.cli.iptables import usage

    text = usage()
    for flag in ISTIO_IPTABLES.commands[0].flags:
        assert (f"--{flag.name}" in text) == bool(flag.dest), flag.name  # flags only accepted are not listed


# ---- the declaration shape


def test_a_flag_is_stored_under_its_name_unless_told() -> None:
    flag = Flag("concurrency", 0, "Worker threads.", integer, "int")
    assert flag.dest == "concurrency" and flag.takes_value and not flag.env
    assert Flag("debug-port", 15000, "Port.", integer, "int").dest == "debug_port"
    assert Flag("log_caller", "", "Accepted.", dest="").dest == ""


def test_a_setting_not_honoured_says_why() -> None:
    with pytest.raises(ValueError, match="say why"):
        Flag("profiling", "true", "Profiling endpoints.", support=ACCEPTED)


def test_a_bool_flag_takes_no_value_unless_declared_so() -> None:
    assert not Flag("diff", False, "Diff.", go_bool, "bool").takes_value
    assert Flag("enable-ipv6", None, "Pin IPv6.", go_bool, "bool", takes_value=True).takes_value
    assert Flag("dry-run", False, "Dry run.", go_bool, "bool", short="n").spellings() == "-n/--dry-run"


def test_variables_read_as_the_agent_reads_them() -> None:
    var = EnvVar("RETRIES", 30, "Retries.", integer, "int")
    assert read(var, {}) == 30 and read(var, {"RETRIES": ""}) == 30 and read(var, {"RETRIES": " 3 "}) == 3
    with pytest.raises(ValueError):
        read(var, {"RETRIES": "many"})
    text_var = EnvVar("NAME", "x", "A name.", str, "string")
    assert read(text_var, {"NAME": ""}) == ""


def test_defaults_by_dest() -> None:
    flags = (Flag("meshConfig", "./mesh", "Mesh file.", dest="mesh_config"), Flag("log-level", "info", "Level."))
    assert defaults(flags) == {"mesh_config": "./mesh", "log_level": "info"}

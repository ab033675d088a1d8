"""click options and arguments built from a program's table (`config/settings.py`).

The click command lines (pilot-agent's group and subcommands, install-cni,
istiod-local) build their options here, so a flag's names, default, help and
type are stated once, in the table. What only click knows (a `click.Path`'s
checks, a range) is passed as `extra` where the option is built. The per-pod
paths and the agent's injected line never import this module: click costs
~20 ms and ~1.2 MB, which they are built to avoid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from istio_agent.config.settings import Argument, Flag, text

Decorator = Callable[[Any], Any]


class Parsed(click.ParamType):
    """A value read by the flag's own parser; its ValueError is click's 'Invalid value for ...' error."""

    name = "text"  # help shows TEXT, as for a value click does not convert

    def __init__(self, flag: Flag[Any] | Argument[Any]) -> None:
        self.parse = flag.parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value  # a default already parsed
        try:
            return self.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _type(flag: Flag[Any], case_sensitive: bool) -> Any:
    if flag.choices:
        return click.Choice(list(flag.choices), case_sensitive=case_sensitive)
    if flag.type_name == "int":
        return int
    if flag.type_name == "float":
        return float
    if flag.parse is text:
        return None
    return Parsed(flag)


def option(flag: Flag[Any], *, case_sensitive: bool = True, **extra: Any) -> Decorator:
    """click.option for `flag`: its names, dest, default, help, type; `extra` adds (or overrides) click's own."""
    longs = [f"--{name}" for name in (flag.name, *flag.aliases)]
    if flag.off:
        longs = [f"--{flag.name}/--{flag.off}"]
    names = [*longs, f"-{flag.short}"] if flag.short else longs
    kwargs: dict[str, Any] = {"help": flag.description, "multiple": flag.multiple}
    if flag.required:
        kwargs["required"] = True  # and no default: click would take one as given
    else:
        kwargs["default"] = flag.default
    if flag.default == "":
        extra.pop("show_default", None)  # nothing to show (click would show `""`)
    if flag.type_name == "bool" and not flag.off:
        if flag.takes_value:  # pflag's bool: `--name` alone is true, `--name=false` false
            kwargs.update(is_flag=False, flag_value="true", type=Parsed(flag))
        else:
            kwargs["is_flag"] = True
    elif not flag.off:
        kwargs["type"] = _type(flag, case_sensitive)
    kwargs.update(extra)
    return click.option(*names, flag.dest, **kwargs)


def options(flags: tuple[Flag[Any], ...], extra: dict[str, dict[str, Any]] | None = None,
            **common: Any) -> Decorator:
    """click options for every flag of `flags`, in the table's order (help lists them so); `extra` by flag
    name, `common` for all."""
    def decorate(command: Any) -> Any:
        for flag in reversed(flags):
            command = option(flag, **common, **(extra or {}).get(flag.name, {}))(command)
        return command
    return decorate


def argument(arg: Argument[Any], **extra: Any) -> Decorator:
    """click.argument for a declared positional argument."""
    kwargs: dict[str, Any] = {"required": arg.required}
    if not arg.required:
        kwargs["default"] = arg.default
    if arg.parse is not text:
        kwargs["type"] = Parsed(arg)
    kwargs.update(extra)
    return click.argument(arg.name, **kwargs)


def arguments(args: tuple[Argument[Any], ...], extra: dict[str, dict[str, Any]] | None = None) -> Decorator:
    def decorate(command: Any) -> Any:
        for arg in reversed(args):
            command = argument(arg, **(extra or {}).get(arg.name, {}))(command)
        return command
    return decorate

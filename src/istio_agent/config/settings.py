"""One way to declare what a program reads: its environment variables and its flags.

Upstream declares every environment variable once, with its default and a
description, in one registry, and each command's flags once in its flag set.
Here both have one shape. A `Setting` has a name, a default (already parsed),
the parser of its text and the type that parser reads, a description, and how
much of upstream's meaning this project honours:

- `honoured`: it does what it does upstream;
- `partial`: it has an effect, but not all of upstream's (the note says what is missing);
- `accepted`: it is read and validated but changes nothing here (the note says why).

An `EnvVar` is a setting read from the environment (the agent's registry is
`config/env.py`); a `Flag` is one given on a command line: its long name, an
optional short one, the environment variables bound to it in precedence order
(the last one set wins, and the command line wins over all), whether it
repeats. An `Argument` is a positional one. A `Command` lists a command's
arguments and flags; a `Program` its commands and the variables it reads.

Each program declares its table once, beside its command line; the parser is
built from that table (click through `config/clickflags.py`, or a parser of
its own where click is too heavy: the agent's injected line, `istio-iptables`),
and `docs/reference/<program>.md` is generated from it (`config/reference.py`,
`make docs`).

This module is on `istio-iptables`' per-pod path, which runs under `python
-IS`: it imports nothing at run time (no `os`, `dataclasses` or `typing`),
so the classes are plain ones with `__slots__` (a declaration is never changed
once made; enforcing that would cost istio-iptables ~50 us on every run), and
the parsers that need another module import it when they first parse.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any, Generic, Literal, TypeVar

    T = TypeVar("T")
    Support = Literal["honoured", "partial", "accepted"]

    class _Typed(Generic[T]):
        __slots__ = ()
else:
    T = None

    class _Typed:
        """`Setting[str]` at run time is `Setting` itself: the parameter is for the type checker only."""

        __slots__ = ()

        def __class_getitem__(cls, item):
            return cls


HONOURED: Support = "honoured"
PARTIAL: Support = "partial"
ACCEPTED: Support = "accepted"


# --- parsers: text -> value (ValueError for a bad one) -----------------------------------------------------------

def text(value: str) -> str:
    return value


def go_bool(value: str) -> bool:
    """Go's strconv.ParseBool (1, t, T, TRUE, true, True, 0, f, ...)."""
    from istio_agent.config.gobool import parse_bool  # on first use: istio-iptables loads it only for a boolean

    return parse_bool(value)


def integer(value: str) -> int:
    return int(value.strip())


def floating(value: str) -> float:
    return float(value.strip())


def go_duration(value: str) -> float:
    """A Go duration (`100ms`, `1h30m`), in seconds."""
    from istio_agent.config.durations import parse_duration

    return parse_duration(value)


class Setting(_Typed[T]):
    """What an environment variable and a flag share: name, parsed default, parser, meaning, support here."""

    __slots__ = ("default", "description", "name", "note", "parse", "support", "type_name", "upstream")

    name: str
    default: T
    description: str
    parse: Callable[[str], T]
    type_name: str
    support: Support
    note: str  # for partial/accepted: what is missing and why
    upstream: bool  # False: this project's own (listed under "Not upstream")

    def __init__(self, name: str, default: T, description: str, parse: Callable[[str], T], type_name: str,
                 support: Support = HONOURED, note: str = "", upstream: bool = True) -> None:
        if support != HONOURED and not note:
            raise ValueError(f"{name} is {support}: say why in its note")
        self.name = name
        self.default = default
        self.description = description
        self.parse = parse
        self.type_name = type_name
        self.support = support
        self.note = note
        self.upstream = upstream

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.default!r})"


class EnvVar(Setting[T]):
    """One environment variable: `name` is the variable's."""

    __slots__ = ()


class Flag(Setting[T]):
    """One flag: `--name` (and `-short`), its value stored under `dest`.

    `dest` defaults to the name with `_` for `-`; `""` keeps no value (a flag only accepted). A bool flag
    takes no value unless `takes_value` says it must (`--name` alone sets it; parsers that
    follow Go's pflag also take `--name=false`). `env` are the variables bound to the flag, in precedence
    order; `multiple` collects every occurrence, in order. `aliases` are further long names, `off` the
    long name that sets a bool flag false (`--live/--plain`), `choices` the values it accepts.
    """

    __slots__ = ("aliases", "choices", "dest", "env", "multiple", "off", "required", "short", "takes_value")

    short: str
    env: tuple[str, ...]
    multiple: bool
    dest: str
    takes_value: bool
    required: bool
    aliases: tuple[str, ...]
    off: str
    choices: tuple[str, ...]

    def __init__(self, name: str, default: T, description: str, parse: Callable[[str], T] = text,  # type: ignore[assignment]
                 type_name: str = "string", *, short: str = "", env: tuple[str, ...] = (), multiple: bool = False,
                 dest: str | None = None, takes_value: bool | None = None, required: bool = False,
                 aliases: tuple[str, ...] = (), off: str = "", choices: tuple[str, ...] = (),
                 support: Support = HONOURED, note: str = "", upstream: bool = True) -> None:
        super().__init__(name, default, description, parse, type_name, support, note, upstream)
        self.short = short
        self.env = env
        self.multiple = multiple
        self.dest = name.replace("-", "_") if dest is None else dest
        self.takes_value = type_name != "bool" if takes_value is None else takes_value
        self.required = required
        self.aliases = aliases
        self.off = off
        self.choices = choices

    def spellings(self) -> str:
        """How a user writes it, for messages and the reference: `-p/--envoy-port`, `--live/--plain`."""
        names = "/".join(f"--{name}" for name in (self.name, *self.aliases))
        if self.off:
            names += f"/--{self.off}"
        return f"-{self.short}/{names}" if self.short else names


class Argument(Setting[T]):
    """One positional argument."""

    __slots__ = ("required",)

    required: bool

    def __init__(self, name: str, default: T, description: str, parse: Callable[[str], T] = text,  # type: ignore[assignment]
                 type_name: str = "string", *, required: bool = True) -> None:
        super().__init__(name, default, description, parse, type_name)
        self.required = required


class Command:
    """One command of a program: `name` is its path after the program's (`""` for the program itself)."""

    __slots__ = ("arguments", "flags", "name", "summary", "variables")

    def __init__(self, name: str, summary: str, flags: tuple[Flag[Any], ...] = (),
                 arguments: tuple[Argument[Any], ...] = (), variables: tuple[EnvVar[Any], ...] = ()) -> None:
        self.name = name
        self.summary = summary
        self.flags = flags
        self.arguments = arguments
        self.variables = variables

    def flag(self, name: str) -> Flag[Any]:
        """The flag with this long name (KeyError: the table has none)."""
        for flag in self.flags:
            if flag.name == name:
                return flag
        raise KeyError(f"{self.name or 'the command'} has no flag --{name}")


class Program:
    """A program's table: its commands (the first is the program itself) and the variables it reads.

    `variables_page` names the page that lists its variables instead (pilot-agent's: ENVIRONMENT.md);
    `source` the module that declares the table, for the generated reference's first line.
    """

    __slots__ = ("commands", "name", "source", "summary", "upstream", "variables", "variables_page")

    def __init__(self, name: str, summary: str, commands: tuple[Command, ...], source: str,
                 variables: tuple[EnvVar[Any], ...] = (), variables_page: str = "", upstream: bool = True) -> None:
        self.name = name
        self.summary = summary
        self.commands = commands
        self.source = source
        self.variables = variables
        self.variables_page = variables_page
        self.upstream = upstream

    def command(self, name: str) -> Command:
        for command in self.commands:
            if command.name == name:
                return command
        raise KeyError(f"{self.name} has no command {name!r}")

    def all_variables(self) -> Iterator[str]:
        """Every variable name the program reads: its own and those bound to its flags."""
        yield from (var.name for var in self.variables)
        for command in self.commands:
            yield from (var.name for var in command.variables)
            for flag in command.flags:
                yield from flag.env


def defaults(flags: tuple[Flag[Any], ...]) -> dict[str, Any]:
    """Every flag's default, by `dest`."""
    return {flag.dest: flag.default for flag in flags}


def read(var: EnvVar[T], env: Mapping[str, str]) -> T:
    """The variable's value in `env`: its default when unset (or empty, for a type other than a string);
    ValueError from its parser for a bad value."""
    raw = env.get(var.name)
    if raw is None or (raw == "" and var.type_name != "string"):
        return var.default
    return var.parse(raw)

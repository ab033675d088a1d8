"""How an environment variable is declared and read (the registry itself is `config/env.py`).

Upstream declares each variable once with its default and a description; so do
we, and each declaration also says how much of upstream's meaning this agent
honours:

- `honoured`: it does what it does upstream;
- `partial`: it has an effect, but not all of upstream's (the note says what is missing);
- `accepted`: it is read and validated but changes nothing here (the note says why).

`pilot-agent` warns at start about every set variable that is only accepted, and
`docs/ENVIRONMENT.md` is generated from the registry (`make docs`).

Components never read the process environment: the options resolver
(`agent/options.py`) asks an `Environment` (a snapshot of a plain mapping, so
tests pass a dict) for a registered `EnvVar` and gets a parsed, typed value or a
`ConfigError` naming the variable and the value.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from istio_agent.config.durations import parse_duration
from istio_agent.config.errors import ConfigError
from istio_agent.config.gobool import parse_bool

T = TypeVar("T")

Support = Literal["honoured", "partial", "accepted"]
HONOURED: Support = "honoured"
PARTIAL: Support = "partial"
ACCEPTED: Support = "accepted"

@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One environment variable: its name, default (already parsed), parser, meaning and support here."""

    name: str
    default: T
    description: str
    parse: Callable[[str], T]
    type_name: str
    support: Support = HONOURED
    note: str = ""  # for partial/accepted: what is missing and why
    upstream: bool = True  # False: a variable of ours (listed under "Not upstream" in the README)


REGISTRY: dict[str, EnvVar[Any]] = {}


def _register(var: EnvVar[T]) -> EnvVar[T]:
    if var.name in REGISTRY:
        raise RuntimeError(f"environment variable {var.name} registered twice")
    if var.support != HONOURED and not var.note:
        raise RuntimeError(f"environment variable {var.name} is {var.support}: say why in its note")
    REGISTRY[var.name] = var
    return var


def _int(text: str) -> int:
    return int(text.strip())


def _float(text: str) -> float:
    return float(text.strip())


def string(name: str, default: str, description: str, *, support: Support = HONOURED, note: str = "",
           upstream: bool = True) -> EnvVar[str]:
    return _register(EnvVar(name, default, description, str, "string", support, note, upstream))


def boolean(name: str, default: bool, description: str, *, support: Support = HONOURED, note: str = "",
            upstream: bool = True) -> EnvVar[bool]:
    return _register(EnvVar(name, default, description, parse_bool, "bool", support, note, upstream))


def integer(name: str, default: int, description: str, *, support: Support = HONOURED, note: str = "",
            upstream: bool = True) -> EnvVar[int]:
    return _register(EnvVar(name, default, description, _int, "int", support, note, upstream))


def floating(name: str, default: float, description: str, *, support: Support = HONOURED, note: str = "",
             upstream: bool = True) -> EnvVar[float]:
    return _register(EnvVar(name, default, description, _float, "float", support, note, upstream))


def duration(name: str, default: float, description: str, *, support: Support = HONOURED, note: str = "",
             upstream: bool = True) -> EnvVar[float]:
    """A Go-style duration (`100ms`, `1h30m`), parsed to seconds."""
    return _register(EnvVar(name, default, description, parse_duration, "duration", support, note, upstream))


class Environment:
    """Typed, validated access to a snapshot of the process environment."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values: dict[str, str] = dict(os.environ if values is None else values)

    def get(self, var: EnvVar[T]) -> T:
        raw = self._values.get(var.name)
        if raw is None or (raw == "" and var.type_name != "string"):
            return var.default
        try:
            return var.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"environment variable {var.name}={raw!r}: {exc}") from None

    def raw(self, name: str) -> str | None:
        return self._values.get(name)

    def is_set(self, var: EnvVar[Any]) -> bool:
        return var.name in self._values

    def with_prefix(self, prefix: str) -> Iterator[tuple[str, str]]:
        """Every (name without prefix, value) whose name starts with `prefix`, sorted by name."""
        for name in sorted(self._values):
            if name.startswith(prefix):
                yield name[len(prefix):], self._values[name]

    def overlay(self, extra: Mapping[str, str]) -> Environment:
        """A new environment where `extra` (e.g. ProxyConfig proxyMetadata) fills unset names.

        Upstream applies `proxyMetadata` only to variables that the process does not already
        have, so an explicit container env always wins.
        """
        merged = dict(extra)
        merged.update(self._values)
        return Environment(merged)

    def without_effect(self) -> list[EnvVar[Any]]:
        """Registered variables that are set (to something other than their default) but do nothing here."""
        out = []
        for name in sorted(self._values):
            var = REGISTRY.get(name)
            if var is not None and var.support == ACCEPTED and self._values[name] != "":
                try:
                    if var.parse(self._values[name]) == var.default:
                        continue
                except ValueError:
                    pass
                out.append(var)
        return out

    def as_dict(self) -> dict[str, str]:
        return dict(self._values)

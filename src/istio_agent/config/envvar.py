"""How the agent's environment variables are declared and read (the registry itself is `config/env.py`).

Upstream declares each variable once with its default and a description; so do
we, in the shape every program's settings share (`config/settings.py`: the
support levels, `EnvVar`), each declaration saying how much of upstream's
meaning this agent honours. The helpers below (`string()`, `boolean()`, ...)
declare a variable and register it in `REGISTRY`.

`pilot-agent` warns at start about every set variable that is only accepted, and
`docs/ENVIRONMENT.md` is generated from the registry (`make docs`).

Components never read the process environment: the options resolver
(`agent/options.py`) asks an `Environment` (a snapshot of a plain mapping, so
tests pass a dict) for a registered `EnvVar` and gets a parsed, typed value or a
`ConfigError` naming the variable and the value.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from istio_agent.config import settings
from istio_agent.config.errors import ConfigError
from istio_agent.config.gobool import parse_bool
from istio_agent.config.settings import ACCEPTED, HONOURED, PARTIAL, EnvVar

if TYPE_CHECKING:
    from istio_agent.config.settings import Support

__all__ = ["ACCEPTED", "HONOURED", "PARTIAL", "REGISTRY", "EnvVar", "Environment", "boolean", "duration",
           "floating", "integer", "parse_bool", "string"]

T = TypeVar("T")

REGISTRY: dict[str, EnvVar[Any]] = {}


def _register(var: EnvVar[T]) -> EnvVar[T]:
    if var.name in REGISTRY:
        raise RuntimeError(f"environment variable {var.name} registered twice")
    REGISTRY[var.name] = var
    return var


def _declare(name: str, default: T, description: str, parse: Any, type_name: str, support: Support, note: str,
             upstream: bool) -> EnvVar[T]:
    try:
        var: EnvVar[T] = EnvVar(name, default, description, parse, type_name, support, note, upstream)
    except ValueError as exc:  # accepted or partial without a note
        raise RuntimeError(f"environment variable {exc}") from None
    return _register(var)


def string(name: str, default: str, description: str, *, support: Support = HONOURED, note: str = "",
           upstream: bool = True) -> EnvVar[str]:
    return _declare(name, default, description, settings.text, "string", support, note, upstream)


def boolean(name: str, default: bool, description: str, *, support: Support = HONOURED, note: str = "",
            upstream: bool = True) -> EnvVar[bool]:
    return _declare(name, default, description, parse_bool, "bool", support, note, upstream)


def integer(name: str, default: int, description: str, *, support: Support = HONOURED, note: str = "",
            upstream: bool = True) -> EnvVar[int]:
    return _declare(name, default, description, settings.integer, "int", support, note, upstream)


def floating(name: str, default: float, description: str, *, support: Support = HONOURED, note: str = "",
             upstream: bool = True) -> EnvVar[float]:
    return _declare(name, default, description, settings.floating, "float", support, note, upstream)


def duration(name: str, default: float, description: str, *, support: Support = HONOURED, note: str = "",
             upstream: bool = True) -> EnvVar[float]:
    """A Go-style duration (`100ms`, `1h30m`), parsed to seconds."""
    return _declare(name, default, description, settings.go_duration, "duration", support, note, upstream)


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

"""`pilot-agent proxy`'s command line read without click, when it is one click would read the same way.

Istio's templates start every agent with a plain line (`pilot-agent proxy sidecar --domain
ns.svc.cluster.local --proxyLogLevel=warning --proxyComponentLogLevel=misc:error
--log_output_level=default:info`, `proxy router ...` for gateways). `parse` takes only lines made of
the declared flags (`pilot_agent_flags`) in the two long forms (`--name=value`, `--name value`; a bool flag as
`--name`), root logging flags before `proxy`, and at most one positional (the proxy type). Anything else
(`--help`, an unknown flag, a short or single-dash flag, `--`, a value that looks like a flag, an int
flag whose value is not an int, a second positional) returns None and click parses the line as before,
with its errors and its handling of unknown flags. Within what it accepts the result is click's
(`tests/unit/test_proxy_argv.py` parses the same lines with both).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from istio_agent.cli.logging_setup import LogOptions
from istio_agent.cli.pilot_agent_flags import LOG_FLAGS, PROXY_FLAGS, PROXY_TYPE_DEFAULT, Flag, defaults

SUBCOMMAND = "proxy"


@dataclass(frozen=True)
class ProxyCall:
    """A parsed `pilot-agent [root log flags] proxy [type] [flags]` line."""

    proxy_type: str
    flags: dict[str, Any]  # the subcommand's flags (its log flags included) by dest, defaults filled in
    log_options: LogOptions


def merged_log_options(root: Mapping[str, Any], sub: Mapping[str, Any], explicit: Iterable[str]) -> LogOptions:
    """The root's log flags, overridden by those the subcommand was given explicitly (pure; click's path too)."""
    given = set(explicit)
    values = dict(root)
    for flag in LOG_FLAGS:
        name = flag.dest
        if name in sub and name in given:
            values[name] = sub[name]
        values.setdefault(name, sub.get(name))
    return LogOptions(
        output_level=str(values["log_output_level"] or "default:info"),
        as_json=bool(values["log_as_json"]),
        targets=tuple(values["log_target"] or ("stdout",)),
        callers=tuple(c.strip() for c in str(values["log_caller"] or "").split(",") if c.strip()),
        stacktrace_levels=str(values["log_stacktrace_level"] or "default:none"),
    )


class _Declined(Exception):
    """The line is not one this parser takes: click reads it."""


def _options(argv: Sequence[str], start: int, table: Sequence[Flag[Any]], positionals: list[str],
             stop_at_positional: bool) -> tuple[dict[str, Any], set[str], int]:
    """Flags from argv[start:] (values by dest, the dests given), up to the first positional when
    `stop_at_positional`; positionals are collected otherwise. Returns where it stopped."""
    by_name = {flag.name: flag for flag in table}
    values: dict[str, Any] = {}
    given: set[str] = set()
    i = start
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-"):
            if stop_at_positional:
                break
            positionals.append(token)
            i += 1
            continue
        if not token.startswith("--") or token == "--":
            raise _Declined
        name, has_value, value = token[2:].partition("=")
        flag = by_name.get(name)
        if flag is None:
            raise _Declined
        if not flag.takes_value:
            if has_value:
                raise _Declined
            values[flag.dest] = True
        else:
            if not has_value:
                if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                    raise _Declined
                i += 1
                value = argv[i]
            try:
                converted = flag.parse(value)  # int(), for an int flag: click's
            except ValueError:
                raise _Declined from None
            if flag.multiple:
                previous = values.get(flag.dest, ()) if flag.dest in given else ()
                values[flag.dest] = (*previous, converted)
            else:
                values[flag.dest] = converted
        given.add(flag.dest)
        i += 1
    return values, given, i


def parse(argv: Sequence[str]) -> ProxyCall | None:
    """`argv` without the program name; None when click should parse it (see the module's docstring)."""
    try:
        root_given_values, _, at = _options(argv, 0, LOG_FLAGS, [], stop_at_positional=True)
        if at >= len(argv) or argv[at] != SUBCOMMAND:
            return None
        positionals: list[str] = []
        sub_values, sub_given, _ = _options(argv, at + 1, (*PROXY_FLAGS, *LOG_FLAGS), positionals,
                                            stop_at_positional=False)
    except _Declined:
        return None
    if len(positionals) > 1:
        return None  # click passes the rest on as unknown arguments, and says so
    root = {**defaults(LOG_FLAGS), **root_given_values}
    flags = {**defaults(PROXY_FLAGS), **defaults(LOG_FLAGS), **sub_values}
    return ProxyCall(positionals[0] if positionals else PROXY_TYPE_DEFAULT, flags,
                     merged_log_options(root, flags, sub_given))

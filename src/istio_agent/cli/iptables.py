"""`istio-iptables` (also `pilot-agent istio-iptables`): upstream's flags and environment.

Every flag is declared once in the program's table (`capture/flags.py`: its
names, the environment variables that may set it, its meaning), and this
module's parser reads argv and the environment from that table with Go's
pflag syntax; precedence is upstream's: default, then the flag's own
variable (`--foo-bar` <- `FOO_BAR`), then its additional variables (e.g.
`ISTIO_META_DNS_CAPTURE`), then the command line.

`main()` parses argv itself and does not import click: importing click costs
more than applying the rules (see benchmarks/bench_capture.py). `command` is
the click command for `pilot-agent`'s group; it is built on first access and
hands its raw arguments to the same parser, so both entry points behave alike.
Nor does it import `os` (the environment comes from `capture.procs.environment`)
or Go's boolean rules before a boolean value is given: under the lean launcher
(`iptables_launcher.py`, no site) each module is start-up time on every pod.
"""

from __future__ import annotations

import sys

from istio_agent.capture.flags import ENV_ONLY, FLAGS, ISTIO_IPTABLES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, TextIO

    import click

    from istio_agent.capture.config import CaptureConfig
    from istio_agent.config.settings import Flag

_BY_LONG = {flag.name: flag for flag in FLAGS}
_BY_SHORT = {flag.short: flag for flag in FLAGS if flag.short}

# The exit status of a command line that does not parse: upstream's pilot-agent exits with -1.
USAGE_EXIT_CODE = 255


class UsageError(ValueError):
    """Bad command line or environment."""


def _parse(flag: Flag[Any], value: str, where: str) -> Any:
    """`value` read by the flag's parser; a UsageError naming `where` (the flag or the variable) if it is bad."""
    try:
        return flag.parse(value)
    except ValueError as err:
        if flag.type_name == "bool":
            raise UsageError(f"invalid boolean {value!r} for {where}") from None
        raise UsageError(f"invalid {where}: {err}") from None


def describe_field(attr: str) -> str:
    """How a user sets a CaptureConfig attribute, for error messages."""
    for flag in FLAGS:
        if flag.dest == attr or (attr.startswith("dns_servers") and flag.dest == "dns_servers"):
            spelling = flag.spellings()
            return f"{spelling} ({', '.join(flag.env)})" if flag.env else spelling
    for field, var in ENV_ONLY:
        if field == attr:
            return f"${var.name}"
    return attr


def _store(values: dict[str, object], flag: Flag[Any], value: object) -> None:
    if isinstance(value, dict):  # one flag, several CaptureConfig fields (--dns-servers)
        values.update(value)
    elif flag.dest:  # no dest: accepted for compatibility, ignored
        values[flag.dest] = value


def parse_args(args: Sequence[str], env: Mapping[str, str],
               warn: Callable[[str], None] | None = None) -> tuple[dict[str, object], bool]:
    """Config values from argv + environment (pflag syntax), and whether help was asked for.

    As upstream's command (cobra and pflag under `pilot-agent`): words that are not flags, and everything
    after `--`, are accepted and ignored; a variable whose boolean, uint16 or duration does not parse is
    ignored (pflag's Set fails and upstream drops the error), reported through `warn`; a bad flag is a
    UsageError.
    """
    values: dict[str, object] = {}
    for flag in FLAGS:
        for var in flag.env:
            if var not in env:
                continue
            try:
                value = _parse(flag, env[var], f"${var}") if flag.type_name == "bool" else _typed(flag, env[var])
            except (UsageError, ValueError) as exc:
                if warn is not None:
                    warn(f"{exc}: ignored, as upstream ignores it")
                continue
            _store(values, flag, value)
    for field, variable in ENV_ONLY:
        values[field] = env.get(variable.name, variable.default)
    want_help = False
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg in ("-h", "--help"):
            want_help = True
            continue
        if arg == "--":
            break  # the rest are positional words, which upstream's command ignores
        if arg.startswith("--"):
            name, equals, value = arg[2:].partition("=")
            has_value = bool(equals)
            spec = _BY_LONG.get(name)
            label = f"--{name}"
        elif arg.startswith("-") and len(arg) >= 2:
            spec = _BY_SHORT.get(arg[1])
            label = f"-{arg[1]}"
            rest = arg[2:]  # pflag: `-p=v` when something follows the `=`, else `-pv` (so `-p=` sets "=")
            has_value, value = bool(rest), rest[1:] if len(rest) > 1 and rest.startswith("=") else rest
        else:
            continue  # a positional word (also `-` alone): accepted and ignored, as upstream's command does
        if spec is None:
            raise UsageError(f"unknown flag: {label}")
        if not spec.takes_value:  # a bool: `--name` alone is true, `--name=false` false
            _store(values, spec, _parse(spec, value, label) if has_value else True)
            continue
        if not has_value:
            if i >= len(args):
                raise UsageError(f"flag needs an argument: {label}")
            value = args[i]
            i += 1
        try:
            value = _typed(spec, value)
        except ValueError as exc:
            raise UsageError(f"{exc} for {label}") from None
        _store(values, spec, _parse(spec, value, label))
    return values, want_help


def go_uint16(text: str) -> str:
    """pflag's uint16 (strconv.ParseUint(text, 0, 16)) as the decimal text the rules use; ValueError if it is not."""
    digits = text.lower()
    base = {"0x": 16, "0o": 8, "0b": 2}.get(digits[:2], 0)
    if base:
        digits = digits[2:]
        digits = digits[1:] if digits.startswith("_") else digits
    elif len(digits) > 1 and digits.startswith("0"):
        base, digits = 8, digits[1:]
    else:
        base = 10
    if not digits or not all(c.isalnum() or c == "_" for c in digits):
        raise ValueError(f"invalid unsigned 16-bit integer {text!r}")
    try:  # int() takes underscores between digits only, as Go's literals do
        number = int(digits, base)
    except ValueError:
        raise ValueError(f"invalid unsigned 16-bit integer {text!r}") from None
    if number > 0xFFFF:
        raise ValueError(f"unsigned 16-bit integer {text!r} out of range")
    return str(number)


def go_duration(text: str) -> str:
    """pflag's duration (time.ParseDuration) checked, kept as written; ValueError if Go would refuse it."""
    from istio_agent.capture.validation import parse_duration

    parse_duration(text[1:] if text[:1] in "+-" else text)
    return text


# Flags upstream declares as uint16 or duration rather than string: checked when read, as pflag does.
_TYPED: dict[str, Callable[[str], str]] = {"iptables_probe_port": go_uint16, "probe_timeout": go_duration}


def _typed(flag: Flag[Any], value: str) -> str:
    """`value` as pflag's typed flag would hold it (ValueError if it would refuse it); other flags' as given."""
    check = _TYPED.get(flag.dest or "")
    return check(value) if check is not None else value


def usage() -> str:
    lines = [
        "Usage: istio-iptables [flags]",
        "",
        ISTIO_IPTABLES.commands[0].summary,
        "",
        "Flags:",
    ]
    for flag in FLAGS:
        if not flag.dest:
            continue
        names = f"-{flag.short}, --{flag.name}" if flag.short else f"    --{flag.name}"
        arg = "" if flag.type_name == "bool" and not flag.takes_value else " string"
        env_note = f" [env {', '.join(flag.env)}]" if flag.env else ""
        lines.append(f"  {names}{arg}\n        {flag.description}{env_note}")
    lines.append("")
    lines.append("Environment only: " + ", ".join(f"{var.name} (default {var.default!r})" for _, var in ENV_ONLY))
    return "\n".join(lines) + "\n"


def build_config(args: Sequence[str], env: Mapping[str, str],
                 warn: Callable[[str], None] | None = None) -> tuple[CaptureConfig, bool]:
    from istio_agent.capture.config import CaptureConfig

    values, want_help = parse_args(args, env, warn)
    return CaptureConfig(**values), want_help


def run_cli(
    args: Sequence[str],
    env: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Exit code of `istio-iptables args`: 0; 255 for a command line that does not parse (upstream's
    `pilot-agent` exits -1 when cobra refuses its flags); 1 for a bad value or a failure; 126 for failed
    validation."""
    if env is None:
        from istio_agent.capture.procs import environment

        env = environment()
    out = stdout or sys.stdout
    err = stderr or sys.stderr

    def log(message: str) -> None:
        err.write(f"istio-iptables: {message}\n")

    try:
        cfg, want_help = build_config(args, env, log)
    except UsageError as exc:
        err.write(f"Error: {exc}\nRun 'istio-iptables --help' for usage.\n")
        return USAGE_EXIT_CODE
    if want_help:
        out.write(usage())
        return 0
    from istio_agent.capture.program import execute
    from istio_agent.capture.validation import ConfigError

    try:
        return execute(cfg, env, out, log)
    except ConfigError as exc:
        log(f"invalid value for {describe_field(exc.field)}: {exc.value!r}: {exc.reason}; nothing was applied")
    except (OSError, RuntimeError, ValueError) as exc:
        log(f"error: {exc}")
    return 1


def main() -> None:
    """Console-script (and lean launcher) entry point: the exit status of `run_cli`, without teardown.

    A run lives a few milliseconds: cyclic garbage collection is off (its passes during the imports buy
    nothing), and once the output is flushed nothing is left to do (files are closed where they are
    written) while the interpreter's teardown of its modules costs ~1.4 ms, a tenth of the whole run, so
    the process ends at once. When flushing fails (stdout closed early), the interpreter's own exit
    reports it, as it would.
    """
    import gc

    gc.disable()
    code = run_cli(sys.argv[1:])
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    import posix

    posix._exit(code)


def _build_click_command() -> click.Command:
    import click

    @click.command(
        "istio-iptables",
        context_settings={"ignore_unknown_options": True, "help_option_names": []},
        add_help_option=False,
        help=ISTIO_IPTABLES.commands[0].summary,
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @click.pass_context
    def istio_iptables(ctx: click.Context, args: tuple[str, ...]) -> None:
        ctx.exit(run_cli(list(args)))

    return istio_iptables


def __getattr__(name: str) -> click.Command:
    """`command` (the click command) is built lazily so that `main()` never imports click."""
    if name == "command":
        cmd = _build_click_command()
        globals()["command"] = cmd
        return cmd
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""`istio-iptables` (also `pilot-agent istio-iptables`): upstream's flags and environment.

Every flag of upstream's command is declared once in `FLAGS`, with the
environment variables that may set it; precedence is upstream's: default,
then the flag's own variable (`--foo-bar` <- `FOO_BAR`), then its additional
variables (e.g. `ISTIO_META_DNS_CAPTURE`), then the command line. Two flags
are ours, to pin host facts for reproducible dry runs: `--enable-ipv6` and
`--dns-servers`.

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

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import TextIO

    import click

    from istio_agent.capture.config import CaptureConfig

STR, BOOL, TRISTATE, LIST, IGNORED_STR, IGNORED_BOOL = "str", "bool", "tristate", "list", "ignored", "ignored-bool"

# (long name, short name, CaptureConfig attribute, kind, environment variables, help)
FLAGS: tuple[tuple[str, str, str, str, tuple[str, ...], str], ...] = (
    ("envoy-port", "p", "proxy_port", STR, (), "Envoy port to which all outbound TCP traffic is redirected (15001)."),
    ("inbound-capture-port", "z", "inbound_capture_port", STR, ("INBOUND_CAPTURE_PORT",),
     "Port to which all inbound TCP traffic is redirected (15006)."),
    ("inbound-tunnel-port", "e", "inbound_tunnel_port", STR, ("INBOUND_TUNNEL_PORT",),
     "Istio tunnel port for inbound TCP traffic, never redirected (15008)."),
    ("proxy-uid", "u", "proxy_uid", STR, ("PROXY_UID",),
     "Comma list of UIDs whose traffic is not redirected (default: uid of $ENVOY_USER, else 1337)."),
    ("proxy-gid", "g", "proxy_gid", STR, ("PROXY_GID",),
     "Comma list of GIDs whose traffic is not redirected (default: -u)."),
    ("istio-inbound-interception-mode", "m", "inbound_interception_mode", STR, ("ISTIO_INBOUND_INTERCEPTION_MODE",),
     "Inbound redirection mode: REDIRECT or TPROXY."),
    ("istio-inbound-ports", "b", "inbound_ports_include", STR, ("ISTIO_INBOUND_PORTS",),
     "Comma list of inbound ports to redirect, '*' for all, empty for none."),
    ("istio-local-exclude-ports", "d", "inbound_ports_exclude", STR, ("ISTIO_LOCAL_EXCLUDE_PORTS",),
     "Comma list of inbound ports not redirected (only with -b '*')."),
    ("istio-exclude-interfaces", "c", "exclude_interfaces", STR, ("ISTIO_EXCLUDE_INTERFACES",),
     "Comma list of interfaces whose traffic is never captured."),
    ("istio-service-cidr", "i", "outbound_ip_ranges_include", STR, ("ISTIO_SERVICE_CIDR",),
     "Comma list of CIDRs to redirect outbound, '*' for all, empty for none."),
    ("istio-service-exclude-cidr", "x", "outbound_ip_ranges_exclude", STR, ("ISTIO_SERVICE_EXCLUDE_CIDR",),
     "Comma list of CIDRs never redirected outbound."),
    ("istio-outbound-ports", "q", "outbound_ports_include", STR, ("ISTIO_OUTBOUND_PORTS",),
     "Comma list of outbound ports always redirected."),
    ("istio-local-outbound-ports-exclude", "o", "outbound_ports_exclude", STR, ("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE",),
     "Comma list of outbound ports never redirected."),
    ("kube-virt-interfaces", "k", "reroute_virtual_interfaces", STR, ("KUBE_VIRT_INTERFACES",),
     "Comma list of virtual interfaces whose inbound traffic is treated as outbound."),
    ("istio-inbound-tproxy-mark", "t", "inbound_tproxy_mark", STR, ("ISTIO_INBOUND_TPROXY_MARK",),
     "Packet mark used in TPROXY mode (1337)."),
    ("istio-inbound-tproxy-route-table", "r", "inbound_tproxy_route_table", STR, ("ISTIO_INBOUND_TPROXY_ROUTE_TABLE",),
     "Routing table used in TPROXY mode (133)."),
    ("dry-run", "n", "dry_run", BOOL, ("DRY_RUN",),
     "Touch nothing; record the commands to $DRY_RUN_FILE_PATH or stdout."),
    ("iptables-probe-port", "", "iptables_probe_port", STR, ("IPTABLES_PROBE_PORT",), "Validation probe port (15002)."),
    ("probe-timeout", "", "probe_timeout", STR, ("PROBE_TIMEOUT",), "Validation timeout, a Go duration (5s)."),
    ("skip-rule-apply", "", "skip_rule_apply", BOOL, ("SKIP_RULE_APPLY",), "Do not apply rules (validation only)."),
    ("run-validation", "", "run_validation", BOOL, ("RUN_VALIDATION",),
     "After applying, prove that redirection works; exit 126 if not."),
    ("redirect-dns", "", "redirect_dns", BOOL, ("REDIRECT_DNS", "ISTIO_META_DNS_CAPTURE"),
     "Redirect DNS to the agent on port 15053."),
    ("drop-invalid", "", "drop_invalid", BOOL, ("DROP_INVALID", "INVALID_DROP"),
     "Drop packets in conntrack state INVALID."),
    ("dual-stack", "", "dual_stack", BOOL, ("DUAL_STACK", "ISTIO_DUAL_STACK"),
     "Enable IPv4 and IPv6 redirection together."),
    ("capture-all-dns", "", "capture_all_dns", BOOL, ("CAPTURE_ALL_DNS",),
     "With --redirect-dns, capture all port-53 traffic, not only to resolv.conf servers."),
    ("network-namespace", "", "network_namespace", STR, ("NETWORK_NAMESPACE",),
     "Network namespace (a path such as /var/run/netns/x) to apply the rules in."),
    ("cni-mode", "", "cni_mode", BOOL, ("CNI_MODE",), "Run as part of the CNI plugin."),
    ("reconcile", "", "reconcile", BOOL, ("RECONCILE",), "Replace pre-existing, different Istio rules."),
    ("cleanup-only", "", "cleanup_only", BOOL, ("CLEANUP_ONLY",), "Only remove Istio chains and rules."),
    ("force-apply", "", "force_apply", BOOL, ("FORCE_APPLY",), "Apply even when the rules seem to be in place."),
    ("native-nftables", "", "native_nftables", BOOL, ("NATIVE_NFTABLES",), "Use native nftables instead of iptables."),
    ("force-iptables-binary", "", "force_iptables_binary", STR, ("FORCE_IPTABLES_BINARY",),
     "Choose the iptables backend: legacy or nft."),
    ("enable-ipv6", "", "enable_ipv6", TRISTATE, (), "Pin IPv6 on or off (true|false) instead of detecting it."),
    ("dns-servers", "", "dns_servers", LIST, (),
     "Pin the DNS servers (comma list, used verbatim) instead of resolv.conf."),
    ("log_output_level", "", "", IGNORED_STR, (), "Accepted for compatibility."),
    ("log_as_json", "", "", IGNORED_BOOL, (), "Accepted for compatibility."),
    ("log_caller", "", "", IGNORED_STR, (), "Accepted for compatibility."),
    ("log_stacktrace_level", "", "", IGNORED_STR, (), "Accepted for compatibility."),
    ("log_target", "", "", IGNORED_STR, (), "Accepted for compatibility."),
)  # fmt: skip

# Settings upstream reads only from the environment (always, with these defaults).
ENV_ONLY = (
    ("owner_groups_include", "ISTIO_OUTBOUND_OWNER_GROUPS", "*"),
    ("owner_groups_exclude", "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", ""),
    ("host_ipv4_loopback_cidr", "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/32"),
)

_BY_LONG = {f[0]: f for f in FLAGS}
_BY_SHORT = {f[1]: f for f in FLAGS if f[1]}


# The exit status of a command line that does not parse: upstream's pilot-agent exits with -1.
USAGE_EXIT_CODE = 255


class UsageError(ValueError):
    """Bad command line or environment."""


def _parse_bool(value: str, where: str) -> bool:
    from istio_agent.config.gobool import parse_bool

    try:
        return parse_bool(value)
    except ValueError:
        raise UsageError(f"invalid boolean {value!r} for {where}") from None


def describe_field(attr: str) -> str:
    """How a user sets a CaptureConfig attribute, for error messages."""
    for name, short, field, _, envs, _ in FLAGS:
        if field == attr or (attr.startswith("dns_servers") and field == "dns_servers"):
            flag = f"-{short}/--{name}" if short else f"--{name}"
            return f"{flag} ({', '.join(envs)})" if envs else flag
    for field, env, _ in ENV_ONLY:
        if field == attr:
            return f"${env}"
    return attr


def parse_args(args: Sequence[str], env: Mapping[str, str],
               warn: Callable[[str], None] | None = None) -> tuple[dict[str, object], bool]:
    """Config values from argv + environment (pflag syntax), and whether help was asked for.

    As upstream's command (cobra and pflag under `pilot-agent`): words that are not flags, and everything
    after `--`, are accepted and ignored; a variable whose boolean does not parse is ignored (pflag's Set
    fails and upstream drops the error), reported through `warn`; a bad flag is a UsageError.
    """
    values: dict[str, object] = {}
    for _name, _, attr, kind, envs, _ in FLAGS:
        for var in envs:
            if var not in env:
                continue
            if kind != BOOL:
                values[attr] = env[var]
                continue
            try:
                values[attr] = _parse_bool(env[var], f"${var}")
            except UsageError as exc:
                if warn is not None:
                    warn(f"{exc}: ignored, as upstream ignores it")
    for attr, check in _TYPED.items():  # pflag's uint16 and duration flags: Set fails and upstream drops it
        if attr in values:
            try:
                values[attr] = check(str(values[attr]))
            except ValueError as exc:
                del values[attr]
                if warn is not None:
                    warn(f"{exc} in the environment: ignored, as upstream ignores it")
    for attr, var, default in ENV_ONLY:
        values[attr] = env.get(var, default)
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
        _, _, attr, kind, _, _ = spec
        if kind in (BOOL, IGNORED_BOOL):
            flag_value = _parse_bool(value, label) if has_value else True
            if kind == BOOL:
                values[attr] = flag_value
            continue
        if not has_value:
            if i >= len(args):
                raise UsageError(f"flag needs an argument: {label}")
            value = args[i]
            i += 1
        if kind == STR:
            if attr in _TYPED:
                try:
                    value = _TYPED[attr](value)
                except ValueError as exc:
                    raise UsageError(f"{exc} for {label}") from None
            values[attr] = value
        elif kind == TRISTATE:
            values[attr] = _parse_bool(value, label)
        elif kind == LIST:
            from istio_agent.capture.hostfacts import split_servers

            try:
                values["dns_servers_v4"], values["dns_servers_v6"] = split_servers([s for s in value.split(",") if s])
            except ValueError as err:
                raise UsageError(f"invalid {label}: {err}") from None
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


def usage() -> str:
    lines = [
        "Usage: istio-iptables [flags]",
        "",
        "Set up iptables (or nftables) rules that redirect a pod's traffic through the Istio sidecar.",
        "",
        "Flags:",
    ]
    for name, short, _, kind, envs, text in FLAGS:
        if kind in (IGNORED_STR, IGNORED_BOOL):
            continue
        flag = f"-{short}, --{name}" if short else f"    --{name}"
        arg = "" if kind == BOOL else " string"
        env_note = f" [env {', '.join(envs)}]" if envs else ""
        lines.append(f"  {flag}{arg}\n        {text}{env_note}")
    lines.append("")
    lines.append("Environment only: " + ", ".join(f"{var} (default {default!r})" for _, var, default in ENV_ONLY))
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
        help="Set up iptables (or nftables) rules that redirect a pod's traffic through the Istio sidecar.",
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

"""`istio-iptables` flag and environment handling (upstream's pflag/BindEnv semantics)."""

from __future__ import annotations

import io

import pytest

from istio_agent.capture.flags import FLAGS
from istio_agent.cli.iptables import UsageError, parse_args, run_cli, usage


def parse(*args: str, **env: str) -> dict[str, object]:
    values, _ = parse_args(list(args), env)
    return values


@pytest.mark.parametrize(
    "args",
    [["-p", "16001"], ["-p16001"], ["-p=16001"], ["--envoy-port", "16001"], ["--envoy-port=16001"]],
)
def test_flag_spellings(args: list[str]) -> None:
    assert parse(*args)["proxy_port"] == "16001"


def test_empty_values_and_values_that_look_like_flags() -> None:
    assert parse("-b", "")["inbound_ports_include"] == ""
    assert parse("-x", "", "-b", "*")["outbound_ip_ranges_exclude"] == ""
    assert parse("-c", "-n")["exclude_interfaces"] == "-n"  # pflag takes the next word verbatim


def test_env_then_additional_env_then_flags() -> None:
    assert parse(REDIRECT_DNS="true")["redirect_dns"] is True
    assert parse(REDIRECT_DNS="true", ISTIO_META_DNS_CAPTURE="false")["redirect_dns"] is False
    assert parse("--redirect-dns", REDIRECT_DNS="false")["redirect_dns"] is True
    assert parse("--redirect-dns=false", ISTIO_META_DNS_CAPTURE="true")["redirect_dns"] is False
    assert parse(INVALID_DROP="1")["drop_invalid"] is True
    assert parse(ISTIO_DUAL_STACK="T")["dual_stack"] is True
    assert parse("-b", "80", ISTIO_INBOUND_PORTS="*")["inbound_ports_include"] == "80"
    assert parse(ISTIO_INBOUND_PORTS="*")["inbound_ports_include"] == "*"


def test_envoy_port_has_no_environment_variable() -> None:
    assert "proxy_port" not in parse(ENVOY_PORT="16001")


def test_env_only_settings_always_come_from_the_environment() -> None:
    values = parse()
    assert values["owner_groups_include"] == "*"
    assert values["owner_groups_exclude"] == ""
    assert values["host_ipv4_loopback_cidr"] == "127.0.0.1/32"
    assert parse(ISTIO_OUTBOUND_OWNER_GROUPS="java")["owner_groups_include"] == "java"


def test_pinned_host_facts() -> None:
    values = parse("--enable-ipv6=true", "--dns-servers=127.0.0.53,::127.0.0.53,10.0.0.1")
    assert values["enable_ipv6"] is True
    assert values["dns_servers_v4"] == ["127.0.0.53", "10.0.0.1"]
    assert values["dns_servers_v6"] == ["::127.0.0.53"]  # verbatim, not canonicalised
    assert parse("--enable-ipv6", "false")["enable_ipv6"] is False


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--no-such-flag"], {}, "unknown flag: --no-such-flag"),
        (["-Q"], {}, "unknown flag: -Q"),
        (["-p"], {}, "flag needs an argument: -p"),
        (["--redirect-dns=yes"], {}, "invalid boolean 'yes' for --redirect-dns"),
        (["--dns-servers=resolver.local"], {}, "invalid --dns-servers"),
        (["--enable-ipv6=auto"], {}, "invalid boolean 'auto' for --enable-ipv6"),
    ],
)
def test_usage_errors(args: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("$", r"\$")):
        parse_args(args, env)
    err = io.StringIO()
    assert run_cli(args, env, io.StringIO(), err) == 255  # upstream's pilot-agent exits -1 when cobra refuses
    assert message in err.getvalue()


@pytest.mark.parametrize("args", [["-n", "extra"], ["extra", "-n"], ["-n", "-"], ["-n", "--", "-p", "nope", "x"]])
def test_positional_words_are_ignored_as_upstream_does(args: list[str]) -> None:
    """cobra gives upstream's istio-iptables any positional words (and all after `--`), which it ignores."""
    values, _ = parse_args(args, {})
    assert values["dry_run"] is True and "proxy_port" not in values
    out = io.StringIO()
    assert run_cli(["--enable-ipv6=false", *args], {}, out, io.StringIO()) == 0
    assert "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in out.getvalue()


def test_a_variable_whose_boolean_does_not_parse_is_ignored_with_a_warning() -> None:
    """pflag's Set fails and upstream drops the error: the default (or an earlier variable) stays."""
    warnings: list[str] = []
    values, _ = parse_args([], {"DRY_RUN": "maybe", "REDIRECT_DNS": "true", "ISTIO_META_DNS_CAPTURE": "yes"},
                           warnings.append)
    assert "dry_run" not in values and values["redirect_dns"] is True
    assert warnings == ["invalid boolean 'maybe' for $DRY_RUN: ignored, as upstream ignores it",
                        "invalid boolean 'yes' for $ISTIO_META_DNS_CAPTURE: ignored, as upstream ignores it"]
    err = io.StringIO()
    assert run_cli(["-n", "--enable-ipv6=false"], {"DRY_RUN": "maybe"}, io.StringIO(), err) == 0
    assert "$DRY_RUN: ignored" in err.getvalue()


def test_compatibility_flags_are_accepted() -> None:
    out = io.StringIO()
    assert run_cli(["-n", "--enable-ipv6=false", "--log_output_level=default:info", "--log_as_json"], {}, out) == 0
    assert out.getvalue().startswith("iptables-save\nip6tables-save\n* nat\n")


def test_help_lists_every_flag() -> None:
    out = io.StringIO()
    assert run_cli(["--help"], {}, out) == 0
    text = out.getvalue()
    for flag in FLAGS:
        if not flag.dest:  # accepted for compatibility, not listed
            continue
        assert f"--{flag.name}" in text
        if flag.short:
            assert f"-{flag.short}, --{flag.name}" in text
        for env in flag.env:
            assert env in text
    assert usage() == text


def test_cleanup_only_dry_run_records_the_undo_commands() -> None:
    out = io.StringIO()
    assert run_cli(["-n", "--enable-ipv6=false", "--cleanup-only"], {}, out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0:2] == ["iptables-save", "ip6tables-save"]
    assert "iptables -t nat -D OUTPUT -j ISTIO_OUTPUT" in lines
    assert lines[-2:] == ["iptables -t nat -X ISTIO_INBOUND", "iptables-save"]


def test_native_nftables_dry_run_prints_the_script() -> None:
    out = io.StringIO()
    assert run_cli(["-n", "--enable-ipv6=false", "--native-nftables", "-i", "*"], {}, out) == 0
    assert "add rule ip istio-proxy-nat ISTIO_OUTPUT jump ISTIO_REDIRECT" in out.getvalue()


def test_pilot_agent_click_command_passes_arguments_through() -> None:
    from click.testing import CliRunner

    from istio_agent.cli import iptables

    result = CliRunner().invoke(iptables.command, ["-n", "--enable-ipv6=false", "-b", "", "-c", "eth0 -j ACCEPT"])
    assert result.exit_code == 1
    assert "--istio-exclude-interfaces" in result.output
    result = CliRunner().invoke(iptables.command, ["--help"])
    assert result.exit_code == 0 and "--istio-inbound-ports" in result.output

"""Every value that can reach a rule is validated first; nothing crafted gets through."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from istio_agent.capture.config import CaptureConfig
from istio_agent.capture.iptables_text import restore_text
from istio_agent.capture.rules import build_rules
from istio_agent.capture.validation import ConfigError, parse_duration, validate
from istio_agent.cli.iptables import run_cli

BASE = {"proxy_uid": "1337", "proxy_gid": "1337", "enable_ipv6": True}


def config(**values: object) -> CaptureConfig:
    return CaptureConfig(**{**BASE, **values})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("exclude_interfaces", "eth0 -j ACCEPT"),
        ("exclude_interfaces", "eth0\n-A OUTPUT -j DROP"),
        ("reroute_virtual_interfaces", "-j"),
        ("exclude_interfaces", "a" * 16),
        ("exclude_interfaces", "../x"),
        ("proxy_port", "0"),
        ("proxy_port", "65536"),
        ("proxy_port", "15001 -j DROP"),
        ("inbound_capture_port", "+15006"),
        ("inbound_tunnel_port", "015008"),
        ("iptables_probe_port", ""),
        ("inbound_ports_include", "80,http"),
        ("inbound_ports_exclude", "*"),
        ("outbound_ports_exclude", "22 -j ACCEPT"),
        ("outbound_ports_include", "8000:9000"),
        ("proxy_uid", "1337,root"),
        ("proxy_gid", "-1"),
        ("proxy_uid", "4294967295"),
        ("inbound_interception_mode", "tproxy"),
        ("inbound_interception_mode", "NONE"),
        ("inbound_tproxy_mark", "0x539"),
        ("inbound_tproxy_route_table", "254"),
        ("inbound_tproxy_route_table", "0"),
        ("outbound_ip_ranges_include", "10.0.0.0/8 -j ACCEPT"),
        ("outbound_ip_ranges_include", "10.0.0.1"),
        ("outbound_ip_ranges_exclude", "*"),
        ("outbound_ip_ranges_exclude", "1.1.1.1/33"),
        ("owner_groups_include", "java ftp"),
        ("owner_groups_exclude", "-j"),
        ("owner_groups_include", ",".join(str(g) for g in range(65))),
        ("host_ipv4_loopback_cidr", "10.0.0.0/8"),
        ("host_ipv4_loopback_cidr", "127.0.0.1/7"),
        ("host_ipv4_loopback_cidr", "::1/128"),
        ("dns_servers_v4", ["10.0.0.1 -j DROP"]),
        ("dns_servers_v4", ["::1"]),
        ("dns_servers_v6", ["10.0.0.1"]),
        ("probe_timeout", "5 seconds"),
        ("force_iptables_binary", "iptables-legacy"),
    ],
)
def test_bad_values_are_rejected_with_the_field_named(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        validate(config(**{field: value}))
    assert err.value.field == field


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("exclude_interfaces", "eth0,veth+,net-1,a.b"),
        ("inbound_ports_include", "*"),
        ("inbound_ports_exclude", "6000,7000,"),  # trailing comma: empty items are ignored (kit case)
        ("owner_groups_include", "java,202"),
        ("owner_groups_exclude", "888,ftp"),
        ("outbound_ip_ranges_include", "*"),
        ("outbound_ip_ranges_include", "10.0.0.0/8,2001:db8::/32"),
        ("host_ipv4_loopback_cidr", "127.0.0.1/8"),
        ("inbound_interception_mode", "TPROXY"),
        ("dns_servers_v6", ["::127.0.0.53"]),
        ("probe_timeout", "1m30.5s"),
        ("force_iptables_binary", "legacy"),
    ],
)
def test_good_values_pass(field: str, value: object) -> None:
    validate(config(**{field: value}))


def test_durations_follow_go() -> None:
    assert parse_duration("5s") == 5
    assert parse_duration("250ms") == pytest.approx(0.25)
    assert parse_duration("1h2m3s") == 3723
    assert parse_duration("0") == 0
    for bad in ("", "5", "s", "1.2.3s", "-5s", "5 s", "5d"):
        with pytest.raises(ValueError):
            parse_duration(bad)


TOKEN_TEXT = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=24),
    st.text(alphabet="0123456789abcdef,.:/*-+ \t\nj", max_size=24),  # near-valid, to reach the builder
)


@settings(max_examples=300, deadline=None)
@given(
    field=st.sampled_from(
        [
            "exclude_interfaces",
            "reroute_virtual_interfaces",
            "inbound_ports_include",
            "inbound_ports_exclude",
            "outbound_ports_include",
            "outbound_ports_exclude",
            "outbound_ip_ranges_include",
            "outbound_ip_ranges_exclude",
            "owner_groups_include",
            "owner_groups_exclude",
            "proxy_uid",
            "proxy_gid",
        ]
    ),
    value=TOKEN_TEXT,
)
def test_no_accepted_value_can_add_rule_arguments(field: str, value: str) -> None:
    """Whatever the text, it is either refused or ends up as whole, single rule arguments."""
    values: dict[str, object] = {"inbound_ports_include": "*", "inbound_interception_mode": "TPROXY", field: value}
    cfg = config(**values)
    try:
        validate(cfg)
    except ConfigError:
        return
    ruleset = build_rules(cfg)
    for rule in (*ruleset.v4, *ruleset.v6):
        for token in rule.params:
            assert token and token == token.strip() and not any(c.isspace() for c in token), rule
    text = restore_text(ruleset.v4)
    assert all(line.split(" ")[0] in ("*", "-N", "-A", "-I", "COMMIT") for line in text.splitlines())


def test_cli_rejects_injection_and_applies_nothing(tmp_path: Path) -> None:
    record = tmp_path / "record"
    err = io.StringIO()
    code = run_cli(
        ["-n", "--enable-ipv6=false", "-c", "eth0 -j ACCEPT"], {"DRY_RUN_FILE_PATH": str(record)}, io.StringIO(), err
    )
    assert code == 1
    message = err.getvalue()
    assert "-c/--istio-exclude-interfaces (ISTIO_EXCLUDE_INTERFACES)" in message
    assert "'eth0 -j ACCEPT'" in message and "nothing was applied" in message
    assert not record.exists()


def test_cli_names_env_only_settings() -> None:
    err = io.StringIO()
    env = {"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "10.0.0.0/8"}
    assert run_cli(["-n", "--enable-ipv6=false"], env, io.StringIO(), err) == 1
    assert "$ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR" in err.getvalue()


def test_env_values_are_validated_too() -> None:
    err = io.StringIO()
    assert run_cli(["-n", "--enable-ipv6=false"], {"ISTIO_SERVICE_CIDR": "*,x"}, io.StringIO(), err) == 1
    assert "--istio-service-cidr" in err.getvalue()

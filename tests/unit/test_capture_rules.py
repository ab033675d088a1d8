"""Rule semantics beyond the kit's cases, and the pure renderings derived from the rules.

The expectations follow upstream's rule order (tools/istio-iptables/pkg/capture
run.go); cases such as outbound port lists, inbound exclusions, capture-all
DNS and TPROXY with a port list are not in the conformance kit but are in
upstream's own test table.
"""

from __future__ import annotations

import pytest

from istio_agent.capture.config import CaptureConfig
from istio_agent.capture.iptables_text import (
    blocks_text,
    check_commands,
    cleanup_commands,
    dry_run_record,
    leftover_cleanup,
    parse_save,
    restore_text,
)
from istio_agent.capture.nft import _resolved, cleanup_script, nft_script, translate
from istio_agent.capture.rules import Rule, RuleSet, build_rules
from istio_agent.capture.validation import validate


def rules_of(v6: bool = False, **values: object) -> list[str]:
    cfg = CaptureConfig(proxy_uid="1337", proxy_gid="1337", enable_ipv6=True, **values)
    validate(cfg)
    ruleset = build_rules(cfg)
    return [f"{r.table}: {r.text()}" for r in ruleset.family(v6)]


def after(lines: list[str], anchor: str) -> list[str]:
    return lines[lines.index(anchor) + 1 :]


def test_outbound_port_exclusions_come_first_for_tcp_and_udp() -> None:
    lines = rules_of(outbound_ports_exclude="22,80")
    assert after(lines, "nat: -A OUTPUT -j ISTIO_OUTPUT")[:5] == [
        "nat: -A ISTIO_OUTPUT -p tcp --dport 22 -j RETURN",
        "nat: -A ISTIO_OUTPUT -p udp --dport 22 -j RETURN",
        "nat: -A ISTIO_OUTPUT -p tcp --dport 80 -j RETURN",
        "nat: -A ISTIO_OUTPUT -p udp --dport 80 -j RETURN",
        "nat: -A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN",
    ]


def test_outbound_port_inclusions_come_after_the_exclusions() -> None:
    lines = rules_of(v6=True, outbound_ports_include="32000,31000", outbound_ip_ranges_exclude="2001:db8::/32")
    assert lines[-3:] == [
        "nat: -A ISTIO_OUTPUT -d 2001:db8::/32 -j RETURN",
        "nat: -A ISTIO_OUTPUT -p tcp --dport 32000 -j ISTIO_REDIRECT",
        "nat: -A ISTIO_OUTPUT -p tcp --dport 31000 -j ISTIO_REDIRECT",
    ]


def test_inbound_exclusions_only_with_wildcard() -> None:
    lines = rules_of(inbound_ports_include="*", inbound_ports_exclude="22,80")
    assert after(lines, "nat: -A PREROUTING -p tcp -j ISTIO_INBOUND")[:3] == [
        "nat: -A ISTIO_INBOUND -p tcp --dport 22 -j RETURN",
        "nat: -A ISTIO_INBOUND -p tcp --dport 80 -j RETURN",
        "nat: -A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT",
    ]
    assert not [line for line in rules_of(inbound_ports_include="8080", inbound_ports_exclude="22") if "22" in line]


def test_tproxy_with_a_port_list() -> None:
    lines = rules_of(inbound_interception_mode="TPROXY", inbound_ports_include="32000,31000")
    assert after(lines, "mangle: -A PREROUTING -p tcp -j ISTIO_INBOUND")[:4] == [
        "mangle: -A ISTIO_INBOUND -p tcp --dport 32000 -m conntrack --ctstate RELATED,ESTABLISHED -j ISTIO_DIVERT",
        "mangle: -A ISTIO_INBOUND -p tcp --dport 32000 -j ISTIO_TPROXY",
        "mangle: -A ISTIO_INBOUND -p tcp --dport 31000 -m conntrack --ctstate RELATED,ESTABLISHED -j ISTIO_DIVERT",
        "mangle: -A ISTIO_INBOUND -p tcp --dport 31000 -j ISTIO_TPROXY",
    ]


def test_owner_group_filters() -> None:
    excluded = rules_of(owner_groups_exclude="888,ftp")
    assert after(excluded, "nat: -A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN")[:2] == [
        "nat: -A ISTIO_OUTPUT -m owner --gid-owner 888 -j RETURN",
        "nat: -A ISTIO_OUTPUT -m owner --gid-owner ftp -j RETURN",
    ]
    # An empty include list captures nobody: everything returns.
    assert "nat: -A ISTIO_OUTPUT -j RETURN" in rules_of(owner_groups_include="")


def test_capture_all_dns_needs_no_servers_and_covers_both_families() -> None:
    for v6 in (False, True):
        lines = rules_of(v6=v6, redirect_dns=True, capture_all_dns=True)
        assert "nat: -A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS" in lines
        assert "nat: -A ISTIO_OUTPUT_DNS -p tcp --dport 53 -j REDIRECT --to-ports 15053" in lines
        assert "nat: -A ISTIO_OUTPUT_DNS -p udp --dport 53 -j REDIRECT --to-port 15053" in lines
        raw = [line for line in lines if line.startswith("raw:")]
        assert raw[-3:] == [
            "raw: -A PREROUTING -j ISTIO_INBOUND",
            "raw: -A ISTIO_OUTPUT_DNS -p udp --dport 53 -j CT --zone 2",
            "raw: -A ISTIO_INBOUND -p udp --sport 53 -j CT --zone 1",
        ]


def test_redirect_dns_without_servers_is_off() -> None:
    assert not [line for line in rules_of(redirect_dns=True, dns_servers_v4=[]) if "53" in line]


def test_virtual_interfaces_for_ipv6() -> None:
    lines = rules_of(v6=True, reroute_virtual_interfaces="eth0,eth1", outbound_ip_ranges_include="*")
    assert lines[:2] == ["nat: -I PREROUTING 1 -i eth0 -j RETURN", "nat: -I PREROUTING 1 -i eth1 -j RETURN"]
    assert lines[-3:] == [
        "nat: -A ISTIO_OUTPUT -j ISTIO_REDIRECT",
        "nat: -I PREROUTING 1 -i eth0 -j ISTIO_REDIRECT",
        "nat: -I PREROUTING 1 -i eth1 -j ISTIO_REDIRECT",
    ]


def test_custom_loopback_range() -> None:
    lines = rules_of(host_ipv4_loopback_cidr="127.0.0.1/8")
    assert "nat: -A ISTIO_OUTPUT -d 127.0.0.1/8 -j RETURN" in lines
    assert not [line for line in lines if "127.0.0.1/32" in line]


def test_ipv6_rules_exist_only_with_ipv6() -> None:
    cfg = CaptureConfig(proxy_uid="1", proxy_gid="1", enable_ipv6=False)
    assert build_rules(cfg).v6 == ()
    assert restore_text(build_rules(cfg).v6) == ""


def test_cleanup_commands_follow_upstream_undo() -> None:
    cfg = CaptureConfig(proxy_uid="1337", proxy_gid="1337", enable_ipv6=False, exclude_interfaces="eth9")
    cmds = [" ".join(c) for c in cleanup_commands(build_rules(cfg).v4)]
    assert cmds == [
        "-t nat -D ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 "
        "-j ISTIO_IN_REDIRECT",
        "-t nat -D ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 "
        "-j ISTIO_IN_REDIRECT",
        "-t nat -D OUTPUT -j ISTIO_OUTPUT",
        "-t nat -D OUTPUT -o eth9 -j RETURN",
        "-t nat -D PREROUTING -i eth9 -j RETURN",
        "-t nat -F ISTIO_OUTPUT",
        "-t nat -X ISTIO_OUTPUT",
        "-t nat -F ISTIO_IN_REDIRECT",
        "-t nat -X ISTIO_IN_REDIRECT",
        "-t nat -F ISTIO_REDIRECT",
        "-t nat -X ISTIO_REDIRECT",
        "-t nat -F ISTIO_INBOUND",
        "-t nat -X ISTIO_INBOUND",
    ]
    record = dry_run_record(build_rules(cfg), ipv6=False, cleanup_only=True)
    assert record[:3] == ["iptables-save", "ip6tables-save", "iptables " + cmds[0]]
    assert record[-1] == "iptables-save"


def test_check_commands_drop_insert_positions() -> None:
    rule = Rule("nat", "PREROUTING", ("-I", "PREROUTING", "1", "-i", "eth0", "-j", "RETURN"))
    assert check_commands([rule]) == [("-t", "nat", "-C", "PREROUTING", "-i", "eth0", "-j", "RETURN")]


SAVED = """# Generated by iptables-save
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ISTIO_INBOUND - [0:0]
:ISTIO_OUTPUT - [0:0]
:USER - [0:0]
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A PREROUTING -p tcp -m tcp --dport 7 -j USER
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -j ISTIO_INBOUND
-A USER -j RETURN
COMMIT
*filter
:INPUT ACCEPT [0:0]
COMMIT
"""


def test_leftover_cleanup_removes_only_istio_chains_and_jumps() -> None:
    state = parse_save(SAVED)
    assert set(state["nat"]) == {"PREROUTING", "OUTPUT", "ISTIO_INBOUND", "ISTIO_OUTPUT", "USER"}
    assert blocks_text(leftover_cleanup(state)) == (
        "*nat\n"
        "-D PREROUTING -p tcp -j ISTIO_INBOUND\n"
        "-D OUTPUT -j ISTIO_OUTPUT\n"
        "-F ISTIO_INBOUND\n-F ISTIO_OUTPUT\n"
        "-X ISTIO_INBOUND\n-X ISTIO_OUTPUT\n"
        "COMMIT\n"
    )


def test_nft_translation_of_every_rule_kind() -> None:
    cfg = CaptureConfig(
        proxy_uid="1337,3",
        proxy_gid="1337",
        enable_ipv6=True,
        inbound_interception_mode="TPROXY",
        inbound_ports_include="*",
        inbound_ports_exclude="15020",
        outbound_ip_ranges_include="*",
        outbound_ip_ranges_exclude="10.1.0.0/16,fd00::/8",
        outbound_ports_exclude="22",
        outbound_ports_include="8443",
        exclude_interfaces="veth+",
        reroute_virtual_interfaces="tap0",
        owner_groups_include="java,202",
        redirect_dns=True,
        dns_servers_v4=["10.0.0.53"],
        dns_servers_v6=["fd00::53"],
        drop_invalid=True,
    )
    validate(cfg)
    script = nft_script(build_rules(cfg))
    assert script.startswith(cleanup_script())
    assert "add chain ip istio-proxy-mangle OUTPUT { type route hook output priority -150; policy accept; }" in script
    assert 'add rule ip istio-proxy-nat PREROUTING iifname "veth*" return' in script
    assert (
        'add rule ip istio-proxy-nat ISTIO_OUTPUT oifname "lo" ip daddr != 127.0.0.1/32 meta l4proto tcp '
        "tcp dport != { 53, 15008 } meta skuid 1337 jump ISTIO_IN_REDIRECT"
    ) in script
    assert 'meta skgid != "java" meta skgid != 202 return' in script
    assert "tproxy to :15006 meta mark set 1337 accept" in script
    assert "ct zone set 2" in script and "ct mark set meta mark" in script and "meta mark set ct mark" in script
    assert "add rule ip6 istio-proxy-nat ISTIO_OUTPUT ip6 daddr fd00::/8 return" in script
    assert "ct state invalid jump ISTIO_DROP" in script


def test_nft_resolves_insert_positions_like_the_kernel() -> None:
    rules = [
        Rule("nat", "PREROUTING", ("-A", "PREROUTING", "-j", "A")),
        Rule("nat", "PREROUTING", ("-I", "PREROUTING", "1", "-j", "B")),
        Rule("nat", "PREROUTING", ("-I", "PREROUTING", "1", "-j", "C")),
        Rule("nat", "PREROUTING", ("-I", "PREROUTING", "3", "-j", "D")),
    ]
    assert [r.params[-1] for r in _resolved(rules)["PREROUTING"]] == ["C", "B", "D", "A"]


def test_nft_refuses_what_it_cannot_translate() -> None:
    with pytest.raises(ValueError):
        translate(Rule("nat", "OUTPUT", ("-A", "OUTPUT", "-m", "comment", "--comment", "x", "-j", "RETURN")), False)


def test_ruleset_family_accessor() -> None:
    rs = RuleSet((), ())
    assert rs.family(True) == () and rs.family(False) == ()

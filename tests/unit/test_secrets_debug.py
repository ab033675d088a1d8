"""Secret diagnostics: SecretItem views of certificates, Envoy's config dump and the agent's cache; diff; output."""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
from typing import Any

import pytest

from istio_agent.pki.certs import build_csr, cert_to_pem, load_csr, new_root_ca, sign_workload_csr
from istio_agent.pki.keys import generate_key
from istio_agent.protos import typeurls
from istio_agent.security.core.secrets import SecretItem
from istio_agent.status.secrets_debug import (
    PRESENT,
    SecretDiff,
    SecretView,
    agent_views,
    describe,
    diff_secrets,
    disagreements,
    proxy_views,
    render_diffs,
    render_items,
    to_json_text,
)

NOW = time.time()
SPIFFE = "spiffe://cluster.local/ns/default/sa/echo"
ITEM_KEYS = ["resource_name", "cert", "source", "destination", "state", "trust_domain", "cert_valid",
             "serial_number", "not_after", "not_before", "type"]


def rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Pki:
    def __init__(self, now: float = NOW, ttl: float = 3600) -> None:
        self.root = new_root_ca(generate_key("ECDSA"), "cluster.local", now, 10 * ttl)
        self.root_pem = self.root.cert_pem.decode()
        self.now, self.ttl = now, ttl

    def leaf(self, now: float | None = None, ttl: float | None = None) -> tuple[str, int]:
        key = generate_key("ECDSA")
        cert = sign_workload_csr(self.root, load_csr(build_csr(key, [SPIFFE])), SPIFFE, now or self.now,
                                 ttl or self.ttl)
        return cert_to_pem(cert) + self.root_pem, cert.serial_number


@pytest.fixture(scope="module")
def pki() -> Pki:
    return Pki()


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def dump(active: list[dict[str, Any]] | None = None, warming: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"configs": [
        {"@type": "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump"},
        {"@type": typeurls.SECRETS_CONFIG_DUMP, "dynamic_active_secrets": active or [],
         "dynamic_warming_secrets": warming or []},
    ]}


def tls_entry(name: str, chain: str, version: str = "v1") -> dict[str, Any]:
    return {"name": name, "version_info": version, "secret": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret", "name": name,
        "tls_certificate": {"certificate_chain": {"inline_bytes": b64(chain)},
                            "private_key": {"inline_bytes": b64("[redacted]")}}}}


def root_entry(name: str, bundle: str) -> dict[str, Any]:
    return {"name": name, "version_info": "v1", "secret": {
        "name": name, "validation_context": {"trusted_ca": {"inline_bytes": b64(bundle)}}}}


# ---- describing certificates ----------------------------------------------------------------------------


def test_describe_a_workload_chain(pki: Pki) -> None:
    chain, serial = pki.leaf()
    view = describe("default", chain, "ACTIVE", NOW)
    assert view.type == "Cert Chain"
    assert view.cert_valid is True
    assert view.serial_number == format(serial, "x")
    assert view.serial_number == view.serial_number.lower() and not view.serial_number.startswith("0")
    assert view.not_after == rfc3339(NOW + 3600)
    assert dt.datetime.strptime(view.not_before, "%Y-%m-%dT%H:%M:%SZ") <= dt.datetime.strptime(
        rfc3339(NOW), "%Y-%m-%dT%H:%M:%SZ")
    assert view.cert == chain and view.state == "ACTIVE"


def test_describe_a_root_and_validity_window(pki: Pki) -> None:
    assert describe("ROOTCA", pki.root_pem, "ACTIVE", NOW).type == "CA"
    chain, _ = pki.leaf()
    assert describe("default", chain, "ACTIVE", NOW + 7200).cert_valid is False  # expired
    assert describe("default", chain, "ACTIVE", NOW - 7200).cert_valid is False  # not yet valid


@pytest.mark.parametrize("data", [
    "", "not a certificate", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"])
def test_describe_without_a_usable_certificate(data: str) -> None:
    view = describe("x", data, "WARMING", NOW)
    assert (view.type, view.cert_valid, view.serial_number, view.not_after) == ("", False, "", "")
    assert view.cert == data


# ---- Envoy's config dump --------------------------------------------------------------------------------


def test_proxy_views_from_a_config_dump(pki: Pki) -> None:
    chain, serial = pki.leaf()
    views = proxy_views(dump(
        active=[tls_entry("default", chain), root_entry("ROOTCA", pki.root_pem),
                {"name": "broken", "version_info": "uninitialized", "secret": {"name": "broken"}}],
        warming=[{"name": "file-root:/etc/ca.pem", "version_info": "uninitialized", "secret": {}}],
    ), NOW)
    assert [(v.resource_name, v.state, v.type, v.cert_valid) for v in views] == [
        ("file-root:/etc/ca.pem", "WARMING", "", False),
        ("default", "ACTIVE", "Cert Chain", True),
        ("ROOTCA", "ACTIVE", "CA", True),
        ("broken", "UNINITIALIZED", "", False),
    ]
    assert views[1].serial_number == format(serial, "x")
    assert views[1].cert == chain and views[2].cert == pki.root_pem


def test_proxy_views_with_spiffe_trust_domains(pki: Pki) -> None:
    other = Pki()
    entry = {"name": "ROOTCA", "secret": {"validation_context": {"custom_validator_config": {
        "name": "envoy.tls.cert_validator.spiffe", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.SPIFFECertValidatorConfig",
            "trust_domains": [{"name": "east.local", "trust_bundle": {"inline_bytes": b64(pki.root_pem)}},
                              {"name": "west.local", "trust_bundle": {"inline_string": other.root_pem}}]}}}}}
    views = proxy_views(dump(active=[entry]), NOW)
    assert [(v.resource_name, v.trust_domain, v.type) for v in views] == [
        ("ROOTCA", "east.local", "CA"), ("ROOTCA", "west.local", "CA")]
    table = render_items(views)
    assert table.splitlines()[0].endswith("TRUST DOMAIN")
    assert table.splitlines()[2].endswith("west.local")


def test_proxy_views_of_an_envoy_without_secrets() -> None:
    assert proxy_views({"configs": [{"@type": typeurls.SECRETS_CONFIG_DUMP}]}, NOW) == []
    assert proxy_views({"configs": []}, NOW) == []


@pytest.mark.parametrize("bad", [
    [],
    {"configs": "x"},
    {"configs": [{"@type": typeurls.SECRETS_CONFIG_DUMP, "dynamic_active_secrets": ["x"]}]},
    {"configs": [{"@type": typeurls.SECRETS_CONFIG_DUMP, "dynamic_active_secrets": [
        {"name": "d", "secret": {"tls_certificate": {"certificate_chain": {"inline_bytes": "!!"}}}}]}]},
])
def test_malformed_config_dump(bad: Any) -> None:
    with pytest.raises(ValueError):
        proxy_views(bad, NOW)


# ---- the agent's side ---------------------------------------------------------------------------------------


def test_agent_views_from_the_cache_snapshot(pki: Pki) -> None:
    chain, _ = pki.leaf()
    items = [SecretItem("default", cert_chain=chain.encode(), private_key=b"KEY", root_cert=pki.root.cert_pem,
                        source="ca"),
             SecretItem("ROOTCA", root_cert=pki.root.cert_pem, source="ca"),
             SecretItem("file-root:/etc/ca.pem", root_cert=pki.root.cert_pem, source="file:/etc/ca.pem")]
    views = agent_views(items, NOW)
    assert [(v.resource_name, v.type, v.state, v.source) for v in views] == [
        ("default", "Cert Chain", "ACTIVE", "ca"), ("ROOTCA", "CA", "ACTIVE", "ca"),
        ("file-root:/etc/ca.pem", "CA", "ACTIVE", "file:/etc/ca.pem")]
    assert views[0].cert == chain
    assert "KEY" not in to_json_text(views)  # keys are never listed


def test_json_keys_and_round_trip(pki: Pki) -> None:
    view = describe("ROOTCA", pki.root_pem, "ACTIVE", NOW, source="ca")
    [obj] = json.loads(to_json_text([view]))
    assert list(obj) == ITEM_KEYS
    assert SecretView.from_json(obj) == view
    [diff] = json.loads(to_json_text([SecretDiff(PRESENT, "ACTIVE", view)]))
    assert list(diff) == ["agent", "proxy", *ITEM_KEYS]
    assert to_json_text([view]).startswith('[\n {\n  "resource_name": "ROOTCA"')  # MarshalIndent(.., "", " ")
    with pytest.raises(ValueError):
        SecretView.from_json({"cert": "x"})


# ---- the diff -------------------------------------------------------------------------------------------------


def test_in_sync(pki: Pki) -> None:
    chain, _ = pki.leaf()
    proxy = proxy_views(dump(active=[tls_entry("default", chain), root_entry("ROOTCA", pki.root_pem)]), NOW)
    agent = [describe("default", chain, "ACTIVE", NOW, source="ca"),
             describe("ROOTCA", pki.root_pem, "ACTIVE", NOW, source="ca")]
    diffs = diff_secrets(agent, proxy)
    assert [(d.item.resource_name, d.agent, d.proxy, d.item.source) for d in diffs] == [
        ("ROOTCA", PRESENT, "ACTIVE", "ca"), ("default", PRESENT, "ACTIVE", "ca")]
    assert disagreements(diffs) == []


def test_envoy_still_serving_the_old_serial_after_a_rotation(pki: Pki) -> None:
    old_chain, old_serial = pki.leaf()
    new_chain, new_serial = pki.leaf(now=NOW + 10)
    proxy = proxy_views(dump(active=[tls_entry("default", old_chain), root_entry("ROOTCA", pki.root_pem)]), NOW)
    agent = [describe("default", new_chain, "ACTIVE", NOW, source="ca"),
             describe("ROOTCA", pki.root_pem, "ACTIVE", NOW, source="ca")]
    diffs = diff_secrets(agent, proxy)
    assert [(d.item.resource_name, d.agent, d.proxy, d.item.serial_number) for d in diffs] == [
        ("ROOTCA", PRESENT, "ACTIVE", diffs[0].item.serial_number),
        ("default", "", "ACTIVE", format(old_serial, "x")),
        ("default", PRESENT, "", format(new_serial, "x")),
    ]
    problems = disagreements(diffs)
    assert problems == [
        f"default: Envoy holds serial {old_serial:x} (ACTIVE), the agent does not",
        f"default: the agent holds serial {new_serial:x}, Envoy does not",
    ]
    table = render_diffs(diffs).splitlines()
    assert table[0].split() == ["RESOURCE", "NAME", "TYPE", "VALID", "CERT", "NODE", "AGENT", "PROXY", "SERIAL",
                                "NUMBER", "NOT", "AFTER", "NOT", "BEFORE"]
    assert table[2].split()[:4] == ["default", "Cert", "Chain", "true"] and f"{old_serial:x}" in table[2]


def test_warming_secret_is_a_disagreement(pki: Pki) -> None:
    proxy = proxy_views(dump(warming=[{"name": "default", "secret": {}}]), NOW)
    chain, _ = pki.leaf()
    problems = disagreements(diff_secrets([describe("default", chain, "ACTIVE", NOW)], proxy))
    assert problems[0] == "default: Envoy holds serial (no certificate) (WARMING), the agent does not"
    assert len(problems) == 2


def test_nothing_on_either_side() -> None:
    assert diff_secrets([], []) == []
    assert render_diffs([]) == "No secrets found to diff.\n"
    assert render_items([]) == "No secret items to show.\n"


# ---- the table ------------------------------------------------------------------------------------------------


def test_table_layout_like_istioctl() -> None:
    views = [
        SecretView("default", state="ACTIVE", cert_valid=True, serial_number="6fbee254c22900615cb1f74e3d2f1713",
                   not_after="2030-05-16T01:32:52Z", not_before="2030-05-15T01:30:52Z", type="Cert Chain"),
        SecretView("ROOTCA", state="ACTIVE", cert_valid=False, serial_number="1f", not_after="2033-05-02T03:41:33Z",
                   not_before="2023-05-05T03:41:33Z", type="CA"),
        SecretView("configmap://some/thing", state="WARMING"),
    ]
    # Widths: longest cell + 5 spaces; the last column is not padded; trailing blanks trimmed.
    widths = [22 + 5, 10 + 5, 7 + 5, 10 + 5, 32 + 5, 20 + 5]

    def line(*cells: str) -> str:
        return ("".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)) + cells[-1]).rstrip()

    assert render_items(views) == "\n".join([
        line("RESOURCE NAME", "TYPE", "STATUS", "VALID CERT", "SERIAL NUMBER", "NOT AFTER", "NOT BEFORE"),
        line("default", "Cert Chain", "ACTIVE", "true", "6fbee254c22900615cb1f74e3d2f1713", "2030-05-16T01:32:52Z",
             "2030-05-15T01:30:52Z"),
        line("ROOTCA", "CA", "ACTIVE", "false", "1f", "2033-05-02T03:41:33Z", "2023-05-05T03:41:33Z"),
        "configmap://some/thing" + " " * 20 + "WARMING     false",
    ]) + "\n"


# ---- the agent's endpoint ---------------------------------------------------------------------------------------


class SnapshotOnly:
    """Just the part of SecretCache the endpoint reads."""

    def __init__(self, items: list[SecretItem]) -> None:
        self.items = items

    def snapshot(self) -> list[SecretItem]:
        return self.items


@pytest.mark.parametrize(("peer", "status"), [("127.0.0.1", 200), ("::1", 200), ("10.0.0.7", 403)])
async def test_debug_endpoint_is_localhost_only(pki: Pki, peer: str, status: int) -> None:
    from istio_agent.httpio.routing import Router
    from istio_agent.httpio.server_core import Request, Response
    from istio_agent.status.secrets_debug import DEBUG_SECRETS_PATH, add_secrets_debug_route

    app = Router()
    cache = SnapshotOnly([SecretItem("ROOTCA", root_cert=pki.root.cert_pem, source="ca")])
    add_secrets_debug_route(app, cache, clock=lambda: NOW)  # type: ignore[arg-type]
    handler = app.resolve("GET", DEBUG_SECRETS_PATH)
    assert not isinstance(handler, Response)
    response = await handler(Request("GET", DEBUG_SECRETS_PATH, DEBUG_SECRETS_PATH, "", (), peer))
    assert response.status == status
    if status == 200:
        assert dict(response.headers)["Content-Type"].startswith("application/json")
        [item] = json.loads(response.body)
        assert (item["resource_name"], item["type"], item["state"]) == ("ROOTCA", "CA", "ACTIVE")

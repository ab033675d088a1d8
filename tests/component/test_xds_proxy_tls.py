"""The XDS proxy's upstream TLS: the istiod root from the pod path, `localhost` → istiod's name, ISTIOD_SAN."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import grpc.aio
import pytest
from cryptography.hazmat.primitives import serialization
from test_xds_proxy_ads import NODE, AdsClient, FakeAds, clusters, resource_names

from istio_agent.pki.certs import CertificateAuthority, issue_server_cert, new_root_ca
from istio_agent.pki.keys import generate_key
from istio_agent.protos import typeurls
from istio_agent.xds import XdsProxy, XdsProxyOptions
from istio_agent.xds.upstream import UpstreamSettings


def _root() -> CertificateAuthority:
    return new_root_ca(generate_key("ECDSA"), "cluster.local", time.time(), 3600)


def _server_credentials(ca: CertificateAuthority, names: list[str]) -> grpc.ServerCredentials:
    key = generate_key("ECDSA")
    cert = issue_server_cert(ca, key, names, [], time.time(), 3600)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return grpc.ssl_server_credentials([(key_pem, cert.public_bytes(serialization.Encoding.PEM))])


async def _fetch_clusters(tmp_path: Path, settings: UpstreamSettings) -> list[str]:
    """Open one SotW stream through a proxy with `settings`; the CDS names, or AioRpcError."""
    proxy = XdsProxy(XdsProxyOptions(socket_path=tmp_path / "XDS", upstream=settings))
    await proxy.start()
    client = AdsClient(tmp_path / "XDS", delta=False)
    try:
        await client.subscribe(typeurls.CLUSTER, NODE)
        return resource_names(await client.read())
    finally:
        await client.close()
        await proxy.stop()


@pytest.mark.parametrize(
    ("server_name", "istiod_san"),
    [("istiod.istio-system.svc", ""), ("istiod.example.org", "istiod.example.org")],
    ids=["localhost-means-istiod", "istiod-san"],
)
async def test_tls_with_mounted_root(tmp_path: Path, server_name: str, istiod_san: str) -> None:
    ca = _root()
    ads = FakeAds({typeurls.CLUSTER: clusters(2)})
    port = await ads.start(credentials=_server_credentials(ca, [server_name]))
    root = tmp_path / "var/run/secrets/istio/root-cert.pem"
    root.parent.mkdir(parents=True)
    root.write_bytes(ca.cert_pem)
    try:
        settings = UpstreamSettings(f"localhost:{port}", workdir=tmp_path, istiod_san=istiod_san)
        names = await _fetch_clusters(tmp_path, settings)
        assert len(names) == 2
    finally:
        await ads.stop()


async def test_tls_refuses_an_untrusted_istiod(tmp_path: Path) -> None:
    ads = FakeAds({typeurls.CLUSTER: clusters(1)})
    port = await ads.start(credentials=_server_credentials(_root(), ["istiod.istio-system.svc"]))
    other = tmp_path / "other-root.pem"
    other.write_bytes(_root().cert_pem)
    try:
        settings = UpstreamSettings(f"localhost:{port}", workdir=tmp_path, root_ca=str(other), dial_timeout=1.0)
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await _fetch_clusters(tmp_path, settings)
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ads.requests == []
    finally:
        await ads.stop()


async def test_missing_root_is_named(tmp_path: Path) -> None:
    settings = UpstreamSettings("localhost:1", workdir=tmp_path)
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await _fetch_clusters(tmp_path, settings)
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "root-cert.pem" in (failure.value.details() or "")

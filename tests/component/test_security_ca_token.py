"""A pod whose token file is missing: the CA's refusal, as the agent reports it, names the path it tried."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest
from launchers import IstiodLocal
from security_harness import pod_options, sleep_pod, token_path

from istio_agent.pki import certs, keys
from istio_agent.security.ca_client import CaClient, CaError

SPIFFE = "spiffe://cluster.local/ns/default/sa/sleep"


async def test_missing_token_is_named_in_the_ca_refusal(tmp_path: Path, istiod: IstiodLocal,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    pod = tmp_path / "pod"
    sleep_pod(istiod, pod)
    token = token_path(pod)
    token.unlink()
    client = CaClient(pod_options(pod, istiod))
    try:
        with caplog.at_level(logging.WARNING, logger="istio_agent.security.ca_client"), \
                pytest.raises(CaError) as refused:
            await client.sign(certs.build_csr(keys.generate_key("ECDSA"), [SPIFFE]), 600)
    finally:
        await client.close()
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    message = str(refused.value)
    assert "no authorization header" in message, "istiod-local's own reason"
    assert f"no bearer token was sent: {token} is missing or empty" in message
    assert f"cannot read token file {token}" in caplog.text

"""The committed generated modules must be exactly what protoc makes of the committed `.proto` files."""

from __future__ import annotations

from pathlib import Path

from istio_agent.protos import generate, health_pb2, istioca_pb2, nds_pb2


def test_generated_modules_match_protos(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    assert written, "protoc wrote nothing"
    for fresh in written:
        committed = generate.SRC_ROOT / fresh.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is missing: run `make protos`"
        assert committed.read_text() == fresh.read_text(), f"{committed} is stale: run `make protos`"


def test_upstream_names_and_field_numbers() -> None:
    req = istioca_pb2.IstioCertificateRequest.DESCRIPTOR
    assert req.full_name == "istio.v1.auth.IstioCertificateRequest"
    assert {f.name: f.number for f in req.fields} == {"csr": 1, "validity_duration": 3, "metadata": 4}
    assert istioca_pb2.IstioCertificateResponse.DESCRIPTOR.fields_by_name["cert_chain"].number == 1
    svc = istioca_pb2.DESCRIPTOR.services_by_name["IstioCertificateService"]
    assert svc.full_name == "istio.v1.auth.IstioCertificateService"
    info = nds_pb2.NameInfo.DESCRIPTOR
    assert {f.name: f.number for f in info.fields} == {
        "ips": 1, "registry": 2, "shortname": 3, "namespace": 4, "alt_hosts": 5,
    }
    assert nds_pb2.NameTable.DESCRIPTOR.full_name == "istio.networking.nds.v1.NameTable"
    assert health_pb2.HealthInformation.DESCRIPTOR.full_name == "istio.v1.HealthInformation"

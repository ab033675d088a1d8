"""The baseline for bench_identity: the least a process can do to get a workload certificate.

Generate a key and CSR, call istiod-local's CreateCertificate over TLS with the
pod's token, write the three files. No configuration, no cache, no SDS: what
`pilot-agent` is compared against.
Usage: minimal_ca_client.py POD_DIR OUT_DIR ADDRESS ALGORITHM
"""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from istio_agent.protos import istioca_pb2, istioca_pb2_grpc


def main() -> None:
    pod, out, address, algorithm = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
    if algorithm == "ECDSA":
        key = ec.generate_private_key(ec.SECP256R1())
    else:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    san = x509.SubjectAlternativeName([x509.UniformResourceIdentifier("spiffe://cluster.local/ns/default/sa/sleep")])
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).add_extension(san, False)
    csr_pem = csr.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()
    root = (pod / "var/run/secrets/istio/root-cert.pem").read_bytes()
    token = (pod / "var/run/secrets/tokens/istio-token").read_text().strip()
    creds = grpc.ssl_channel_credentials(root_certificates=root)
    options = [("grpc.ssl_target_name_override", "istiod.istio-system.svc")]
    with grpc.secure_channel(address, creds, options=options) as channel:
        stub = istioca_pb2_grpc.IstioCertificateServiceStub(channel)
        resp = stub.CreateCertificate(
            istioca_pb2.IstioCertificateRequest(csr=csr_pem, validity_duration=3600),
            metadata=[("authorization", f"Bearer {token}"), ("clusterid", "Kubernetes")],
        )
    out.mkdir(parents=True, exist_ok=True)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    (out / "key.pem").write_bytes(key_pem)
    (out / "root-cert.pem").write_text(resp.cert_chain[-1])
    (out / "cert-chain.pem").write_text("".join(resp.cert_chain[:-1]))


if __name__ == "__main__":
    main()

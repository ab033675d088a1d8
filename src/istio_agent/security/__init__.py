"""Workload identity: CA client, secret cache, file-mounted certificates, SDS server, OUTPUT_CERTS.

The agent uses one entry point, `identity.WorkloadIdentity(options.SecurityOptions)`;
other components reach the secrets through its `.cache` (`SecretCache`), which
performs what the sans-IO `core.cert_lifecycle.CertificateLifecycle` decides.

Place tells the parts apart: `core/` holds the sans-IO rules (rotation and
retry decisions, SDS subscription state, secrets and their wire form), the
top level the I/O edges (gRPC to the CA and to Envoy, files, threads, the
kernel's peer credentials) and `options`. Imports nothing.
"""

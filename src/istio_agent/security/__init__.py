"""Workload identity: CA client, secret cache, file-mounted certificates, SDS server, OUTPUT_CERTS.

The agent uses one entry point, `identity.WorkloadIdentity(options.SecurityOptions)`;
other components reach the secrets through its `.cache` (`SecretCache`), which
performs what the sans-IO `cert_lifecycle.CertificateLifecycle` decides.
"""

"""`istiod-local`: a single-node control plane (CA, token issuer, registry, xDS) for a mesh on one machine.

A separate program: it shares `config/`, `pki/`, `protos/` and the small
top-level libraries with the agent and never imports the agent's runtime.
`server` runs it; `ca_service` / `signing` / `tokens` are the CA and its
Kubernetes-style service-account tokens; `xds/` turns the registry file into
Envoy and gRPC resources and serves them over ADS.
"""

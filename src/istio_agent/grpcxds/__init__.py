"""Proxyless gRPC: the xDS bootstrap file the agent writes for gRPC applications, and its readiness probe.

`bootstrap` builds the document (sans-IO) and `gojson` renders it byte for
byte as upstream's Go encoder does; `writer` puts it on disk atomically at
agent start; `readiness` says when the pod may be ready (bootstrap loads,
certificate files exist).

The package imports none of them: the options import `bootstrap`'s types in every agent, and a sidecar
never needs the writer or the probe.
"""

"""Proxyless gRPC: the xDS bootstrap file the agent writes for gRPC applications, and its readiness probe.

`bootstrap` builds the document (sans-IO) and `gojson` renders it byte for
byte as upstream's Go encoder does; `writer` puts it on disk atomically at
agent start; `readiness` says when the pod may be ready (bootstrap loads,
certificate files exist).
"""

from istio_agent.grpcxds.bootstrap import GrpcBootstrapFile, GrpcBootstrapOptions, build_bootstrap, render_bootstrap
from istio_agent.grpcxds.readiness import BootstrapProbe
from istio_agent.grpcxds.writer import BootstrapWriter, write_bootstrap_file

__all__ = ["BootstrapProbe", "BootstrapWriter", "GrpcBootstrapFile", "GrpcBootstrapOptions", "build_bootstrap",
           "render_bootstrap", "write_bootstrap_file"]

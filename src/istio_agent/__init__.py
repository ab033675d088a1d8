"""istio-agent: Istio's node-side data plane in Python (see docs/ARCHITECTURE.md for the package map)."""

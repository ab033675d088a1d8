"""The Istio CNI: the `istio-cni` plugin (`plugin/`), the `install-cni` node agent (`install/`) and the repair
controller it runs (`repair/`); docs/CNI.md describes them.

Separate programs from the agent: they share `capture/` (the rules a pod gets), `config/` parsers, `kube/` (the
Kubernetes API clients), `metrics/` and `lifecycle.py` with it, and never import the agent's runtime. The
plugin's per-pod path stays light (no asyncio, click, protobuf or grpc).
"""

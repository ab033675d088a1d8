"""The Istio CNI plugin (`istio-cni`) and node agent (`install-cni`): not built yet (the CNI issue).

A separate program: it will share `capture/`, `config/` and `protos/` with the
agent and never import the agent's runtime.
"""

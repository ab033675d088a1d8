"""istiod-local: the local environment that runs a whole Istio mesh on one machine.

istiod-local's control plane (CA, token issuer, registry, xDS, the slice of the
Kubernetes API the CNI uses), the local node whose pods are network namespaces
built through a real CNI chain, `istiod-local up` (a mesh file brought up and
checked) and its live view. It depends on the product (`istio_agent`) and is
never imported by it.
"""

"""`istio-cni`: the chained CNI plugin that programs a sidecar pod's traffic capture in its network namespace."""

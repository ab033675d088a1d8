"""`install-cni`: the Istio CNI node agent (plugin install, conflist merge, watch and repair, cleanup)."""

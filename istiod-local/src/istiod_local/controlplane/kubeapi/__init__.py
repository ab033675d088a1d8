"""The slice of the Kubernetes API the Istio CNI uses, served by istiod-local (pods, namespaces, discovery)."""

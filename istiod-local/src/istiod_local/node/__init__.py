"""The local node: pods as network namespaces on one machine, for tests and `make run`.

`plan` computes names, addresses and commands (pure); `local_node.LocalNode`
builds and removes the node with `ip`, `istio-iptables`, `istiod-local` and
`pilot-agent`; `processes` holds the process and namespace plumbing;
`runtime` the node's directory under /run that uid 1337 (the agent and
Envoy) can reach wherever the work directory is (pod directories, a reachable
Envoy); `container` the istio-proxy container the agent runs in (uid 1337,
its image of the interpreter, its volumes' owners and modes);
`echo_app` is the HTTP echo app (and client) the demo pods run.
`proxyless` plans pods after Istio's grpc-agent template (pure), whose
containers get their volumes through mount namespaces on host mount points
that `mountpoints` shares between nodes; `grpc_apps` are the gRPC apps
(xDS greeter, clients, load generator) such pods run.
In CNI capture mode (the default) pods' networks are built through a CNI
chain: `cni_runtime` is the CNI runtime (what libcni does: run a conflist's
plugins, cache results, DEL and CHECK), `cni_plan` the node's CNI layout,
install-cni's command line and the kubelet's status reports (pure), and
`cni_node` runs install-cni, the chain, istio-validation and those reports.
`upstream` finds upstream Istio's own Go commands, which may replace ours:
a pod's agent (`PodSpec.agent_implementation`) and the node's install-cni
(`NodeOptions.cni`).
"""

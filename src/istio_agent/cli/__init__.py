"""The command lines: `pilot-agent`, `istio-iptables`, `istiod-local` (and `pilot-agent secrets`).

With `config/`, the only place that reads the process environment; nothing
imports this package. Heavy modules load per subcommand, so the hooks a pod
runs (`pilot-agent wait`, `request`) start fast.
"""

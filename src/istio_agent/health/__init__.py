"""The workload health checker (upstream's `pkg/istio-agent/health`): ProxyConfig's `readinessProbe` run on
its schedule, Envoy's readiness folded in, state changes reported to istiod through the XDS proxy.

`options` (light: resolved before anything starts), `checker` (the sans-IO
thresholds and schedule), `probers` (the probes' I/O), `runner` (the component).
"""

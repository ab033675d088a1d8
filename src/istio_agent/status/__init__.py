"""The status server on :15020: readiness, merged Prometheus metrics, rewritten app probes, quit/drain, debug.

`options.StatusOptions` is what the options resolver builds; `readiness`,
`merged_metrics.merge`, `merged_metrics.filter` and `probes.rules` are the sans-IO
rules; `server` (on `istio_agent.httpio`: h11 under asyncio streams) and the
route modules (`merged_metrics.handler`, `probes.prober`, `ndsz`,
`secrets_debug`) are the HTTP edge; `agent_metrics` owns the agent's own
`istio_agent_*` metrics.
"""

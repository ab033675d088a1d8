"""The status server on :15020: readiness, merged Prometheus metrics, rewritten app probes, quit/drain, debug.

`options.StatusOptions` is what the options resolver builds; `readiness`,
`metrics_merge`, `metrics_filter` and `probes` are the sans-IO rules; `server`
(on `istio_agent.httpio`: h11 under asyncio streams) and the route modules
(`metrics_handler`, `probes_prober`, `ndsz`, `secrets_debug`) are the HTTP
edge; `agent_metrics` owns the agent's own `istio_agent_*` metrics.
"""

"""The merged scrape of :15020 (`/stats/prometheus`, `/metrics`): the agent's own registry, Envoy's and the app's.

`merge` (targets, format negotiation) and `filter` (each source validated,
converted, cut at family boundaries) are sans-IO; `handler` is the streamed
HTTP edge. Not to be confused with `istio_agent.metrics`, the agent's own
metrics library. Imports nothing: the options resolver loads `merge` alone.
"""

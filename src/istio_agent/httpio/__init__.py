"""HTTP/1.1 on h11 under asyncio streams: the agent's small HTTP server and client.

The agent's HTTP needs are small (the :15020 status server, scrapes of Envoy
and the app, probes, Envoy's admin API), and every agent's resident memory is
multiplied by the pods of a cluster: h11, the sans-IO HTTP/1.1 library, costs
a fraction of aiohttp's footprint. `server_core` (limits, request checks,
response framing) and `routing` are sans-IO; `server` and `client` are the
thin asyncio edges.
"""

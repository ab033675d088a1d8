"""The app probes the injector moved onto :15020 (`/app-health/...`), run as the kubelet would run them.

`rules` (the parser and the kubelet's rules) and `wire` (what an HTTPS probe
sends, how its body decodes, the HTTP/2 ping rules) are sans-IO; `prober` (the
routes, TCP and gRPC probes), `https` (the HTTP(S) client, loaded on the first
HTTP probe) and `h2` (HTTP/2, loaded when an app selects it) are the I/O edge.
Imports nothing: the options resolver loads `rules` alone.
"""

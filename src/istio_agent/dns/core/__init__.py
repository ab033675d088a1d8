"""The DNS proxy's sans-IO core: `table` (upstream's naming rules), `answers` (pre-packed wire answers),
`responder` (the per-packet decision), `wire` (message validation, truncation), `tcp_framing` (DNS-over-TCP
framing and deadlines), `tcp_admission` (who keeps a TCP connection slot) and `ndsz` (the /debug/ndsz view).
No sockets, threads or event loop here: the package's top level (`proxy`, `tcp`, `forward`) does the I/O.
Imports nothing.
"""

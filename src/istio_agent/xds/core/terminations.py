"""How an XDS proxy stream ended, as upstream's agent counts it: a cancellation or an error (sans-IO).

Upstream counts every end of the two streams of a proxied connection, istiod's
side in `istio_agent_istiod_connection_terminations{type}` and Envoy's in
`istio_agent_envoy_connection_terminations{type}`, `type` being `cancelled` or
`error` by its rule for gRPC errors: a clean end (EOF, status OK), CANCELLED or
DEADLINE_EXCEEDED, UNAVAILABLE whose message says the peer or the transport
closed, and the two NO_ERROR resets are cancellations; anything else is an
error. Those messages are Go gRPC's; grpcio (C-core) words the same events its
own way, and its words for them are matched too (a server closing its
connection is `Socket closed` here, `error reading from server: EOF` there).

The side that did not end the stream is torn down by the proxy, which upstream
sees as a cancellation of that side (its receive fails with CANCELLED).
"""

from __future__ import annotations

CANCELLED = "cancelled"
ERROR = "error"

_CANCELLING_CODES = frozenset(("OK", "CANCELLED", "DEADLINE_EXCEEDED"))
# Go gRPC's messages upstream expects of a peer going away, then grpcio's for the same events.
_EXPECTED_UNAVAILABLE = ("client disconnected", "error reading from server: EOF", "transport is closing",
                         "Socket closed", "GOAWAY received", "FD shutdown")
_EXPECTED_ANYWHERE = ("stream terminated by RST_STREAM with error code: NO_ERROR",
                      "received prior goaway: code: NO_ERROR")


def termination_type(code: str, details: str) -> str:
    """`cancelled` or `error` for a stream that ended with gRPC status `code` (its name) and `details`."""
    if code in _CANCELLING_CODES:
        return CANCELLED
    if code == "UNAVAILABLE" and any(message in details for message in _EXPECTED_UNAVAILABLE):
        return CANCELLED
    if any(message in details for message in _EXPECTED_ANYWHERE):
        return CANCELLED
    return ERROR

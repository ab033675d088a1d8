"""`/debug/ndsz` on the status server: the NameTable the DNS proxy serves, as JSON, to localhost only."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from istio_agent.dns.core.ndsz import name_table_json
from istio_agent.httpio.routing import Router
from istio_agent.httpio.server_core import Request, Response, json_response, text_response
from istio_agent.netaddr import is_localhost

if TYPE_CHECKING:
    from istio_agent.protos import nds_pb2

NameTableSource = Callable[[], "nds_pb2.NameTable | None"]


def add_ndsz_route(app: Router, source: NameTableSource) -> None:
    """Serve `source()` (None: no DNS proxy, or no table yet) at `/debug/ndsz`."""

    async def ndsz(request: Request) -> Response:
        if not is_localhost(request.remote):
            return text_response(403, "only requests from localhost are allowed")
        status, body = name_table_json(source())
        if status == 404:  # upstream writes `{}` without a Content-Type, which Go sniffs as text/plain
            return text_response(status, body)
        return json_response(status, body)

    app.add("/debug/ndsz", ndsz)  # any method, as upstream's ServeMux routes it

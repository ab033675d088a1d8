"""`/debug/ndsz` on the status server: the NameTable the DNS proxy serves, as JSON, to localhost only."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from istio_agent.dns.ndsz import name_table_json
from istio_agent.netaddr import is_localhost

if TYPE_CHECKING:
    from istio_agent.protos import nds_pb2

NameTableSource = Callable[[], "nds_pb2.NameTable | None"]


def add_ndsz_route(app: web.Application, source: NameTableSource) -> None:
    """Serve `source()` (None: no DNS proxy, or no table yet) at `/debug/ndsz`."""

    async def ndsz(request: web.Request) -> web.Response:
        if not is_localhost(request.remote):
            return web.Response(status=403, text="only requests from localhost are allowed")
        status, body = name_table_json(source())
        return web.Response(status=status, text=body, content_type="application/json")

    app.router.add_get("/debug/ndsz", ndsz)

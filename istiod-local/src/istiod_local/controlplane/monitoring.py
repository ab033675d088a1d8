"""istiod-local's monitoring port (istiod's :15014): `/metrics`, `/debug/connections`, `/debug/syncz`.

`XdsMonitor` is the sans-IO part: the ADS server tells it about streams
(connected, each request, each response written, closed) and it keeps what
upstream's xDS metrics and debug pages show, with time passed in:

* `/metrics` (Prometheus text), upstream's names: `pilot_xds{version}` (connected proxies by
  Istio version), `pilot_xds_pushes{type}` (responses sent), `pilot_total_xds_rejects{type}` and
  the older per-type gauges `pilot_xds_{cds,eds,lds,rds}_reject`, `pilot_xds_expired_nonce`,
  `pilot_services`; and two of our own: `istiod_local_mesh_version` and
  `istiod_local_last_push_timestamp_seconds` (when a mesh change last went out).
* `/debug/connections`: upstream's AdsClients shape (`totalClients`, `clients` with
  `connectionId`, `connectedAt`, `address`), plus `watches` (type -> resource names, "*" for
  wildcard), as upstream's adsz shows.
* `/debug/syncz`: upstream's SyncStatus per proxy (`proxy`, `proxy_type`, `istio_version`,
  `cluster_sent`/`cluster_acked` ... nonces, `resources` type -> `sent`, `acked`, `sentTime`,
  `lastError`).

A reject is counted for every request carrying an error detail, as upstream
counts them (before any nonce check). `MonitoringServer` is the aiohttp edge.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from istio_agent.gojson import go_number
from istio_agent.protos import typeurls

log = logging.getLogger("istiod_local.controlplane.monitoring")

DEFAULT_MONITORING_ADDR = "127.0.0.1:15014"
# The types upstream's syncz reports by name (SyncStatus' *_sent/*_acked fields).
_SYNCZ_FIELDS = ((typeurls.CLUSTER, "cluster"), (typeurls.LISTENER, "listener"), (typeurls.ROUTE, "route"),
                 (typeurls.ENDPOINT, "endpoint"), (typeurls.EXTENSION_CONFIG, "extensionconfig"))
# Types where a SotW request naming nothing asks for everything (as `xds/sessions.py`).
_WILDCARD_TYPES = frozenset({typeurls.CLUSTER, typeurls.LISTENER, typeurls.NAME_TABLE})
_LEGACY_REJECTS = {typeurls.CLUSTER: "pilot_xds_cds_reject", typeurls.ENDPOINT: "pilot_xds_eds_reject",
                   typeurls.LISTENER: "pilot_xds_lds_reject", typeurls.ROUTE: "pilot_xds_rds_reject"}


def metric_type(type_url: str) -> str:
    """Upstream's `GetMetricType`: `cds`, `lds`, ... for known types, else the URL."""
    short = typeurls.short(type_url)
    return short.lower() if short != type_url else type_url


def _time(epoch: float | None) -> str:
    """RFC 3339 in UTC with nanosecond-free precision, as Go's time.Time marshals; Go's zero time for None."""
    if epoch is None:
        return "0001-01-01T00:00:00Z"
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat().replace("+00:00", "Z")


@dataclass
class WatchState:
    nonce_sent: str = ""
    nonce_acked: str = ""
    last_send: float | None = None
    last_error: str = ""
    names: frozenset[str] | None = None  # None: wildcard


@dataclass
class StreamState:
    connection_id: str
    proxy_id: str
    proxy_type: str
    address: str
    istio_version: str
    connected_at: float
    watches: dict[str, WatchState] = field(default_factory=dict)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class XdsMonitor:
    """Counters and per-stream push status, fed by the ADS server."""

    def __init__(self) -> None:
        self.streams: dict[str, StreamState] = {}
        self.pushes: dict[str, int] = {}
        self.rejects: dict[str, int] = {}
        self.legacy_rejects: dict[tuple[str, str], int] = {}  # (metric, node) -> count
        self.expired_nonces = 0
        self.last_push: float | None = None

    # ---- feeding -------------------------------------------------------------------------------------------
    def connected(self, connection_id: str, proxy_id: str, proxy_type: str, address: str, istio_version: str,
                  now: float) -> None:
        self.streams[connection_id] = StreamState(connection_id, proxy_id, proxy_type, address, istio_version, now)

    def disconnected(self, connection_id: str) -> None:
        self.streams.pop(connection_id, None)

    def request(self, connection_id: str, type_url: str, response_nonce: str, error: str | None,
                names: Collection[str] = (), delta: bool = False) -> None:
        """A request read from the stream: an ACK (nonce of the last response), a NACK (`error`), or new.

        `names`: the resources it names (SotW: all it wants, none meaning all; Delta: new subscriptions).
        """
        stream = self.streams.get(connection_id)
        if stream is None:
            return
        watch = stream.watches.setdefault(type_url, WatchState())
        if delta:
            if names:
                watch.names = (watch.names or frozenset()) | frozenset(names)
        else:
            watch.names = frozenset(names) if names else (None if type_url in _WILDCARD_TYPES else frozenset())
        if error is not None:
            self.rejects[type_url] = self.rejects.get(type_url, 0) + 1
            legacy = _LEGACY_REJECTS.get(type_url)
            if legacy is not None:
                key = (legacy, stream.proxy_id)
                self.legacy_rejects[key] = self.legacy_rejects.get(key, 0) + 1
            watch.last_error = error
            return
        if not response_nonce:
            return
        if response_nonce != watch.nonce_sent:
            self.expired_nonces += 1
            return
        watch.nonce_acked, watch.last_error = response_nonce, ""

    def sent(self, connection_id: str, type_url: str, nonce: str, now: float, push: bool) -> None:
        """A response written; `push`: it went out because the mesh changed, not because it was asked for."""
        self.pushes[type_url] = self.pushes.get(type_url, 0) + 1
        if push:
            self.last_push = now
        stream = self.streams.get(connection_id)
        if stream is not None:
            watch = stream.watches.setdefault(type_url, WatchState())
            watch.nonce_sent, watch.last_send = nonce, now

    # ---- rendering -----------------------------------------------------------------------------------------
    def metrics_text(self, mesh_version: int | None = None, services: int | None = None) -> str:
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: Sequence[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            # Every digit (counts as integers, timestamps in full): `:g` kept six, 17 minutes off an epoch.
            lines.extend(f"{name}{labels} {go_number(value)}" for labels, value in samples)

        by_version: dict[str, int] = {}
        for stream in self.streams.values():
            by_version[stream.istio_version] = by_version.get(stream.istio_version, 0) + 1
        family("pilot_xds", "gauge", "Proxies with an open ADS stream, by their Istio version.",
               [(f'{{version="{_escape(v)}"}}', n) for v, n in sorted(by_version.items())])
        family("pilot_xds_pushes", "counter", "xDS responses written to proxies, by type.",
               [(f'{{type="{_escape(metric_type(t))}"}}', n) for t, n in sorted(self.pushes.items())])
        family("pilot_total_xds_rejects", "counter",
               "xDS responses a proxy refused (requests carrying an error detail), by type.",
               [(f'{{type="{_escape(metric_type(t))}"}}', n) for t, n in sorted(self.rejects.items())])
        for metric in sorted(set(_LEGACY_REJECTS.values())):
            samples = [(f'{{node="{_escape(node)}"}}', n) for (m, node), n in sorted(self.legacy_rejects.items())
                       if m == metric]
            family(metric, "gauge", f"Refused {metric.split('_')[2].upper()} responses, by proxy.", samples)
        family("pilot_xds_expired_nonce", "counter", "xDS requests answering a response other than the last one sent.",
               [("", self.expired_nonces)])
        if services is not None:
            family("pilot_services", "gauge", "Services in the registry in service.", [("", services)])
        if mesh_version is not None:
            family("istiod_local_mesh_version", "gauge", "The mesh (registry snapshot) version in service.",
                   [("", mesh_version)])
        family("istiod_local_last_push_timestamp_seconds", "gauge",
               "When a mesh change was last pushed to a proxy, in seconds since the epoch (0: never).",
               [("", self.last_push or 0.0)])
        return "\n".join(lines) + "\n"

    def connections(self) -> dict[str, Any]:
        clients = []
        for stream in sorted(self.streams.values(), key=lambda s: s.connection_id):
            watches = {t: (["*"] if w.names is None or "*" in w.names else sorted(w.names))
                       for t, w in sorted(stream.watches.items())}
            clients.append({"connectionId": stream.connection_id, "connectedAt": _time(stream.connected_at),
                            "address": stream.address, "watches": watches})
        out: dict[str, Any] = {"totalClients": len(clients)}
        if clients:
            out["clients"] = clients
        return out

    def syncz(self, namespace: str = "") -> list[dict[str, Any]]:
        out = []
        for stream in sorted(self.streams.values(), key=lambda s: s.connection_id):
            node_namespace = stream.proxy_id.split("~")[2].rpartition(".")[2] if stream.proxy_id.count("~") == 3 \
                else ""
            if namespace and node_namespace != namespace:
                continue
            status: dict[str, Any] = {"proxy": stream.proxy_id, "proxy_type": stream.proxy_type}
            if stream.istio_version:
                status["istio_version"] = stream.istio_version
            for type_url, prefix in _SYNCZ_FIELDS:
                watch = stream.watches.get(type_url)
                if watch is not None and watch.nonce_sent:
                    status[f"{prefix}_sent"] = watch.nonce_sent
                if watch is not None and watch.nonce_acked:
                    status[f"{prefix}_acked"] = watch.nonce_acked
            resources = {}
            for type_url, watch in sorted(stream.watches.items()):
                entry: dict[str, Any] = {"sentTime": _time(watch.last_send)}
                if watch.nonce_sent:
                    entry["sent"] = watch.nonce_sent
                if watch.nonce_acked:
                    entry["acked"] = watch.nonce_acked
                if watch.last_error:
                    entry["lastError"] = watch.last_error
                resources[type_url] = entry
            if resources:
                status["resources"] = resources
            out.append(status)
        return out


class MonitoringServer:
    """The HTTP edge: `/metrics`, `/debug/connections`, `/debug/syncz` on `address` (aiohttp)."""

    def __init__(self, address: str, monitor: XdsMonitor,
                 mesh: Callable[[], tuple[int, int]] | None = None) -> None:
        self.address = address
        self.monitor = monitor
        self._mesh = mesh  # () -> (mesh version, number of services)
        self._runner: Any = None
        self.bound = ""

    async def start(self) -> None:
        from aiohttp import web

        from istio_agent.netaddr import split_host_port

        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/debug/connections", self._connections)
        app.router.add_get("/debug/syncz", self._syncz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        host, port = split_host_port(self.address)
        site = web.TCPSite(runner, host or None, int(port), reuse_address=True)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        sockets = getattr(site._server, "sockets", None) or []
        if sockets:
            bound_host, bound_port = sockets[0].getsockname()[:2]
            self.bound = f"{bound_host}:{bound_port}" if ":" not in bound_host else f"[{bound_host}]:{bound_port}"
        log.info("monitoring serving on %s (/metrics, /debug/connections, /debug/syncz)", self.bound or self.address)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics(self, request: Any) -> Any:
        from aiohttp import web

        version, services = self._mesh() if self._mesh is not None else (None, None)
        return web.Response(text=self.monitor.metrics_text(version, services),
                            content_type="text/plain", charset="utf-8", headers={"X-Content-Type-Options": "nosniff"})

    async def _connections(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text=json.dumps(self.monitor.connections(), indent=2), content_type="application/json")

    async def _syncz(self, request: Any) -> Any:
        from aiohttp import web

        namespace = request.query.get("namespace", "")
        return web.Response(text=json.dumps(self.monitor.syncz(namespace), indent=2), content_type="application/json")

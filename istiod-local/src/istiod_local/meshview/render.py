"""Drawing a `MeshView`: rich tables for a terminal, one plain line per change otherwise.

`render(view)` returns a rich renderable (the pods table, the services table,
istiod-local's line, the last events); `render_text(view, width)` draws it to a
string without a terminal (what the tests compare). `log_lines(at, changes)`
formats the plain log: a timestamp and one change per line.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterable

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from istiod_local.meshview.model import MeshView, PodView, ServiceView


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 0:
        return "expired"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.0f}d"


def _ready(pod: PodView) -> Text:
    if pod.mode == "none":
        return Text("-", style="dim")
    if pod.ready is None:
        return Text("?", style="yellow")
    return Text("ready", style="green") if pod.ready else Text("not ready", style="red")


def _xds(pod: PodView) -> str:
    """`CDS 3/0 LDS 3/0 ...`: ACKed / NACKed responses per type."""
    if not pod.xds:
        return "-"
    return " ".join(f"{kind.upper()} {int(c.acks)}/{int(c.nacks)}" for kind, c in pod.xds.items())


def _ms(value: float | None) -> str:
    return "-" if value is None else (f"{value:.1f}" if value < 100 else f"{value:.0f}")


def _shown(pods: list[PodView], max_rows: int | None) -> tuple[list[PodView], list[PodView]]:
    """The pods that fit in `max_rows` (one row kept for "… N more"): those not ready or failing first."""
    if max_rows is None or len(pods) <= max_rows:
        return pods, []
    keep = max(1, max_rows - 1)
    ranked = sorted(range(len(pods)), key=lambda i: (pods[i].ready is not False and not pods[i].error, i))
    chosen = set(ranked[:keep])
    return [p for i, p in enumerate(pods) if i in chosen], [p for i, p in enumerate(pods) if i not in chosen]


def pods_table(view: MeshView, max_rows: int | None = None) -> Table:
    pods = list(view.pods)
    ready = sum(1 for p in pods if p.ready)
    meshed = sum(1 for p in pods if p.mode != "none")
    table = Table(title=f"pods ({len(pods)}; {ready} of {meshed} in the mesh ready)", title_justify="left",
                  expand=False, pad_edge=False)
    for column in ("pod", "ip", "mode", "agent", "identity", "cert", "rot", "ready", "xDS ack/nack", "dns loc/fwd",
                   "wasm"):
        table.add_column(column, no_wrap=True)
    shown, hidden = _shown(pods, max_rows)
    for pod in shown:
        identity = Text(pod.identity or "-", style="" if pod.identity_confirmed else "dim")
        cert = "-" if pod.mode == "none" else _duration(pod.cert_expires_in)
        dns = "-" if pod.mode == "none" else f"{pod.dns_local}/{pod.dns_forwarded}"
        table.add_row(f"{pod.namespace}/{pod.name}", pod.ip, pod.mode, pod.agent or "-", identity, cert,
                      "-" if pod.mode == "none" else str(pod.rotations), _ready(pod), _xds(pod), dns, _wasm(pod))
    if hidden:
        table.add_row(Text(f"… {len(hidden)} more ({sum(1 for p in hidden if p.ready)} ready)", style="dim"))
    return table


def _wasm(pod: PodView) -> Text | str:
    """Modules its agent holds for Envoy, and failed fetches in red; "-" for a pod without any."""
    if not pod.wasm_modules and not pod.wasm_failures:
        return "-"
    failed = f" ({pod.wasm_failures} failed)" if pod.wasm_failures else ""
    return Text(f"{pod.wasm_modules}{failed}", style="red" if pod.wasm_failures else "")


def _service_row(service: ServiceView) -> tuple[str, ...]:
    errors = f"{service.errors_per_s:.1f}" if service.errors_per_s else "0"
    return (service.short, f"{service.rps:.1f}", errors, _ms(service.p50_ms), _ms(service.p99_ms),
            f"{service.connections_per_s:.1f}", str(service.clients))


def services_table(view: MeshView) -> Table:
    table = Table(title=f"services ({len(view.services)})", title_justify="left", pad_edge=False)
    for column in ("service", "req/s", "err/s", "p50 ms", "p99 ms", "conn/s", "clients"):
        table.add_column(column, no_wrap=True, justify="left" if column == "service" else "right")
    for service in view.services:
        table.add_row(*_service_row(service))
    return table


def istiod_line(view: MeshView) -> Text:
    istiod = view.istiod
    if istiod is None:
        return Text("istiod-local: not watched", style="dim")
    if not istiod.reachable:
        return Text(f"{istiod.name}: monitoring unreachable ({istiod.error})", style="red")
    ago = "never" if istiod.last_push_ago is None else f"{_duration(istiod.last_push_ago)} ago"
    if istiod.name != "istiod-local":  # the real istiod's metrics say no mesh version nor last push
        return Text(f"{istiod.name}: {istiod.connected} proxies connected, {int(istiod.pushes)} pushes "
                    f"({int(istiod.rejects)} rejected)")
    return Text(f"{istiod.name}: {istiod.connected} proxies connected, mesh version {istiod.version or '-'}, "
                f"{int(istiod.pushes)} pushes ({int(istiod.rejects)} rejected), last push {ago}")


def events_text(view: MeshView) -> Text:
    text = Text("recent events:", style="bold")
    for event in view.events:
        text.append(f"\n  {time.strftime('%H:%M:%S', time.localtime(event.at))} {event.text}")
    return text


def render(view: MeshView, height: int | None = None, note: str = "") -> RenderableType:
    """The whole view; with `height` (the terminal's rows) the pods table gives up rows so the rest stays."""
    stamp = time.strftime("%H:%M:%S", time.localtime(view.at))
    max_rows = None
    if height is not None:
        # header 1; pods table title, borders and header 5; services table the same plus its rows;
        # istiod's line 1; events 1 plus theirs.
        fixed = 1 + 5 + (5 + len(view.services)) + 1 + (1 + len(view.events))
        max_rows = max(3, height - fixed)
    header = f"istio-agent mesh view  {stamp}" + (f"  ({note})" if note else "")
    return Group(Text(header, style="bold"), pods_table(view, max_rows), services_table(view),
                 istiod_line(view), events_text(view))


def render_text(view: MeshView, width: int = 160, height: int | None = None) -> str:
    """The view as plain text (no colours), as a terminal `width` columns (and `height` rows) would show it."""
    buffer = io.StringIO()
    Console(file=buffer, width=width, force_terminal=False, color_system=None, no_color=True).print(
        render(view, height))
    return buffer.getvalue()


def log_lines(at: float, changes: Iterable[str]) -> list[str]:
    stamp = time.strftime("%H:%M:%S", time.localtime(at))
    return [f"{stamp} {line}" for line in changes]

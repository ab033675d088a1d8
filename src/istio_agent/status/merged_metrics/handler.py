"""`/stats/prometheus` and `/metrics` on the status server: the merged scrape, as a streamed `httpio` answer.

Thin I/O around `merge`. One scrape:

1. opens every source at once (Envoy's `localhost:15090/stats/prometheus` with the
   scraper's query string, as upstream, then each app target on localhost), asking
   only for formats the merge can use;
2. fixes the answer's format: text if the scraper does not take OpenMetrics, else
   from the Content-Types the sources answered with last time; only when those are
   not known yet does it wait for every source's headers (at most 80 % of the scrape
   budget = `X-Prometheus-Scrape-Timeout-Seconds` minus a margin); then sends the
   headers (gzip when asked) and the agent's registry;
3. takes the sources in order, each with a fair share of the time left (what remains
   divided by the sources still to go, headers by the 80 % mark): waits for its
   headers, then streams its body through its `SourceFilter`. A source that hangs or
   stalls costs only its share; bodies not read yet wait in the socket buffers, so
   memory stays flat whatever the page sizes, while Envoy's page streams out as a
   slower app is still rendering its own;
4. writes `# EOF` once, last, for OpenMetrics.

The sources are fetched over `httpio.client`'s keep-alive pool (h11); the answer
is a body stream the server pulls as the socket takes it, so a slow scraper
holds back the sources instead of filling memory.

A failing source (refused, non-200, protobuf, too large, malformed, too slow) is
logged and counted in `istio_agent_scrape_failures_total{type=envoy|application|agent}`
(upstream's metric); its error text never reaches the body, and the others are
still served.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from istio_agent.httpio.client import Pool, PooledResponse
from istio_agent.httpio.routing import Router
from istio_agent.httpio.server_core import Request, Response, text_response
from istio_agent.metrics import CollectorRegistry, Sum
from istio_agent.netaddr import is_localhost
from istio_agent.status.merged_metrics.filter import (
    SourceError,
    SourceFilter,
    SourceTooLarge,
)
from istio_agent.status.merged_metrics.merge import (
    EOF_LINE,
    TEXT_OUTPUT,
    TIMEOUT_HEADER,
    Format,
    MetricsOptions,
    OutputFormat,
    accepted_openmetrics,
    accepts_gzip,
    agent_exposition,
    output_format,
    scrape_budget,
    source_accept_header,
    source_format,
)

log = logging.getLogger(__name__)

HEADERS_SHARE = 0.8  # of the budget, for every source's response headers
READ_SIZE = 65536
ENVOY, APPLICATION, AGENT = "envoy", "application", "agent"  # upstream's failure `type` labels


@dataclass(frozen=True)
class Source:
    kind: str  # ENVOY or APPLICATION
    url: str


class ScrapeCounters:
    """Upstream's `istio_agent_scrapes_total` and `istio_agent_scrape_failures_total{type}` (sums, as upstream
    writes them: those names, no `_created`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.scrapes = Sum("istio_agent_scrapes_total", "The total number of scrapes.", registry=registry)
        self.failures = Sum("istio_agent_scrape_failures_total", "The total number of failed scrapes.",
                            ["type"], registry=registry)
        for kind in (ENVOY, APPLICATION, AGENT):
            self.failures.labels(kind)  # present at 0 from the start, so rate() has a baseline


class MergedMetricsHandler:
    """Serves the merged page; one client pool (keep-alive to Envoy and the apps) for every scrape."""

    def __init__(self, options: MetricsOptions, registry: CollectorRegistry) -> None:
        self.options = options
        self.registry = registry
        self.counters = ScrapeCounters(registry)
        self._pool: Pool | None = None
        self._failing: set[str] = set()  # sources whose last scrape failed: log once per outage
        # Each source's last format per Accept we sent it, to fix the answer's format early.
        self._formats: dict[tuple[str, str], Format] = {}

    def sources(self, query_string: str = "") -> list[Source]:
        host, out = self.options.host, []
        if self.options.envoy_port is not None:
            url = f"http://{host}:{self.options.envoy_port}/stats/prometheus"
            out.append(Source(ENVOY, f"{url}?{query_string}" if query_string else url))
        out += [Source(APPLICATION, f"http://{host}:{t.port}{t.path}") for t in self.options.app_targets]
        return out

    def add_routes(self, app: Router) -> None:
        # Any method, as upstream's ServeMux routes (a POST scrapes too).
        app.add("/stats/prometheus", self.handle)
        app.add("/metrics", self.handle)
        app.on_close(self.close)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    def _client(self) -> Pool:
        # No proxies from the environment, no cookies: these are loopback fetches.
        if self._pool is None:
            self._pool = Pool()
        return self._pool

    # --- bookkeeping ---------------------------------------------------------------------------------------
    def _failed(self, kind: str, name: str, reason: object) -> None:
        self.counters.failures.labels(kind).inc()
        if name not in self._failing:
            self._failing.add(name)
            log.warning("merged metrics: %s %s failed: %s", kind, name, reason or type(reason).__name__)
        else:
            log.debug("merged metrics: %s %s failed: %s", kind, name, reason)

    def _succeeded(self, name: str) -> None:
        if name in self._failing:
            self._failing.discard(name)
            log.info("merged metrics: %s is back", name)

    # --- the scrape ----------------------------------------------------------------------------------------
    async def _open(self, source: Source, headers: dict[str, str]) -> tuple[PooledResponse, Format]:
        response = await self._client().request(source.url, headers.items())
        try:
            if response.status != 200:
                raise SourceError(f"HTTP status {response.status}")
            fmt = source_format(response.header("Content-Type") or "")
            if fmt is None:
                raise SourceError(f"cannot merge Content-Type {response.header('Content-Type')!r}")
            if response.content_length is not None and response.content_length > self.options.body_cap:
                raise SourceTooLarge(f"Content-Length {response.content_length} exceeds {self.options.body_cap}")
        except BaseException:
            response.close()
            raise
        return response, fmt

    def _known_output(self, om_version: str, sources: Sequence[Source]) -> OutputFormat | None:
        """The answer's format if it can be fixed before any source answers, else None.

        Text when the scraper does not take OpenMetrics; otherwise the format the sources
        answered in last time (a source that changes is converted, and the next scrape follows).
        Fixing it early lets Envoy's page stream while a slower app is still rendering its own.
        """
        if not om_version:
            return TEXT_OUTPUT
        remembered = [self._formats.get((source.url, om_version)) for source in sources]
        if any(fmt is None for fmt in remembered):
            return None
        return output_format(om_version, (fmt for fmt in remembered if fmt is not None))

    async def handle(self, request: Request) -> Response:
        if self.options.localhost_only and not is_localhost(request.remote):
            return text_response(403, "Only requests from localhost are allowed")
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.counters.scrapes.inc()
        budget = scrape_budget(request.header(TIMEOUT_HEADER), self.options.default_timeout)
        deadline, headers_deadline = started + budget, started + budget * HEADERS_SHARE
        om_version = accepted_openmetrics(request.header("Accept", "") or "")
        headers = {
            "Accept": source_accept_header(om_version),
            "Accept-Encoding": "identity",  # loopback: compressing would only cost CPU on both sides
            TIMEOUT_HEADER: f"{budget:.3f}",
            "User-Agent": request.header("User-Agent", "istio-agent") or "istio-agent",
        }
        sources = self.sources(request.query_string)
        opens = [loop.create_task(self._open(source, headers)) for source in sources]
        try:
            output = self._known_output(om_version, sources)
            if output is None:  # first OpenMetrics scrape: the sources' Content-Types decide
                await asyncio.wait(opens, timeout=max(0.0, headers_deadline - loop.time()))
                output = output_format(om_version, (
                    task.result()[1] for task in opens if task.done() and not task.cancelled()
                    and task.exception() is None))
        except BaseException:
            await _close_opens(opens)
            raise
        body = _MergedBody(self, sources, opens, output, om_version, deadline, headers_deadline)
        return Response(200, headers=[("Content-Type", output.content_type)], stream=body,
                        gzip=accepts_gzip(request.header("Accept-Encoding", "") or ""))

    async def merge_source(self, source: Source, task: asyncio.Task[tuple[PooledResponse, Format]],
                           output: OutputFormat, headers_by: float, body_by: float,
                           om_version: str) -> AsyncIterator[bytes]:
        """Wait for `source`'s headers (until `headers_by`), then its body's blocks (until `body_by`)."""
        try:
            async with asyncio.timeout_at(headers_by):
                upstream, fmt = await task
        except TimeoutError:
            self._failed(source.kind, source.url, "no response before the scrape deadline")
            return
        except (SourceError, OSError, ValueError) as exc:
            self._failed(source.kind, source.url, exc)
            return
        self._formats[(source.url, om_version)] = fmt
        filt = SourceFilter(fmt, output, cap=self.options.body_cap)
        try:
            while not filt.ended:
                # The deadline covers reads only: a timeout never spans a yield (the server's writes).
                async with asyncio.timeout_at(body_by):
                    chunk = await upstream.response.read(READ_SIZE)
                if not chunk:
                    break
                block = filt.feed(chunk)
                if block:
                    yield block
            block = filt.finish()
            if block:
                yield block
        except (SourceError, OSError, ValueError, TimeoutError) as exc:
            reason = "body not complete before the scrape deadline" if isinstance(exc, TimeoutError) else exc
            self._failed(source.kind, source.url, reason)
            upstream.close()
        else:
            self._succeeded(source.url)
            upstream.release()


async def _close_opens(opens: Sequence[asyncio.Task[tuple[PooledResponse, Format]]]) -> None:
    for task in opens:
        task.cancel()
    for result in await asyncio.gather(*opens, return_exceptions=True):
        if isinstance(result, tuple):
            result[0].close()  # a no-op for an answer already released


class _MergedBody:
    """The merged page as the server sends it: the agent's registry, each source in turn, `# EOF`."""

    def __init__(self, handler: MergedMetricsHandler, sources: Sequence[Source],
                 opens: Sequence[asyncio.Task[tuple[PooledResponse, Format]]], output: OutputFormat,
                 om_version: str, deadline: float, headers_deadline: float) -> None:
        self.handler, self.sources, self.opens, self.output = handler, sources, opens, output
        self.om_version, self.deadline, self.headers_deadline = om_version, deadline, headers_deadline
        self._blocks: AsyncIterator[bytes] | None = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        self._blocks = self._generate()
        return self._blocks

    async def _generate(self) -> AsyncIterator[bytes]:
        handler, loop = self.handler, asyncio.get_running_loop()
        try:
            own = agent_exposition(handler.registry, self.output)
        except Exception as exc:  # a broken collector must not cost Envoy's and the app's metrics
            handler._failed(AGENT, "registry", exc)
        else:
            yield own
        for index, (source, task) in enumerate(zip(self.sources, self.opens, strict=True)):
            # Each source gets a fair share of the time left, so one that stalls cannot starve the rest.
            share_end = loop.time() + max(0.0, self.deadline - loop.time()) / (len(self.sources) - index)
            async for block in handler.merge_source(source, task, self.output, min(share_end, self.headers_deadline),
                                                    share_end, self.om_version):
                yield block
        if self.output.format is Format.OPENMETRICS:
            yield EOF_LINE

    async def aclose(self) -> None:
        if self._blocks is not None:
            await self._blocks.aclose()  # type: ignore[attr-defined]
        await _close_opens(self.opens)


def add_metrics_routes(app: Router, options: MetricsOptions, registry: CollectorRegistry) -> None:
    """Serve GET `/stats/prometheus` and `/metrics` (upstream serves both) on `app`.

    Registers the scrape counters on `registry`; the client pool closes with the server.
    """
    MergedMetricsHandler(options, registry).add_routes(app)

"""Wasm through the agent: ECDS push latency with a cached module, and a module's first fetch.

1. An ADS server (grpc.aio, in this process) pushes an ECDS response again after every ACK; the client reads
   it through the `XdsProxy` with the Wasm cache's ECDS hook, as Envoy would. Two pushes of the same size are
   compared: an extension config with a *remote* Wasm module already in the cache (decoded, looked up,
   rewritten to a local file, re-encoded) and one without Wasm (forwarded as raw bytes), alternating rounds.
2. The first fetch of a module (a fresh cache each round: the SSRF guard, download, sha256, the Wasm check and
   the atomic write) against a plain HTTP download of the same bytes from the same local server (the product's
   keep-alive-less h11 client, no checks, nothing written).

Prints figures and, last, one JSON object: `{"ecds_wasm_cached_push_ms", "ecds_plain_push_ms",
"ecds_push_ratio", "first_fetch_ms", "plain_download_ms", "first_fetch_ratio", "module_bytes", "ecds_bytes"}`.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "40"))
FETCH_ROUNDS = int(os.environ.get("BENCH_FETCH_ROUNDS", "15"))
MODULE_BYTES = int(os.environ.get("BENCH_MODULE_BYTES", str(2 * 1024 * 1024)))
ECDS = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"


def module_bytes() -> bytes:
    """A module-shaped body of MODULE_BYTES (Wasm magic and version, then a custom section's worth of bytes)."""
    return b"\x00asm\x01\x00\x00\x00" + os.urandom(MODULE_BYTES - 8)


def ecds_bodies(url: str, digest: str) -> tuple[bytes, bytes]:
    """Two DiscoveryResponses of one extension config each, the same size: remote Wasm, and no Wasm."""
    from envoy.config.core.v3 import extension_pb2
    from envoy.service.discovery.v3 import discovery_pb2
    from google.protobuf import any_pb2

    from istiod_local.controlplane.xds.generators.extensions import wasm_config
    from istiod_local.controlplane.xds.wasmplugins import WasmPlugin

    plugin = WasmPlugin("bench", "default", url, sha256=digest, plugin_config={"pad": "x" * 2000},
                        resource_version="1")
    wasm = wasm_config(plugin, None)
    with_wasm = discovery_pb2.DiscoveryResponse(version_info="1", type_url=ECDS)
    with_wasm.resources.add().Pack(wasm)
    plain = discovery_pb2.DiscoveryResponse(version_info="1", type_url=ECDS)
    filler = any_pb2.Any(type_url="type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua")
    config = extension_pb2.TypedExtensionConfig(name=wasm.name, typed_config=filler)
    config.typed_config.value = b"\x0a" + b"\x00" * 8  # grown below to the Wasm one's size
    plain.resources.add().Pack(config)
    gap = with_wasm.ByteSize() - plain.ByteSize()
    config.typed_config.value = b"x" * (len(config.typed_config.value) + gap)
    plain.ClearField("resources")
    plain.resources.add().Pack(config)
    for _ in range(4):  # varint lengths may shift by a byte
        gap = with_wasm.ByteSize() - plain.ByteSize()
        if gap == 0:
            break
        config.typed_config.value = config.typed_config.value[:max(0, len(config.typed_config.value) + gap)]
        plain.ClearField("resources")
        plain.resources.add().Pack(config)
    return bytes(with_wasm.SerializeToString()), bytes(plain.SerializeToString())


class ModuleServer:
    def __init__(self, body: bytes) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/module.wasm"


async def ads_server(bodies: dict[str, bytes]) -> tuple[Any, int]:
    """Pushes bodies[<first resource name asked>] again after every request of the stream."""
    import grpc
    import grpc.aio

    from istio_agent.xds.core import messages

    counter = 0

    async def handler(_it: Any, context: grpc.aio.ServicerContext) -> None:
        nonlocal counter
        from envoy.service.discovery.v3 import discovery_pb2

        body = b""
        while (request := await context.read()) is not grpc.aio.EOF:
            assert isinstance(request, bytes)
            if messages.request_head(request, delta=False).type_url != ECDS:
                continue
            if not body:
                body = bodies[discovery_pb2.DiscoveryRequest.FromString(request).resource_names[0]]
            counter += 1
            nonce = f"n{counter}".encode()
            await context.write(body + b"\x2a" + bytes([len(nonce)]) + nonce)

    server = grpc.aio.server(options=[("grpc.max_send_message_length", -1)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "envoy.service.discovery.v3.AggregatedDiscoveryService",
        {"StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(handler)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def push_times(socket: Path, name: str, rounds: int) -> list[float]:
    import grpc.aio
    from envoy.service.discovery.v3 import discovery_pb2

    from istio_agent.xds.core import messages

    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        call: Any = channel.stream_stream(SOTW)()
        await call.write(discovery_pb2.DiscoveryRequest(type_url=ECDS, resource_names=[name]).SerializeToString())
        times, start = [], time.perf_counter()
        for _ in range(rounds + 1):
            data = await call.read()
            times.append(time.perf_counter() - start)
            head = messages.response_head(data, delta=False)
            start = time.perf_counter()
            await call.write(discovery_pb2.DiscoveryRequest(type_url=ECDS, resource_names=[name],
                                                            response_nonce=head.nonce).SerializeToString())
        call.cancel()
    return times[1:]


async def main() -> None:
    from istio_agent.httpio.client import Pool
    from istio_agent.metrics import CollectorRegistry
    from istio_agent.wasm.cache import WasmModuleCache
    from istio_agent.wasm.core.cache_state import FetchRequest
    from istio_agent.wasm.ecds import EcdsRewriter
    from istio_agent.wasm.metrics import WasmMetrics
    from istio_agent.wasm.options import WasmOptions
    from istio_agent.xds import XdsProxy, XdsProxyOptions
    from istio_agent.xds.options import XdsProxyHooks
    from istio_agent.xds.upstream import UpstreamSettings

    module = module_bytes()
    digest = hashlib.sha256(module).hexdigest()
    server = ModuleServer(module)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # --- 2. first fetch vs a plain download --------------------------------------------------------------
        first, plain = [], []
        pool = Pool()
        for round_ in range(FETCH_ROUNDS):
            cache = WasmModuleCache(WasmOptions(cache_dir=work / f"cold-{round_}"), WasmMetrics(CollectorRegistry()))
            start = time.perf_counter()
            await cache.get(FetchRequest(server.url, digest, "r", "1", "IfNotPresent", None, 30.0, "p"))
            first.append(time.perf_counter() - start)
            start = time.perf_counter()
            answer = await pool.request(server.url, [("Connection", "close")])
            body = await answer.read()
            answer.close()
            plain.append(time.perf_counter() - start)
            assert body == module
        await pool.close()

        # --- 1. ECDS pushes through the proxy ----------------------------------------------------------------
        wasm_body, plain_body = ecds_bodies(server.url, digest)
        names = {"wasm": "", "plain": ""}
        from envoy.config.core.v3 import extension_pb2
        from envoy.service.discovery.v3 import discovery_pb2

        for key, body in (("wasm", wasm_body), ("plain", plain_body)):
            config = extension_pb2.TypedExtensionConfig()
            discovery_pb2.DiscoveryResponse.FromString(body).resources[0].Unpack(config)
            names[key] = config.name
        wasm_name = names["wasm"]
        bodies = {wasm_name: wasm_body}
        cache = WasmModuleCache(WasmOptions(cache_dir=work / "warm"), WasmMetrics(CollectorRegistry()))
        await cache.get(FetchRequest(server.url, digest, wasm_name, "1", "IfNotPresent", None, 30.0, "p"))
        ads, port = await ads_server(bodies)
        socket = work / "XDS"
        proxy = XdsProxy(XdsProxyOptions(socket, UpstreamSettings(f"127.0.0.1:{port}", insecure=True)),
                         XdsProxyHooks(ecds=EcdsRewriter(cache)))
        await proxy.start()
        try:
            cached, forwarded = [], []
            for _ in range(3):
                bodies[wasm_name] = wasm_body
                cached += await push_times(socket, wasm_name, ROUNDS // 3)
                bodies[wasm_name] = plain_body
                forwarded += await push_times(socket, wasm_name, ROUNDS // 3)
            assert cache.fetches == 1, "every push after the first fetch is a cache hit"
        finally:
            await proxy.stop()
            await ads.stop(None)
        server.httpd.shutdown()

    ms = lambda values: round(statistics.median(values) * 1000, 3)  # noqa: E731
    figures = {
        "ecds_wasm_cached_push_ms": ms(cached), "ecds_plain_push_ms": ms(forwarded),
        "ecds_push_ratio": round(statistics.median(cached) / statistics.median(forwarded), 2),
        "first_fetch_ms": ms(first), "plain_download_ms": ms(plain),
        "first_fetch_ratio": round(statistics.median(first) / statistics.median(plain), 2),
        "module_bytes": len(module), "ecds_bytes": len(wasm_body),
    }
    print(f"ECDS push through the agent ({len(wasm_body)} B, {len(cached)} pushes each): remote Wasm, cached "
          f"{figures['ecds_wasm_cached_push_ms']} ms vs no Wasm {figures['ecds_plain_push_ms']} ms "
          f"(x{figures['ecds_push_ratio']})")
    print(f"first fetch of a {len(module)} B module {figures['first_fetch_ms']} ms vs a plain download "
          f"{figures['plain_download_ms']} ms (x{figures['first_fetch_ratio']})")
    print(json.dumps(figures))


if __name__ == "__main__":
    asyncio.run(main())

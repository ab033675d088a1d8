"""XDS proxy overhead: a 5,000-cluster push through the proxy vs straight from the server.

Three processes: an ADS server (pre-serialized 5,000-cluster CDS response,
re-sent with a fresh nonce after every ACK), the XDS proxy (`XdsProxy` on a
UDS, plaintext upstream), and this process as the client, which ACKs each
push and so drives the next. The same client talks once directly to the
server and once through the proxy, alternating rounds, and the medians are
compared. The proxy's RSS is sampled during the pushes (peak = VmHWM) and
after them.

Also re-measures the decoding choice of `istio_agent/xds/core/messages.py` on the
same response: a pure-Python wire scanner, a full `discovery_pb2` parse, and
the head-only parse the proxy uses.

Prints figures and, last, one JSON object:
`{"push_ratio", "direct_push_ms", "proxy_push_ms", "proxy_rss_mb_peak", "proxy_rss_mb_steady", "decode_ms"}`.
Pure transport is the worst case for a relay (the ratio counts hops); with Envoy
applying the clusters at the end, the end-to-end ratio is issue 4's `bench_xds.py`.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
from support import poll, rss_mb

CLUSTERS = int(os.environ.get("BENCH_CLUSTERS", "5000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "15"))
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"


def cds_response(count: int) -> bytes:
    """A serialized DiscoveryResponse with `count` EDS clusters shaped like istiod's outbound ones."""
    from envoy.config.cluster.v3 import cluster_pb2
    from envoy.service.discovery.v3 import discovery_pb2

    response = discovery_pb2.DiscoveryResponse(version_info="1", type_url=CDS)
    for i in range(count):
        name = f"outbound|80||svc-{i}.ns-{i % 50}.svc.cluster.local"
        cluster = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.EDS)
        cluster.connect_timeout.seconds = 10
        cluster.eds_cluster_config.service_name = name
        cluster.eds_cluster_config.eds_config.ads.SetInParent()
        cluster.circuit_breakers.thresholds.add().max_connections.value = 4294967295
        response.resources.add().Pack(cluster)
    return bytes(response.SerializeToString())


# --- the server process ---------------------------------------------------------------------------------


async def serve_ads(port_file: Path) -> None:
    import grpc
    import grpc.aio

    from istio_agent.xds.core import messages

    body = cds_response(CLUSTERS)
    counter = 0

    async def handler(_it: Any, context: grpc.aio.ServicerContext) -> None:
        nonlocal counter
        while (request := await context.read()) is not grpc.aio.EOF:
            assert isinstance(request, bytes)
            if messages.request_head(request, delta=False).type_url != CDS:
                continue
            counter += 1
            nonce = f"n{counter}".encode()
            await context.write(body + b"\x2a" + bytes([len(nonce)]) + nonce)  # field 5 (nonce) appended

    server = grpc.aio.server(options=[("grpc.max_send_message_length", -1)])
    method = grpc.stream_stream_rpc_method_handler(handler)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(
            "envoy.service.discovery.v3.AggregatedDiscoveryService", {"StreamAggregatedResources": method}
        ),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    port_file.write_text(str(port))
    await server.wait_for_termination()


# --- the proxy process ----------------------------------------------------------------------------------


async def serve_proxy(socket: Path, port: int) -> None:
    from istio_agent.xds import XdsProxy, XdsProxyOptions
    from istio_agent.xds.upstream import UpstreamSettings

    proxy = XdsProxy(XdsProxyOptions(socket, UpstreamSettings(f"127.0.0.1:{port}", insecure=True)))
    await proxy.start()
    await asyncio.Event().wait()


# --- the client (this process) ----------------------------------------------------------------------------


async def push_times(target: str, rounds: int) -> list[float]:
    """Seconds per full push on one stream: each ACK makes the server push again."""
    import grpc.aio

    from istio_agent.xds.core import messages

    options = [("grpc.max_receive_message_length", -1)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        call: Any = channel.stream_stream(SOTW)()
        await call.write(messages.encode_request(CDS, delta=False))
        times = []
        start = time.perf_counter()
        for _ in range(rounds + 1):
            data = await call.read()
            times.append(time.perf_counter() - start)
            head = messages.response_head(data, delta=False)
            assert head.type_url == CDS
            start = time.perf_counter()
            await call.write(messages.encode_request(CDS, delta=False, response_nonce=head.nonce))
        call.cancel()
    return times[1:]  # the first includes connection set-up


def decode_figures(data: bytes) -> dict[str, float]:
    from envoy.service.discovery.v3 import discovery_pb2

    from istio_agent.xds.core import messages

    def scan() -> str:
        """Pure-Python wire scan of the top-level fields (the alternative not taken)."""
        pos, end, found = 0, len(data), ""
        while pos < end:
            tag, pos = _varint(data, pos)
            wire = tag & 7
            if wire == 2:
                length, pos = _varint(data, pos)
                if tag >> 3 == 4:
                    found = data[pos:pos + length].decode()
                pos += length
            elif wire == 0:
                _, pos = _varint(data, pos)
            else:
                pos += 8 if wire == 1 else 4
        return found

    def full() -> str:
        return str(discovery_pb2.DiscoveryResponse.FromString(data).type_url)

    def head() -> str:
        return messages.response_head(data, delta=False).type_url

    out = {}
    for name, fn in (("python_scanner", scan), ("full_parse", full), ("head_parse", head)):
        assert fn() == CDS
        n = 30
        start = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = round((time.perf_counter() - start) / n * 1000, 3)
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _wait_file(path: Path, process: subprocess.Popen[bytes], what: str) -> None:
    """Until the child made `path` (its socket, or a file holding its port)."""
    def made() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before it started")
        return path.is_socket() or (path.is_file() and path.stat().st_size > 0)

    poll(made, what, 30, interval=0.01, retry_on=(FileNotFoundError,))


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        port_file, socket = workdir / "port", workdir / "XDS"
        me = [sys.executable, str(Path(__file__).resolve())]
        server = subprocess.Popen([*me, "--serve-ads", str(port_file)])
        proxy = None
        try:
            _wait_file(port_file, server, "the ADS server")
            port = int(port_file.read_text())
            proxy = subprocess.Popen([*me, "--serve-proxy", str(socket), str(port)])
            _wait_file(socket, proxy, "the XDS proxy")
            idle = rss_mb(proxy.pid)
            direct: list[float] = []
            through: list[float] = []
            samples: list[float] = []
            stop = asyncio.Event()

            async def sample() -> None:
                while not stop.is_set():
                    samples.append(rss_mb(proxy.pid))
                    await asyncio.sleep(0.01)

            sampler = asyncio.create_task(sample())
            for _ in range(3):  # interleave so machine noise hits both sides alike
                direct += await push_times(f"127.0.0.1:{port}", ROUNDS // 3)
                through += await push_times(f"unix:{socket}", ROUNDS // 3)
            stop.set()
            await sampler
            await asyncio.sleep(1.0)
            steady = rss_mb(proxy.pid)
            peak = rss_mb(proxy.pid, "VmHWM")
        finally:
            for p in (proxy, server):
                if p is not None:
                    p.terminate()
                    p.wait()
    size = len(cds_response(CLUSTERS))
    direct_ms = statistics.median(direct) * 1000
    proxy_ms = statistics.median(through) * 1000
    decode = decode_figures(cds_response(CLUSTERS))
    print(f"CDS push: {CLUSTERS} clusters, {size / 1e6:.2f} MB per push, {len(direct)} pushes each way")
    print(f"direct from server: {direct_ms:.1f} ms median; through XDS proxy: {proxy_ms:.1f} ms median")
    print(f"push ratio (proxy / direct): {proxy_ms / direct_ms:.2f}x, i.e. +{proxy_ms - direct_ms:.1f} ms per push "
          "(one more full gRPC hop: a relay must receive a whole message before sending it on)")
    print(f"proxy RSS: idle {idle:.1f} MB, max sampled {max(samples):.1f} MB, peak (VmHWM) {peak:.1f} MB, "
          f"after {steady:.1f} MB")
    print(f"decode of one push (ms): {decode}")
    print(json.dumps({
        "push_ratio": round(proxy_ms / direct_ms, 3),
        "direct_push_ms": round(direct_ms, 2),
        "proxy_push_ms": round(proxy_ms, 2),
        "proxy_rss_mb_peak": round(peak, 1),
        "proxy_rss_mb_steady": round(steady, 1),
        "decode_ms": decode,
    }))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-ads":
        asyncio.run(serve_ads(Path(sys.argv[2])))
    elif len(sys.argv) > 1 and sys.argv[1] == "--serve-proxy":
        # The agent runs on the loop eventloop.py gives it (uvloop when installed); so does the proxy here.
        from istio_agent.eventloop import run

        run(serve_proxy(Path(sys.argv[2]), int(sys.argv[3])))
    else:
        asyncio.run(main())

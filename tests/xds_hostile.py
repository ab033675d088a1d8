"""Hostile clients of the XDS proxy's socket: a round of concurrent streams that are garbage, truncated or huge.

One round opens `streams` connections to the agent's `etc/istio/proxy/XDS`
at once, each a separate client (its own connection), cycling through:

- `junk`: bytes that are not HTTP/2 at all, then close;
- `bad_proto`: a real gRPC client (grpc.aio) on the SotW method sending a
  message that is not a DiscoveryRequest;
- `truncated_eos`: raw HTTP/2: a gRPC message prefix announcing 1 MB (under
  the proxy's limit), the first 48 KB of it, and END_STREAM (the message can
  never complete); the client waits for the server to end the stream;
- `truncated_cut`: a prefix announcing 5 MB, 48 KB of it, then the socket is
  closed mid-message;
- `huge_sotw` / `huge_delta`: a real gRPC client sending one well-formed
  5 MB (Delta)DiscoveryRequest (a node and 5 MB of resource names).

Each client waits (up to `patience` seconds) for the server's verdict, then
goes away; `hostile_round` returns how each kind ended, and
`hostile_round_in_child` runs one in a child process. The raw HTTP/2 is
written by hand (a few frames, HPACK literals only) because no gRPC client
sends a truncated message. Like `support.py` it imports no pytest; the e2e
test and `benchmarks/bench_xds_hostile_streams.py` both use it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

SOTW_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
DELTA_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
HUGE = 5 * 1024 * 1024
KINDS = ("junk", "bad_proto", "truncated_eos", "truncated_cut", "huge_sotw", "huge_delta")
NODE_ID = "sidecar~127.0.0.9~hostile-1.default~default.svc.cluster.local"

# ---- a few HTTP/2 frames, by hand --------------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x7
END_STREAM, END_HEADERS = 0x1, 0x4
MAX_FRAME = 16384
# What a truncated message sends: under the 64 KB initial window, so no flow control is needed.
TRUNCATED_SENT = 48 * 1024
# What the END_STREAM kind announces: under the proxy's 4 MiB limit, so only the truncation refuses it.
TRUNCATED_ANNOUNCED = 1024 * 1024


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _hpack_int(value: int, prefix_bits: int = 7) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out, value = [limit], value - limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    return bytes([*out, value])


def _hpack_literal(name: str, value: str) -> bytes:
    """A header as 'literal without indexing, new name', no Huffman coding."""
    n, v = name.encode(), value.encode()
    return b"\x00" + _hpack_int(len(n)) + n + _hpack_int(len(v)) + v


def grpc_request_headers(path: str = SOTW_METHOD) -> bytes:
    block = b"".join(_hpack_literal(k, v) for k, v in (
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
        ("content-type", "application/grpc"), ("te", "trailers")))
    return _frame(HEADERS, END_HEADERS, 1, block)


def truncated_message_frames(announced: int = HUGE, sent: int = TRUNCATED_SENT, end_stream: bool = True) -> bytes:
    """DATA frames carrying a gRPC prefix announcing `announced` bytes and only `sent` of them."""
    body = b"\x00" + struct.pack(">I", announced) + b"\x0a" * sent
    frames = []
    for start in range(0, len(body), MAX_FRAME):
        last = start + MAX_FRAME >= len(body)
        frames.append(_frame(DATA, END_STREAM if last and end_stream else 0, 1, body[start:start + MAX_FRAME]))
    return b"".join(frames)


# ---- the clients ---------------------------------------------------------------------------------


def huge_request(delta: bool, size: int = HUGE) -> bytes:
    """A well-formed (Delta)DiscoveryRequest of about `size` bytes: a node and many resource names."""
    from envoy.service.discovery.v3 import discovery_pb2

    names = [f"outbound|80||svc-{i:07d}.default.svc.cluster.local" for i in range(size // 52)]
    if delta:
        d = discovery_pb2.DeltaDiscoveryRequest(type_url=CLUSTER, resource_names_subscribe=names)
        d.node.id = NODE_ID
        return bytes(d.SerializeToString())
    s = discovery_pb2.DiscoveryRequest(type_url=CLUSTER, resource_names=names)
    s.node.id = NODE_ID
    return bytes(s.SerializeToString())


async def _server_verdict(reader: asyncio.StreamReader) -> str:
    """Read the server's frames until it ends stream 1 (trailers or RST_STREAM) or the connection."""
    while True:
        header = await reader.readexactly(9)
        length = int.from_bytes(header[:3], "big")
        kind, flags, stream = header[3], header[4], int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
        await reader.readexactly(length)
        if stream == 1 and kind == HEADERS and flags & END_STREAM:
            return "trailers"
        if stream == 1 and kind == RST_STREAM:
            return "reset"
        if kind == GOAWAY:
            return "goaway"


async def _raw(socket: Path, payload: bytes, patience: float, close_at_once: bool) -> str:
    reader, writer = await asyncio.open_unix_connection(str(socket))
    try:
        writer.write(payload)
        await writer.drain()
        if close_at_once:
            return "cut"
        if not payload.startswith(PREFACE):  # not HTTP/2: wait for the server to close the connection
            while await asyncio.wait_for(reader.read(65536), patience):
                pass
            return "closed by server"
        return await asyncio.wait_for(_server_verdict(reader), patience)
    except TimeoutError:
        return "server silent"
    except asyncio.IncompleteReadError:
        return "closed by server"
    except OSError as exc:
        return f"os error {exc.errno}"
    finally:
        writer.transport.abort()


async def _grpc(socket: Path, method: str, message: bytes, patience: float) -> str:
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", -1),
               ("grpc.enable_retries", 0)]
    async with grpc.aio.insecure_channel(f"unix:{socket}", options=options) as channel:
        call: Any = channel.stream_stream(method, request_serializer=None, response_deserializer=None)()
        try:
            await asyncio.wait_for(call.write(message), patience)
            await asyncio.wait_for(call.done_writing(), patience)
            while await asyncio.wait_for(call.read(), patience) is not grpc.aio.EOF:
                pass
            return f"status {(await call.code()).name}"
        except grpc.aio.AioRpcError as exc:
            return f"status {exc.code().name}"
        except (TimeoutError, grpc.aio.UsageError):
            return "server silent"
        finally:
            call.cancel()


async def hostile_stream(socket: Path, kind: str, patience: float, rng: random.Random,
                         huge: dict[bool, bytes]) -> str:
    if kind == "junk":
        return await _raw(socket, rng.randbytes(rng.randint(1, 64 * 1024)), patience, close_at_once=False)
    if kind == "bad_proto":
        return await _grpc(socket, SOTW_METHOD, b"\xff\xff\xff\xff" + rng.randbytes(1024), patience)
    if kind in ("truncated_eos", "truncated_cut"):
        eos = kind == "truncated_eos"
        frames = truncated_message_frames(TRUNCATED_ANNOUNCED, end_stream=True) if eos else truncated_message_frames()
        payload = PREFACE + _frame(SETTINGS, 0, 0) + grpc_request_headers() + frames
        return await _raw(socket, payload, patience, close_at_once=not eos)
    delta = kind == "huge_delta"
    return await _grpc(socket, DELTA_METHOD if delta else SOTW_METHOD, huge[delta], patience)


async def hostile_round(socket: Path, streams: int = 200, *, kinds: Sequence[str] = KINDS, seed: int = 0,
                        patience: float = 10.0, huge_size: int = HUGE) -> dict[str, collections.Counter[str]]:
    """`streams` hostile clients at once on the XDS socket; per kind, how many ended which way."""
    rng = random.Random(seed)
    huge = {False: huge_request(False, huge_size), True: huge_request(True, huge_size)}
    chosen = [kinds[i % len(kinds)] for i in range(streams)]
    results = await asyncio.gather(*(hostile_stream(socket, kind, patience, random.Random(rng.random()), huge)
                                     for kind in chosen), return_exceptions=True)
    outcomes: dict[str, collections.Counter[str]] = {kind: collections.Counter() for kind in kinds}
    for kind, result in zip(chosen, results, strict=True):
        outcomes[kind][result if isinstance(result, str) else f"client error {type(result).__name__}"] += 1
    return outcomes


def describe(outcomes: dict[str, collections.Counter[str]]) -> str:
    return "; ".join(f"{kind}: " + ", ".join(f"{n} {what}" for what, n in sorted(c.items()))
                     for kind, c in outcomes.items())


def hostile_round_in_child(socket: Path, streams: int = 200, *, seed: int = 0, python: str = sys.executable,
                           timeout: float = 120.0) -> dict[str, collections.Counter[str]]:
    """`hostile_round` in a child process, so that every connection it opened is closed when this returns
    (a grpc.aio client may keep a closed channel's connection open until its process exits)."""
    done = subprocess.run([python, __file__, str(socket), str(streams), str(seed)], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"hostile round failed ({done.returncode}): {done.stderr[-2000:]}")
    outcomes: dict[str, dict[str, int]] = json.loads(done.stdout.strip().splitlines()[-1])
    return {kind: collections.Counter(counts) for kind, counts in outcomes.items()}


if __name__ == "__main__":
    result = asyncio.run(hostile_round(Path(sys.argv[1]), int(sys.argv[2]), seed=int(sys.argv[3])))
    print(json.dumps({kind: dict(counts) for kind, counts in result.items()}))

"""A pod's host port: a TCP port on the host's loopback that leads to a port of a pod on the local node.

A Kubernetes node forwards a pod's `hostPort` into the pod (the CNI portmap
plugin's DNAT); the local node's "host" for its CNI chain is the node
namespace, which the machine's own network cannot reach. So a host port is a
small forwarder, as Docker's userland proxy is: `python -m
istiod_local.node.hostport --listen 127.0.0.1:31380 --netns
/var/run/netns/<node> --to 10.244.0.7:8080` binds its listening socket in
the namespace it starts in (the host's), then moves itself into the node
namespace (a socket stays in the namespace it was made in), so every
connection it makes to the pod starts there; bytes are copied both ways
until either side closes. Only the loopback is bound: nothing leaves the
machine, and nothing on the host's network changes.

It lives in the node namespace once running, so the node's teardown (every
process of its namespaces) ends it with the rest; `setpriv --pdeathsig`
ends it with the node's owner.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
import time
from pathlib import Path

from istio_agent.capture.netns import enter_netns
from istiod_local.node.plan import as_user
from istiod_local.node.processes import NetnsProcess, NodeError, spawn, tail

READY_LINE = "forwarding"
MODULE = "istiod_local.node.hostport"


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
            else:
                writer.close()


async def _serve(listener: socket.socket, target: tuple[str, int]) -> None:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(asyncio.open_connection(*target), 10)
        except (OSError, TimeoutError) as exc:
            print(f"connecting to {target[0]}:{target[1]}: {exc}", file=sys.stderr, flush=True)
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        for w in (writer, upstream_writer):
            w.close()

    server = await asyncio.start_server(connection, sock=listener)
    async with server:
        await server.serve_forever()


def forward(listen: str, netns: str, target: str) -> None:
    """Listen here, then serve from inside `netns` (see the module docstring)."""
    host, port = _split(listen)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        sys.exit(f"host port {listen}: {exc}")
    listener.listen(128)
    listener.setblocking(False)
    enter_netns(netns)
    print(f"{READY_LINE} {listen} -> {target} (in {netns})", flush=True)
    asyncio.run(_serve(listener, _split(target)))


def start_forwarder(name: str, python: str, listen: str, netns_path: str, target: str, log: Path,
                    timeout: float = 10.0) -> NetnsProcess:
    """Run a forwarder and wait until it listens; NodeError (with its log) when it cannot."""
    argv = [*as_user(), "--", python, "-m", MODULE, "--listen", listen, "--netns", netns_path, "--to", target]
    start = log.stat().st_size if log.exists() else 0
    process = spawn(name, argv, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), log.open("rb") as f:
            f.seek(start)
            if READY_LINE.encode() in f.read():
                return process
        if not process.running():
            raise NodeError(f"{name}: {process.describe_exit()}")
        time.sleep(0.02)
    process.stop(2.0)
    raise NodeError(f"{name} did not listen within {timeout:.0f} s:\n{tail(log)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", required=True, help="host:port on the host (127.0.0.1:31380)")
    parser.add_argument("--netns", required=True, help="the node namespace's file (/var/run/netns/<name>)")
    parser.add_argument("--to", required=True, help="the pod's ip:port")
    args = parser.parse_args(argv)
    forward(args.listen, args.netns, args.to)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`--run-validation`: prove that the installed rules really redirect traffic.

As upstream's `istio-validation` init container does: listen on the proxy's
outbound and inbound ports on loopback, then connect, as the proxy user, to
`127.0.0.6:<probe port>` (`[::6]` for an IPv6 pod). Only the rules can turn
that connection into one accepted on a listener, and the accepted socket's
`SO_ORIGINAL_DST` must still name the probe port. The client socket is
created with the proxy uid/gid as effective ids, which is what the `owner`
match looks at; the process itself keeps running as root.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time

from istio_agent.capture.config import CaptureConfig, split
from istio_agent.capture.validation import parse_duration

SO_ORIGINAL_DST = 80  # also IP6T_SO_ORIGINAL_DST

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    Log = Callable[[str], None]


def original_dst(conn: socket.socket) -> tuple[str, int]:
    """The pre-NAT destination of an accepted, redirected TCP connection."""
    if conn.family == socket.AF_INET6:
        raw = conn.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
        port = struct.unpack_from("!H", raw, 2)[0]
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), port
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port = struct.unpack_from("!H", raw, 2)[0]
    return socket.inet_ntop(socket.AF_INET, raw[4:8]), port


def _proxy_socket(family: int, uid: int, gid: int) -> socket.socket:
    """A TCP socket owned (for netfilter's owner match) by uid/gid."""
    if os.geteuid() != 0:
        return socket.socket(family, socket.SOCK_STREAM)
    os.setegid(gid)
    os.seteuid(uid)
    try:
        return socket.socket(family, socket.SOCK_STREAM)
    finally:
        os.seteuid(0)
        os.setegid(0)


def run_validation(cfg: CaptureConfig, log: Log) -> bool:
    """True when a probe connection is redirected to a listener with its original port intact."""
    v6 = cfg.ipv6 and not cfg.dual_stack
    family = socket.AF_INET6 if v6 else socket.AF_INET
    listen_ip, target_ip = ("::1", "::6") if v6 else ("127.0.0.1", "127.0.0.6")
    probe_port = int(cfg.iptables_probe_port)
    uids = split(cfg.proxy_uid) or ["1337"]
    gids = split(cfg.proxy_gid) or uids
    uid, gid = int(uids[0]), int(gids[0])
    deadline = time.monotonic() + parse_duration(cfg.probe_timeout)
    listeners: list[socket.socket] = []
    try:
        for port in dict.fromkeys((int(cfg.proxy_port), int(cfg.inbound_capture_port))):
            listener = socket.socket(family, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind((listen_ip, port))
            except OSError as err:
                log(f"validation: cannot listen on {listen_ip}:{port}: {err}")
                listener.close()
                continue
            listener.listen(16)
            listener.setblocking(False)
            listeners.append(listener)
        if not listeners:
            log("validation: no listener available")
            return False
        while time.monotonic() < deadline:
            if _attempt(listeners, family, target_ip, probe_port, uid, gid, deadline, log):
                log("validation passed")
                return True
        log(f"validation failed: no redirected connection to {target_ip}:{probe_port} arrived")
        return False
    finally:
        for listener in listeners:
            listener.close()


def _attempt(
    listeners: list[socket.socket],
    family: int,
    target_ip: str,
    probe_port: int,
    uid: int,
    gid: int,
    deadline: float,
    log: Log,
) -> bool:
    client = _proxy_socket(family, uid, gid)
    try:
        client.setblocking(False)
        client.connect_ex((target_ip, probe_port))
        wait_until = min(deadline, time.monotonic() + 0.2)
        while (remaining := wait_until - time.monotonic()) > 0:
            ready, _, _ = select.select(listeners, [], [], remaining)
            for listener in ready:
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    continue
                with conn:
                    try:
                        _, port = original_dst(conn)
                    except OSError as err:
                        log(f"validation: no original destination: {err}")
                        continue
                    if port == probe_port:
                        return True
            if not ready:
                break
        return False
    finally:
        client.close()

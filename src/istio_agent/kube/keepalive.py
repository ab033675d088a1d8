"""The plugin's pod GET over kept-alive connections, for install-cni's fast path (not upstream).

The exec'd plugin opens one connection per process (`client.get`): a TCP
and TLS handshake on every pod's ADD. install-cni answers ADD for the
launcher in a long-lived process, so it keeps a few connections open per API
server and reuses them: the same request bytes (`client.build_request`,
keep-alive), the same parsing and Status decoding (`parse_response`,
`decode_pod`), the same kubeconfig read on every attempt (a rotated token or
a new server is picked up at once). Only the transport differs:

- a connection the server closed while idle is replaced once within the same
  attempt (the GET is idempotent; a failure on a fresh connection is the
  attempt's failure, retried by `add.fetch_pod` as upstream retries);
- one deadline bounds the whole attempt (`TIMEOUT`: connecting, the handshake,
  every read, the stale connection's replacement included), as the plugin's
  own GET: an API server that drips its answer fails the attempt at the
  deadline and frees the fast path's call thread;
- TLS contexts are built once per server and CA (the CA file's identity is
  part of the key, so a replaced file is read again);
- the kubeconfig is read on every attempt, but parsed again only when its
  text changed (a kubeconfig that names a `tokenFile` is parsed every time,
  so the token file is read every time too);
- TCP_NODELAY, and quick ACKs before each read: a server that writes its
  head and body separately would otherwise wait for our delayed ACK (40 ms
  on Linux) before sending the body, on every kept-alive request;
- connections are opened only by a thread in install-cni's own network
  namespace: a call thread enters the pod's namespace after its GET, and a
  socket opened there could not reach the API (RuntimeError instead).

`response_length` (where one HTTP/1.1 response ends) is pure.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

from istio_agent.kube.client import (
    MAX_RESPONSE,
    ApiError,
    KubeConfig,
    _read_bytes,
    build_request,
    decode_pod,
    parse_kubeconfig,
    parse_response,
    pod_path,
    remaining,
    timed_out,
    tls_context,
)

_TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", 12)  # Linux; quick-ack mode lasts only until the next delay
MAX_IDLE = 4  # idle connections kept per API server
TIMEOUT = 5.0  # seconds for the whole GET (both connections, if the idle one was stale), as the plugin's own


def thread_netns() -> tuple[int, int]:
    """The calling thread's network namespace (device, inode)."""
    info = os.stat("/proc/thread-self/ns/net")
    return info.st_dev, info.st_ino


def response_length(data: bytes) -> int | None:
    """The length of the first complete HTTP/1.1 response in `data`; None while incomplete.

    -1 when the response has no length (read to the end of the connection).
    """
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    head_len = end + 4
    chunked, length = False, -1
    for line in data[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding" and value.strip().lower() == b"chunked":
            chunked = True
        elif name == b"content-length":
            text = value.strip()
            if not text.isdigit():
                raise ApiError("malformed Content-Length from the API server")
            length = int(text)
    if chunked:
        pos = head_len
        while True:
            line_end = data.find(b"\r\n", pos)
            if line_end < 0:
                return None
            try:
                size = int(data[pos:line_end].split(b";")[0].strip(), 16)
            except ValueError:
                raise ApiError("malformed chunked HTTP response from the API server") from None
            if size == 0:
                trailer_end = data.find(b"\r\n\r\n", line_end)
                if data[line_end:line_end + 4] == b"\r\n\r\n":
                    return line_end + 4
                return None if trailer_end < 0 else trailer_end + 4
            pos = line_end + 2 + size + 2
            if pos > len(data):
                return None
    if length >= 0:
        return head_len + length if len(data) >= head_len + length else None
    return -1


class _Stale(Exception):
    """The connection was closed before any byte of the answer came (a kept-alive one the server dropped)."""


Key = tuple[object, ...]


class KeepAliveClient:
    """Pod GETs through a small pool of open connections per API server; safe to share between threads."""

    def __init__(self, timeout: float = TIMEOUT, max_idle: int = MAX_IDLE) -> None:
        self.timeout = timeout
        self.max_idle = max_idle
        self.own_netns = thread_netns()
        self._lock = threading.Lock()
        self._idle: dict[Key, list[socket.socket]] = {}
        self._contexts: dict[Key, object] = {}
        self._configs: dict[str, tuple[str, KubeConfig]] = {}  # path -> (text, parsed), for files naming no other
        self.connections_opened = 0

    def get_pod(self, kubeconfig: str, namespace: str, name: str) -> dict[str, object]:
        """One attempt, as `add.fetch_pod_from_kubeconfig`: read the kubeconfig, GET the pod."""
        cfg = self.load_kubeconfig(kubeconfig)
        status, body = self.get(cfg, pod_path(cfg, namespace, name))
        return decode_pod(status, body, namespace, name)

    def load_kubeconfig(self, path: str) -> KubeConfig:
        """`client.load_kubeconfig`: the file read now, parsed again only when its text changed."""
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        with self._lock:
            cached = self._configs.get(path)
        if cached is not None and cached[0] == text:
            return cached[1]
        other_files: list[str] = []

        def read(name: str) -> bytes:
            other_files.append(name)
            return _read_bytes(name)

        cfg = parse_kubeconfig(text, path, read)
        if not other_files:  # a token file may change under an unchanged kubeconfig
            with self._lock:
                self._configs[path] = (text, cfg)
        return cfg

    def get(self, cfg: KubeConfig, path: str) -> tuple[int, bytes]:
        """Status and body of one GET (ApiError for transport failures), all of it within `timeout` seconds."""
        request = build_request(cfg, path, keep_alive=True)
        deadline = time.monotonic() + self.timeout
        key = self._key(cfg)
        conn = self._take(key)
        if conn is not None:
            try:
                return self._exchange(conn, key, request, cfg, deadline)
            except _Stale:
                pass  # dropped while idle: once more, on a fresh connection
        conn = self._connect(cfg, key, deadline)
        try:
            return self._exchange(conn, key, request, cfg, deadline)
        except _Stale as err:
            raise ApiError(f"reading from the API server {cfg.host}:{cfg.port} failed: {err}") from None

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def _key(self, cfg: KubeConfig) -> Key:
        ca_id: tuple[int, ...] = ()
        if cfg.ca_file:
            try:
                info = os.stat(cfg.ca_file)
                ca_id = (info.st_ino, info.st_size, info.st_mtime_ns)
            except OSError:
                ca_id = (-1,)
        return (cfg.scheme, cfg.host, cfg.port, cfg.ca_data, cfg.ca_file, ca_id, cfg.insecure, cfg.server_name)

    def _take(self, key: Key) -> socket.socket | None:
        with self._lock:
            conns = self._idle.get(key)
            return conns.pop() if conns else None

    def _give_back(self, key: Key, conn: socket.socket) -> None:
        with self._lock:
            conns = self._idle.setdefault(key, [])
            if len(conns) < self.max_idle:
                conns.append(conn)
                return
        conn.close()

    def _context(self, cfg: KubeConfig, key: Key) -> object:
        with self._lock:
            ctx = self._contexts.get(key)
        if ctx is None:
            ctx = tls_context(cfg)
            with self._lock:
                self._contexts[key] = ctx
        return ctx

    def _connect(self, cfg: KubeConfig, key: Key, deadline: float) -> socket.socket:
        if thread_netns() != self.own_netns:
            raise RuntimeError("refusing to connect to the API server from a thread in another network namespace")
        try:
            sock = socket.create_connection((cfg.host, cfg.port), timeout=remaining(deadline, cfg, self.timeout))
        except TimeoutError:
            raise timed_out(cfg, self.timeout) from None
        except OSError as err:
            raise ApiError(f"cannot connect to the API server {cfg.scheme}://{cfg.host}:{cfg.port}: "
                           f"{err.strerror or err}") from None
        with contextlib.suppress(OSError):  # one request each way: nothing to gain from Nagle here
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if cfg.scheme != "https":
            self.connections_opened += 1
            return sock
        import ssl

        try:
            ctx = self._context(cfg, key)
            sock.settimeout(remaining(deadline, cfg, self.timeout))  # bounds the whole handshake (one deadline)
            conn = ctx.wrap_socket(sock, server_hostname=cfg.server_name or cfg.host)  # type: ignore[attr-defined]
        except TimeoutError:
            sock.close()
            raise timed_out(cfg, self.timeout) from None
        except (OSError, ssl.SSLError) as err:
            sock.close()
            raise ApiError(f"TLS handshake with the API server {cfg.host}:{cfg.port} failed: {err}") from None
        except BaseException:
            sock.close()
            raise
        self.connections_opened += 1
        return conn  # type: ignore[no-any-return]

    def _exchange(self, conn: socket.socket, key: Key, request: bytes, cfg: KubeConfig,
                  deadline: float) -> tuple[int, bytes]:
        data = b""
        keep = False
        try:
            try:
                conn.settimeout(remaining(deadline, cfg, self.timeout))
                conn.sendall(request)
                while True:
                    length = response_length(data)
                    if length is not None and length >= 0:
                        break
                    with contextlib.suppress(OSError):  # ACK at once: a server sending its head and body in
                        conn.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)  # two writes waits for it (Nagle)
                    conn.settimeout(remaining(deadline, cfg, self.timeout))
                    chunk = conn.recv(65536)
                    if not chunk:
                        if not data:
                            raise _Stale("the connection was closed before an answer")
                        if length == -1:
                            break  # no length: the answer ends with the connection
                        raise ApiError(f"truncated HTTP response from the API server {cfg.host}:{cfg.port}")
                    data += chunk
                    if len(data) > MAX_RESPONSE:
                        raise ApiError(f"the API server's response exceeds {MAX_RESPONSE} bytes")
            except TimeoutError:  # a slow server, not a stale connection: the attempt's failure
                raise timed_out(cfg, self.timeout) from None
            except OSError as err:
                if not data:
                    raise _Stale(str(err)) from None
                raise ApiError(f"reading from the API server {cfg.host}:{cfg.port} failed: {err}") from None
            status, headers, body = parse_response(data if length is None or length < 0 else data[:length])
            keep = (length is not None and length >= 0 and len(data) == length
                    and headers.get("connection", "").lower() != "close")
            return status, body
        finally:
            if keep:
                self._give_back(key, conn)
            else:
                conn.close()

"""The builtins-only Kubernetes API client: one request (any method, path and body) per connection.

Standard library only, and not even `http.client` (its `email` parser costs
~14 ms of every ADD): one HTTP/1.1 request over a socket (TLS when the
server is https), `Connection: close`, the response read to the end.
`ssl` is imported only when the server is https. One deadline bounds each
request as a whole (connect, TLS handshake, sending, every read), not each
read, so an API server that drips its answer cannot hold a pod's ADD past
it. The request bytes and the
response parsing are pure functions; `request` is the I/O, over a connection
`socket.create_connection` opens or the caller's `connect` (the local node
opens its connections from inside its network namespace). The `istio-cni`
plugin GETs its pod (and namespace) with it on every pod's ADD; install-cni's
fast path sends the same request over kept-alive connections (`keepalive`).

From the kubeconfig, as client-go reads it: the current context's cluster
(`server`, `certificate-authority-data` or `certificate-authority`,
`insecure-skip-tls-verify`, `tls-server-name`) and user (`token` or
`tokenFile`); relative file paths are relative to the kubeconfig's folder.
"""

from __future__ import annotations

import base64
import json
import os
import time

from istio_agent.kube import yamlsubset

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable, Mapping

    # (host, port, timeout) -> a connected socket
    Connect = Callable[[str, int, float], socket.socket]

MAX_RESPONSE = 16 * 1024 * 1024


class KubeconfigError(ValueError):
    """The kubeconfig is missing or unusable (names the file and the field)."""


class ApiError(RuntimeError):
    """The API did not answer as asked: transport failure or an HTTP error status (`status` 0 for transport)."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class KubeConfig:
    """Where the API is and how to authenticate to it."""

    __slots__ = ("ca_data", "ca_file", "host", "insecure", "port", "prefix", "scheme", "server_name", "token")

    def __init__(self, scheme: str, host: str, port: int, prefix: str = "", ca_data: bytes | None = None,
                 ca_file: str = "", insecure: bool = False, token: str = "", server_name: str = "") -> None:
        self.scheme = scheme
        self.host = host
        self.port = port
        self.prefix = prefix
        self.ca_data = ca_data
        self.ca_file = ca_file
        self.insecure = insecure
        self.token = token
        self.server_name = server_name


def parse_server(server: str, where: str) -> tuple[str, str, int, str]:
    """`https://host:port/prefix` -> (scheme, host, port, prefix); IPv6 hosts in brackets."""
    scheme, sep, rest = server.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise KubeconfigError(f"{where}: server {server!r} is not an http(s) URL")
    authority, slash, path = rest.partition("/")
    prefix = ("/" + path).rstrip("/") if slash else ""
    if authority.startswith("["):
        host, _, tail = authority[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
        if tail and not tail.startswith(":"):
            raise KubeconfigError(f"{where}: server {server!r} has a malformed host")
    else:
        host, _, port_text = authority.partition(":")
    if not host or "@" in authority:
        raise KubeconfigError(f"{where}: server {server!r} has no usable host")
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise KubeconfigError(f"{where}: server {server!r} has an invalid port")
        port = int(port_text)
    else:
        port = 443 if scheme == "https" else 80
    return scheme, host, port, prefix


def _named(doc: Mapping[str, object], section: str, name: str, inner: str, where: str) -> Mapping[str, object]:
    entries = doc.get(section) or []
    if not isinstance(entries, list):
        raise KubeconfigError(f"{where}: {section} must be a list")
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(inner) or {}
            if not isinstance(value, dict):
                raise KubeconfigError(f"{where}: {section} entry {name!r} has no {inner} object")
            return value
    raise KubeconfigError(f"{where}: no {section} entry named {name!r}")


def _resolve(path: str, base: str) -> str:
    return path if os.path.isabs(path) else os.path.join(base, path)


def parse_kubeconfig(text: str, path: str, read_file: object = None) -> KubeConfig:
    """The current context's cluster and user; `read_file(path) -> bytes` reads CA and token files."""
    reader = read_file if callable(read_file) else _read_bytes
    where = f"kubeconfig {path}"
    try:
        doc = yamlsubset.loads(text)
    except Exception as err:
        raise KubeconfigError(f"{where}: not valid YAML: {err}") from None
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{where}: expected a mapping at the top")
    context_name = doc.get("current-context")
    if not isinstance(context_name, str) or not context_name:
        raise KubeconfigError(f"{where}: current-context is not set")
    context = _named(doc, "contexts", context_name, "context", where)
    cluster_name, user_name = context.get("cluster"), context.get("user")
    if not isinstance(cluster_name, str) or not cluster_name:
        raise KubeconfigError(f"{where}: context {context_name!r} names no cluster")
    cluster = _named(doc, "clusters", cluster_name, "cluster", where)
    user: Mapping[str, object] = {}
    if isinstance(user_name, str) and user_name:
        user = _named(doc, "users", user_name, "user", where)
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise KubeconfigError(f"{where}: cluster {cluster_name!r} has no server")
    scheme, host, port, prefix = parse_server(server, where)
    base = os.path.dirname(os.path.abspath(path))
    ca_data: bytes | None = None
    ca_file = ""
    raw_ca = cluster.get("certificate-authority-data")
    if raw_ca:
        if not isinstance(raw_ca, str):
            raise KubeconfigError(f"{where}: certificate-authority-data must be a base64 string")
        try:
            ca_data = base64.b64decode(raw_ca, validate=True)
        except ValueError:
            raise KubeconfigError(f"{where}: certificate-authority-data is not valid base64") from None
    elif isinstance(cluster.get("certificate-authority"), str) and cluster["certificate-authority"]:
        ca_file = _resolve(str(cluster["certificate-authority"]), base)
    insecure = cluster.get("insecure-skip-tls-verify") is True
    token = user.get("token")
    if token is not None and not isinstance(token, str):
        raise KubeconfigError(f"{where}: user {user_name!r} token must be a string")
    if not token and isinstance(user.get("tokenFile"), str) and user["tokenFile"]:
        token_path = _resolve(str(user["tokenFile"]), base)
        try:
            token = reader(token_path).decode().strip()  # type: ignore[operator]
        except OSError as err:
            raise KubeconfigError(f"{where}: tokenFile {token_path}: {err.strerror or err}") from None
    server_name = cluster.get("tls-server-name")
    return KubeConfig(scheme, host, port, prefix, ca_data, ca_file, insecure, (token or "").strip(),
                      server_name if isinstance(server_name, str) else "")


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def load_kubeconfig(path: str) -> KubeConfig:
    """Read and parse the kubeconfig file (FileNotFoundError passes through: install-cni has not written it)."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    return parse_kubeconfig(text, path)


def _quote(segment: str) -> str:
    """A path segment, percent-encoded except for unreserved characters."""
    safe = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~")
    return "".join(ch if ch in safe else "".join(f"%{b:02X}" for b in ch.encode()) for ch in segment)


def pod_path(cfg: KubeConfig, namespace: str, name: str) -> str:
    return f"{cfg.prefix}/api/v1/namespaces/{_quote(namespace)}/pods/{_quote(name)}"


def build_request(cfg: KubeConfig, path: str, user_agent: str = "istio-cni", keep_alive: bool = False, *,
                  method: str = "GET", body: bytes | None = None, content_type: str = "application/json") -> bytes:
    """The request, with the bearer token when there is one (`Connection: close` unless `keep_alive`)."""
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    default_port = 443 if cfg.scheme == "https" else 80
    authority = host if cfg.port == default_port else f"{host}:{cfg.port}"
    lines = [f"{method} {path} HTTP/1.1", f"Host: {authority}", "Accept: application/json",
             f"User-Agent: {user_agent}", "Connection: keep-alive" if keep_alive else "Connection: close"]
    if cfg.token:
        lines.append(f"Authorization: Bearer {cfg.token}")
    if body is not None:
        lines += [f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def parse_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-cased names) and body of a complete HTTP/1.1 response (chunked or not)."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        raise ApiError("truncated HTTP response from the API server (no end of headers)")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ApiError(f"malformed HTTP status line from the API server: {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunk(rest)
    elif "content-length" in headers:
        length = int(headers["content-length"]) if headers["content-length"].isdigit() else -1
        if length < 0 or len(rest) < length:
            raise ApiError("truncated HTTP response body from the API server")
        body = rest[:length]
    else:
        body = rest
    return int(parts[1]), headers, body


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while True:
        size_line, sep, data = data.partition(b"\r\n")
        if not sep:
            raise ApiError("truncated chunked HTTP response from the API server")
        try:
            size = int(size_line.split(b";")[0].strip(), 16)
        except ValueError:
            raise ApiError("malformed chunked HTTP response from the API server") from None
        if size == 0:
            return bytes(out)
        if len(data) < size + 2:
            raise ApiError("truncated chunked HTTP response from the API server")
        out += data[:size]
        data = data[size + 2 :]


def decode_pod(status: int, body: bytes, namespace: str, name: str) -> dict[str, object]:
    """The Pod object, or ApiError carrying the API's Status message (as client-go's error says it)."""
    return decode_object(status, body, "Pod", f"{namespace}/{name}")


def decode_object(status: int, body: bytes, kind: str, what: str) -> dict[str, object]:
    """The object of `kind`, or ApiError carrying the API's Status message."""
    try:
        obj = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError, RecursionError):  # nested too deep for the parser: no object either
        obj = None
    if status == 200:
        if not isinstance(obj, dict) or obj.get("kind", kind) != kind:
            raise ApiError(f"the API server returned no {kind} object for {what}", status)
        return obj
    message, reason = "", ""
    if isinstance(obj, dict) and obj.get("kind") == "Status":
        message = str(obj.get("message") or "")
        reason = str(obj.get("reason") or "")
    if not message:
        snippet = body[:200].decode(errors="replace").strip()
        message = f"the server returned HTTP {status}" + (f": {snippet}" if snippet else "")
    raise ApiError(message, status, reason)


def tls_context(cfg: KubeConfig) -> object:
    """The TLS client context the kubeconfig asks for (its CA, or no verification when insecure)."""
    import ssl

    if cfg.insecure:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        if cfg.ca_data is not None:
            return ssl.create_default_context(cadata=cfg.ca_data.decode("ascii", errors="replace"))
        if cfg.ca_file:
            return ssl.create_default_context(cafile=cfg.ca_file)
    except (OSError, ssl.SSLError) as err:
        raise KubeconfigError(f"kubeconfig CA {cfg.ca_file or 'certificate-authority-data'}: {err}") from None
    return ssl.create_default_context()


def get_pod(cfg: KubeConfig, namespace: str, name: str, timeout: float = 5.0) -> dict[str, object]:
    """GET the pod once; ApiError (transport or HTTP status) when it cannot be had."""
    status, body = get(cfg, pod_path(cfg, namespace, name), timeout)
    return decode_pod(status, body, namespace, name)


def get_namespace(cfg: KubeConfig, name: str, timeout: float = 5.0) -> dict[str, object]:
    """GET the namespace once (only asked when ambient_enabled, to tell the user a pod would be ambient)."""
    status, body = get(cfg, f"{cfg.prefix}/api/v1/namespaces/{_quote(name)}", timeout)
    return decode_object(status, body, "Namespace", name)


def get(cfg: KubeConfig, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """One GET: the status and body (ApiError for transport failures)."""
    return request(cfg, "GET", path, timeout=timeout)


def timed_out(cfg: KubeConfig, timeout: float) -> ApiError:
    """The error of a request the API server did not complete within its whole-request deadline."""
    return ApiError(f"the API server {cfg.host}:{cfg.port} did not answer within {timeout:g} s")


def request(cfg: KubeConfig, method: str, path: str, body: bytes | None = None,
            content_type: str = "application/json", timeout: float = 5.0, connect: Connect | None = None,
            context: object = None, user_agent: str = "istio-cni") -> tuple[int, bytes]:
    """One request on a connection of its own: the status and body (ApiError for transport failures).

    `timeout` bounds the whole request (connect, TLS handshake, sending, the whole answer), not each read:
    a server that sends its headers and then a byte now and then is cut off at the deadline.
    `connect(host, port, timeout)` opens the TCP connection (default `socket.create_connection`);
    `context` is the TLS context `tls_context(cfg)` makes, when the caller keeps one between requests.
    """
    data = build_request(cfg, path, user_agent, method=method, body=body, content_type=content_type)
    deadline = time.monotonic() + timeout
    try:
        if connect is None:
            import socket

            sock = socket.create_connection((cfg.host, cfg.port), timeout=timeout)
        else:
            sock = connect(cfg.host, cfg.port, timeout)
    except TimeoutError:
        raise timed_out(cfg, timeout) from None
    except OSError as err:
        raise ApiError(f"cannot connect to the API server {cfg.scheme}://{cfg.host}:{cfg.port}: "
                       f"{err.strerror or err}") from None
    try:
        conn = sock
        if cfg.scheme == "https":
            import ssl

            ctx = context if context is not None else tls_context(cfg)
            try:
                # The socket's timeout bounds the whole handshake (CPython's ssl runs it against one deadline).
                sock.settimeout(remaining(deadline, cfg, timeout))
                conn = ctx.wrap_socket(sock, server_hostname=cfg.server_name or cfg.host)  # type: ignore[attr-defined]
            except TimeoutError:
                raise timed_out(cfg, timeout) from None
            except (OSError, ssl.SSLError) as err:
                raise ApiError(f"TLS handshake with the API server {cfg.host}:{cfg.port} failed: {err}") from None
        chunks: list[bytes] = []
        total = 0
        try:
            conn.settimeout(remaining(deadline, cfg, timeout))
            conn.sendall(data)
            while True:
                conn.settimeout(remaining(deadline, cfg, timeout))
                chunk = conn.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
                if total > MAX_RESPONSE:
                    raise ApiError(f"the API server's response exceeds {MAX_RESPONSE} bytes")
        except TimeoutError:
            raise timed_out(cfg, timeout) from None
        except OSError as err:
            if not chunks:
                raise ApiError(f"reading from the API server {cfg.host}:{cfg.port} failed: {err}") from None
        status, _, payload = parse_response(b"".join(chunks))
        return status, payload
    finally:
        sock.close()


def remaining(deadline: float, cfg: KubeConfig, timeout: float) -> float:
    """Seconds left before `deadline` (time.monotonic), for the next socket operation; the timeout error at 0."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise timed_out(cfg, timeout)
    return left

"""The HTTP server's sans-IO connection and router: what is refused, when, and how requests come out."""

from __future__ import annotations

import h11
import pytest

from istio_agent.httpio.routing import Router, go_clean_path
from istio_agent.httpio.server_core import Limits, Malformed, Request, Response, ServerConnection, error_bytes


def feed(data: bytes, limits: Limits = Limits(), now: float = 0.0) -> ServerConnection:
    conn = ServerConnection(now, "10.0.0.9", limits)
    conn.receive(data, now)
    return conn


def refusal(data: bytes, limits: Limits = Limits()) -> Malformed:
    with pytest.raises(Malformed) as caught:
        feed(data, limits).next_request()
    return caught.value


def test_a_request_comes_out_with_the_headers_as_written_and_the_path_decoded() -> None:
    conn = feed(b"GET /app-health/web%2Flivez?x=1&y HTTP/1.1\r\nHost: pod:15020\r\nX-Kubelet: yes\r\n\r\n")
    request = conn.next_request()
    assert isinstance(request, Request)
    assert (request.method, request.path, request.query_string) == ("GET", "/app-health/web/livez", "x=1&y")
    assert request.headers == (("Host", "pod:15020"), ("X-Kubelet", "yes"))
    assert request.header("x-kubelet") == "yes" and request.header("Accept") is None
    assert request.remote == "10.0.0.9"


def test_absolute_form_targets_route_by_their_path() -> None:
    request = feed(b"GET http://pod:15020/healthz/ready HTTP/1.1\r\nHost: pod\r\n\r\n").next_request()
    assert isinstance(request, Request) and request.path == "/healthz/ready"


@pytest.mark.parametrize(("data", "status", "reason"), [
    (b"\x16\x03\x01\x00\xa5\x01\x00", 400, "TLS"),  # a ClientHello: refused without waiting for a line end
    (b"\x00\x01binary", 400, "not an HTTP request"),
    (b"GARBAGE / HTTP/1.1\r\n", 400, "method"),
    (b"get / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "method"),
    (b"BREW /pot HTTP/1.1\r\nHost: x\r\n\r\n", 400, "method"),
    (b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", 400, "version"),
    (b"GET / HTTP/1.1\r\n\r\n", 400, "Host"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, ""),
    (b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 9000 + b"\r\n\r\n", 431, "header field"),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "target"),
    (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n" + b"x" * 65536, 413, "body"),
    (b"GET / HTTP/1.1\r\nHost: kube-probe/1.31\r\n\r\n", 400, "malformed Host header"),  # as Go's server
    (b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "malformed Host header"),
    (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "multiple Host"),
])
def test_what_is_refused(data: bytes, status: int, reason: str) -> None:
    refused = refusal(data)
    assert refused.status == status and reason in refused.reason


def test_a_head_over_its_limit_is_refused_whether_or_not_it_is_complete() -> None:
    limits = Limits(max_head_bytes=4096)
    many = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 100) for i in range(60))
    assert refusal(b"GET / HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n", limits).status == 431  # complete, too big
    assert refusal(b"GET / HTTP/1.1\r\nHost: x\r\n" + many, limits).status == 431  # still arriving, too big


def test_a_partial_request_waits_and_a_peer_close_mid_request_is_just_closed() -> None:
    conn = feed(b"GET /healthz/ready HTTP/1.1\r\nHo")
    assert conn.next_request() is None and conn.mid_request
    conn.receive(b"", 1.0)
    assert isinstance(conn.next_request(), h11.ConnectionClosed)


def test_deadlines_idle_then_per_request() -> None:
    limits = Limits(request_timeout=10.0, idle_timeout=75.0)
    conn = ServerConnection(100.0, None, limits)
    assert conn.deadline() == 175.0 and not conn.mid_request
    conn.receive(b"GET / HT", 120.0)  # the slowloris clock starts at the request's first byte
    assert conn.next_request() is None and conn.deadline() == 130.0
    conn.receive(b"TP/1.1\r\nHost: x\r\n\r\n", 129.0)
    assert isinstance(conn.next_request(), Request)
    conn.h11.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
    conn.h11.send(h11.EndOfMessage())
    assert conn.next_cycle(129.5)
    assert conn.deadline() == 129.5 + 75.0


def test_pipelined_requests_come_out_in_order() -> None:
    conn = feed(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    paths = []
    while True:
        request = conn.next_request()
        assert isinstance(request, Request)
        paths.append(request.path)
        conn.start_response(200, [("Content-Length", "0")])
        conn.end_response()
        if not conn.next_cycle(1.0):
            break
    assert paths == ["/a", "/b"]


def test_a_client_waiting_for_100_continue_is_told_once() -> None:
    conn = feed(b"POST /log HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    assert conn.next_request() is None
    assert conn.interim() == b"HTTP/1.1 100 Continue\r\n\r\n" and conn.interim() == b""
    conn.receive(b"ok", 1.0)
    request = conn.next_request()
    assert isinstance(request, Request) and request.body == b"ok"


def test_responses_are_framed_by_h11_with_their_reason_phrase() -> None:
    conn = feed(b"GET / HTTP/1.0\r\n\r\n")
    assert isinstance(conn.next_request(), Request)
    head = conn.start_response(503, [("Content-Type", "text/plain"), ("Content-Length", "4")])
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and b"connection: close" in head.lower()
    assert conn.send_body(b"nope") == b"nope"
    conn.end_response()
    assert not conn.next_cycle(1.0), "an HTTP/1.0 client's connection closes after its answer"


def test_error_bytes_is_a_complete_closing_answer() -> None:
    assert error_bytes(431, "too big") == (b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: "
                                           b"text/plain; charset=utf-8\r\nContent-Length: 7\r\nConnection: close"
                                           b"\r\n\r\ntoo big")


async def test_router_exact_prefix_404_and_405() -> None:
    async def ok(request: Request) -> Response:
        return Response(200, request.path.encode())

    router = Router()
    router.add("/healthz/ready", ok)
    router.add_get("/stats/prometheus", ok)
    router.add("/app-health/", ok, prefix=True)
    assert router.resolve("PUT", "/healthz/ready") is ok
    assert router.resolve("HEAD", "/stats/prometheus") is ok
    assert router.resolve("GET", "/app-health/x/livez/extra") is ok
    refused = router.resolve("POST", "/stats/prometheus")
    assert isinstance(refused, Response) and refused.status == 405
    assert (refused.body, dict(refused.headers)["Allow"]) == (b"405: Method Not Allowed", "GET,HEAD")
    missing = router.resolve("GET", "/healthz/ready/")
    assert isinstance(missing, Response) and (missing.status, missing.body) == (404, b"404: Not Found")


def test_a_head_check_sees_the_head_before_the_body_and_can_lower_the_body_limit() -> None:
    heads: list[Request] = []

    def check(head: Request) -> int | None:
        heads.append(head)
        return None if head.header("Authorization") else 10

    conn = ServerConnection(0.0, "10.0.0.9", Limits(), check)
    conn.receive(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n", 0.0)
    with pytest.raises(Malformed) as caught:
        conn.next_request()
    assert (caught.value.status, caught.value.limit) == (413, 10)
    assert [h.path for h in heads] == ["/x"] and heads[0].body == b""
    trusted = ServerConnection(0.0, None, Limits(), check)
    trusted.receive(b"POST /x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer t\r\nContent-Length: 11\r\n\r\n"
                    b"hello world", 0.0)
    request = trusted.next_request()
    assert isinstance(request, Request) and request.body == b"hello world"


def test_a_chunked_body_over_the_checked_limit_is_refused_as_it_arrives() -> None:
    conn = ServerConnection(0.0, None, Limits(), lambda head: 4)
    conn.receive(b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", 0.0)
    with pytest.raises(Malformed) as caught:
        conn.next_request()
    assert (caught.value.status, caught.value.limit) == (413, 4)


def test_a_new_connection_may_get_a_shorter_deadline_for_its_first_request_only() -> None:
    limits = Limits(first_request_timeout=2.0, idle_timeout=75.0)
    conn = ServerConnection(100.0, None, limits)
    assert conn.deadline() == 102.0
    conn.receive(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", 100.5)
    assert isinstance(conn.next_request(), Request)
    conn.h11.send(h11.Response(status_code=204, headers=[]))
    conn.h11.send(h11.EndOfMessage())
    assert conn.next_cycle(101.0) and conn.deadline() == 176.0


def test_refusals_can_be_worded_by_the_server() -> None:
    data = error_bytes(413, "too big", body=b'{"code":413}', content_type="application/json",
                       headers=[("Retry-After", "1")])
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ") and b"Content-Type: application/json" in head
    assert b"Retry-After: 1" in head and b"Connection: close" in head and body == b'{"code":413}'


def test_hosts_go_takes_pass() -> None:
    for host in (b"pod:15020", b"[fd00::1%25eth0]:15020", b"10.1.2.3", b"a_b-c.example~!$&'()*+,;="):
        assert isinstance(feed(b"GET / HTTP/1.1\r\nHost: " + host + b"\r\n\r\n").next_request(), Request), host


@pytest.mark.parametrize(("path", "clean"), [
    ("/", "/"), ("", "/"), ("//app-health/web/livez", "/app-health/web/livez"), ("/a/./b", "/a/b"),
    ("/a/../b", "/b"), ("/..", "/"), ("/../a/", "/a/"), ("/a//b/", "/a/b/"), ("/a/b/..", "/a"), ("/a/.", "/a"),
    ("/a/", "/a/"), ("a/b", "/a/b"),
])
def test_go_clean_path(path: str, clean: str) -> None:
    assert go_clean_path(path) == clean


async def test_a_router_with_clean_paths_redirects_as_go_serve_mux() -> None:
    async def ok(request: Request) -> Response:
        return Response(200)

    router = Router(clean_paths=True)
    router.add("/healthz/ready", ok)
    moved = router.resolve("GET", "/healthz/ready", "//healthz/./ready?full=1")
    assert isinstance(moved, Response) and moved.status == 307
    assert dict(moved.headers)["Location"] == "/healthz/ready?full=1"
    assert moved.body == b'<a href="/healthz/ready?full=1">Temporary Redirect</a>.\n\n'
    head = router.resolve("HEAD", "/x", "/a/../x")
    assert isinstance(head, Response) and (head.status, head.body) == (307, b"")
    assert dict(head.headers)["Content-Type"].startswith("text/html")
    post = router.resolve("POST", "/x", "/a/../x")
    assert isinstance(post, Response) and post.status == 307 and "Content-Type" not in dict(post.headers)
    assert router.resolve("GET", "/healthz/ready", "/healthz/ready") is ok
    assert Router().resolve("GET", "/healthz/ready", "//healthz/ready") != ok  # off by default: 404, no redirect

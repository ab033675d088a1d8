"""istio-cni's kubeconfig reading and its one HTTP exchange, pure parts; and its log entries."""

from __future__ import annotations

import base64
import json

import pytest
import yaml

from istio_agent.cni.install.kubeconfig import KubeconfigInputs, render_kubeconfig
from istio_agent.cni.plugin.log import PluginLog, format_entry, format_time, request_bytes
from istio_agent.kube import yamlsubset
from istio_agent.kube.client import (
    ApiError,
    KubeconfigError,
    build_request,
    decode_pod,
    parse_kubeconfig,
    parse_response,
    parse_server,
    pod_path,
)

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize("inputs", [
    KubeconfigInputs("https://10.96.0.1:443", b"eyJhbGciOiJSUzI1NiJ9.e30.sig", CA),
    KubeconfigInputs("https://[fd00::1]:6443", b"token\n", None, skip_tls_verify=True),
    KubeconfigInputs("http://127.0.0.1:8080", b"123", None, skip_tls_verify=True),
])  # fmt: skip
def test_install_cni_kubeconfig_reads_as_pyyaml_reads_it(inputs: KubeconfigInputs) -> None:
    text = render_kubeconfig(inputs)
    assert yamlsubset.loads_subset(text) == yaml.safe_load(text)


@pytest.mark.parametrize("text", [
    "a: &x 1\nb: *x\n", "a: |\n  line\n", "a: [1, 2]\n", "a: {b: 1}\n", "a: 1.5\n", "a: b\n  c\n", "a:\n- b\n- - c\n",
    "- a\n- b: c\n  d: [x]\n", "a: 'it''s'\nb: \"q\\u0041\"\n", "a: 0x10\n", "a: !!str 1\n", "a: b # comment\n",
])  # fmt: skip
def test_yaml_outside_the_subset_goes_to_pyyaml(text: str) -> None:
    assert yamlsubset.loads(text) == yaml.safe_load(text)


def test_kubeconfig_fields() -> None:
    text = render_kubeconfig(KubeconfigInputs("https://10.96.0.1:6443", b"tok\n", CA))
    cfg = parse_kubeconfig(text, "/etc/cni/net.d/istio-cni-kubeconfig")
    assert (cfg.scheme, cfg.host, cfg.port, cfg.prefix, cfg.token) == ("https", "10.96.0.1", 6443, "", "tok")
    assert cfg.ca_data == CA and not cfg.insecure
    other = {
        "current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "https://api.example:8443/prefix/",
                                              "certificate-authority": "ca.pem", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"tokenFile": "token"}}],
    }
    files = {"/k/token": b"from-file\n"}
    cfg = parse_kubeconfig(json.dumps(other), "/k/config", read_file=lambda p: files[p])
    assert (cfg.host, cfg.port, cfg.prefix, cfg.ca_file, cfg.insecure, cfg.token) == (
        "api.example", 8443, "/prefix", "/k/ca.pem", True, "from-file")
    assert pod_path(cfg, "ns", "a b") == "/prefix/api/v1/namespaces/ns/pods/a%20b"


@pytest.mark.parametrize(("text", "named"), [
    ("current-context: x\n", "contexts"),
    ("[1]", "mapping"),
    ("current-context: c\ncontexts:\n- name: c\n  context:\n    cluster: k\n", "clusters"),
    (json.dumps({"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k"}}],
                 "clusters": [{"name": "k", "cluster": {"server": "ftp://x"}}]}), "server"),
    (json.dumps({"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k"}}],
                 "clusters": [{"name": "k", "cluster": {"server": "https://x",
                                                       "certificate-authority-data": "@@"}}]}),
     "certificate-authority-data"),
])  # fmt: skip
def test_bad_kubeconfigs_name_the_field(text: str, named: str) -> None:
    with pytest.raises(KubeconfigError) as info:
        parse_kubeconfig(text, "/run/kc")
    assert named in str(info.value) and "/run/kc" in str(info.value)


def test_servers() -> None:
    assert parse_server("https://[fd00::1]:6443", "k") == ("https", "fd00::1", 6443, "")
    assert parse_server("https://host", "k") == ("https", "host", 443, "")
    with pytest.raises(KubeconfigError):
        parse_server("https://host:99999", "k")


def test_request_bytes() -> None:
    cfg = parse_kubeconfig(render_kubeconfig(KubeconfigInputs("https://[fd00::1]:6443", b"t0k", CA)), "/k")
    request = build_request(cfg, "/api/v1/namespaces/a/pods/b").decode()
    assert request.startswith("GET /api/v1/namespaces/a/pods/b HTTP/1.1\r\nHost: [fd00::1]:6443\r\n")
    assert "Authorization: Bearer t0k\r\n" in request and request.endswith("\r\n\r\n")


def test_responses() -> None:
    body = json.dumps({"kind": "Pod", "metadata": {"name": "b"}}).encode()
    plain = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    assert decode_pod(*_status_body(plain), "a", "b") == {"kind": "Pod", "metadata": {"name": "b"}}
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % 5 + body[:5] + b"\r\n"
               + b"%x\r\n" % (len(body) - 5) + body[5:] + b"\r\n0\r\n\r\n")
    assert parse_response(chunked)[2] == body
    status = json.dumps({"kind": "Status", "message": 'pods "b" not found', "reason": "NotFound"}).encode()
    with pytest.raises(ApiError) as info:
        decode_pod(404, status, "a", "b")
    assert str(info.value) == 'pods "b" not found' and info.value.status == 404
    with pytest.raises(ApiError, match="HTTP 503"):
        decode_pod(503, b"overloaded", "a", "b")
    with pytest.raises(ApiError, match="truncated"):
        parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")


def _status_body(raw: bytes) -> tuple[int, bytes]:
    status, _, body = parse_response(raw)
    return status, body


def test_log_entries_as_upstream_decodes_them() -> None:
    assert format_time(0.5) == "1970-01-01T00:00:00.500000Z"
    entry = json.loads(format_entry("info", "hello", 1.0, {"pod": "ns/p"}))
    assert entry == {"level": "info", "time": "1970-01-01T00:00:01.000000Z", "msg": "hello", "pod": "ns/p"}
    raw = request_bytes(['{"msg": "a"}'])
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /log HTTP/1.1") and json.loads(body) == ['{"msg": "a"}']
    assert b"Content-Length: %d" % len(body) in head


class _Sink:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_log_level() -> None:
    sink = _Sink()
    log = PluginLog(stderr=sink, clock=lambda: 0.0)  # type: ignore[arg-type]
    log.debug("hidden")
    log.set_level("debug")
    log.debug("shown")
    log.set_level("error")
    log.warn("hidden too")
    assert [json.loads(line)["msg"] for line in log.entries] == ["shown"]
    assert sink.text.count("\n") == 1
    log.set_level("loud")
    assert "plugin_log_level" in json.loads(log.entries[-1])["msg"]


def test_base64_ca_round_trip() -> None:
    text = render_kubeconfig(KubeconfigInputs("https://h:1", b"t", CA))
    assert base64.b64encode(CA).decode() in text


def test_install_cni_reads_the_plugins_log_body() -> None:
    """The node agent's own parser (upstream's uds.go format) takes every entry the plugin sends."""
    from istio_agent.cni.install.pluginlog import parse_body

    entries = [format_entry("warn", "retrying", 1700000000.25, {"pod": "ns/p"}),
               format_entry("debug", "details", 1700000001.0, {})]
    body = request_bytes(entries).split(b"\r\n\r\n", 1)[1]
    lines = parse_body(body)
    assert [(line.msg, line.time, line.labels) for line in lines] == [
        ("retrying", 1700000000.25, (("pod", "ns/p"),)), ("details", 1700000001.0, ())]


def test_a_plugin_log_entry_is_one_line_whatever_it_holds() -> None:
    """log.sock is 0666: a message (or label) with a newline must not end install-cni's line and forge another."""
    from istio_agent.cni.install.pluginlog import parse_body

    forged = "ok\n2026-12-01T10:00:00.000000Z\tinfo\tcni-agent\tIstio CNI configuration and binaries reinstalled"
    entries = [format_entry("info", forged + "\r\x1b[2K\u2028\x85.", 1700000000.0, {"pod\nx": "a\nb", "n": "1"})]
    body = request_bytes(entries).split(b"\r\n\r\n", 1)[1]
    (line,) = parse_body(body)
    text = line.text()
    assert text.splitlines() == [text] and "\x1b" not in text and "\x85" not in text
    assert text == ("ok\\n2026-12-01T10:00:00.000000Z\\tinfo\\tcni-agent\\tIstio CNI configuration and binaries "
                    "reinstalled\\r\\x1b[2K\\u2028\\x85.\tn=1 pod\\nx=a\\nb")


def test_a_deep_log_body_is_refused_as_not_json() -> None:
    import pytest

    from istio_agent.cni.install.pluginlog import PluginLogError, parse_body

    with pytest.raises(PluginLogError, match="nested deeper than 128 levels"):
        parse_body(b"[" * 100_000)
    assert parse_body(b'["' + b"[" * 100_000 + b'"]') == []  # a string of brackets is no nesting: one bad entry

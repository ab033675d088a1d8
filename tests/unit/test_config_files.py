"""Configuration files at start: non-UTF-8 bytes named by file and line; pod files read as upstream reads them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from istio_agent.agent.loader import load_agent_config
from istio_agent.config import env
from istio_agent.config.errors import ConfigError
from istio_agent.config.gounquote import go_unquote
from istio_agent.config.proxyconfig import parse_annotations

POD = {"POD_NAME": "app-1", "POD_NAMESPACE": "default", "SERVICE_ACCOUNT": "app", "INSTANCE_IP": "10.1.1.5"}


def load(workdir: Path) -> object:
    return load_agent_config(env.Environment(POD), workdir)


def test_a_mesh_config_that_is_not_utf8_is_named_with_its_line(tmp_path: Path) -> None:
    mesh = tmp_path / "etc/istio/config/mesh"
    mesh.parent.mkdir(parents=True)
    mesh.write_bytes(b"defaultConfig:\n  discoveryAddress: istiod:15012\n  serviceCluster: caf\xe9\n")
    with pytest.raises(ConfigError, match=rf"mesh config {mesh} line 3: not UTF-8 text \(byte 0xe9 at offset 69\)"):
        load(tmp_path)


@pytest.mark.parametrize("content", [b'app="caf\xe9"\n', b'app=unquoted\n', b'app="a"b"\n'])
def test_a_pod_labels_file_that_does_not_parse_is_left_out_with_a_warning(
        tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture) -> None:
    labels = tmp_path / "etc/istio/pod/labels"
    labels.parent.mkdir(parents=True)
    labels.write_bytes(b'version="v1"\n' + content)
    with caplog.at_level(logging.WARNING):
        config = load_agent_config(env.Environment(POD), tmp_path)
    assert config.labels == {}, "upstream's agent carries on without the file"
    assert f"pod file {labels} line 2" in caplog.text


def test_downward_api_lines_as_upstream_reads_them() -> None:
    text = ('proxy.istio.io/config="discoveryAddress: a:1\\nconcurrency: 3\\n"\n'
            "no equals sign here\n"
            'k8s.io/raw=`back\\quoted`\n'
            'empty=""\n'
            'sidecar.istio.io/x="\\u00e9t\\u00e9 \\x41\\101"')
    assert parse_annotations(text) == {
        "proxy.istio.io/config": "discoveryAddress: a:1\nconcurrency: 3\n",
        "k8s.io/raw": "back\\quoted", "empty": "", "sidecar.istio.io/x": "été AA"}


@pytest.mark.parametrize(("literal", "value"), [
    ('"a\\tb"', "a\tb"), ('"\\a\\b\\f\\v\\\\"', "\a\b\f\v\\"), ('"say \\"hi\\""', 'say "hi"'),
    ("'x'", "x"), ("'\\''", "'"), ("`a\r\nb`", "a\nb"), ('"\\U0001F600"', "\U0001F600"),
])
def test_go_string_literals(literal: str, value: str) -> None:
    assert go_unquote(literal) == value


@pytest.mark.parametrize("literal", [
    "plain", '"open', '"\\\'"', '"\\q"', '"\\x4"', '"\\400"', '"\\uD800"', "'ab'", "`a`b`", '"a\nb"', '"a"b"', '"\\"',
])
def test_go_refuses_what_is_not_a_literal(literal: str) -> None:
    with pytest.raises(ValueError):
        go_unquote(literal)

"""ProxyConfig layers that are plain JSON are read without PyYAML, and read exactly as PyYAML reads them.

`config.proxyconfig.load_document` takes the JSON fast path only for text both
parsers agree on; everything else (floats, escapes, tabs, non-ASCII, YAML) still
goes through PyYAML. Each case compares the result with PyYAML's under the agent's loader (SafeLoader with
go-yaml v2's booleans).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from istio_agent.config.errors import ConfigError
from istio_agent.config.proxyconfig import _NotPlainJson, go_yaml_loader, load_document, plain_json

SAME = [
    '{"concurrency": 2, "discoveryAddress": "istiod.istio-system.svc:15012"}',
    '{"proxyMetadata": {"ISTIO_META_DNS_CAPTURE": "true", "A": ""}, "holdApplicationUntilProxyStarts": true}',
    '{"tracing": {"zipkin": {"address": "z:9411"}}, "statusPort": 15020, "x": null, "l": [1, -0, "2"]}',
    '  {"a": 1, "a": 2}',  # duplicate keys: the last wins in both
    '{"drainDuration": "45s", "n": 123456789012345678901234567890}',
    "{}",
    '\n       {"discoveryAddress": "istiod:15012"}\n',  # the injector's `value: |` block
    '{"a": 1}\r\n',
]
# Forms where json and PyYAML disagree (or may): the fast path refuses them, PyYAML decides.
YAML_DECIDES = [
    '{"sampling": 1e3}',           # PyYAML 1.1: a string
    '{"sampling": 1.5}',
    '{"v": NaN}',
    '{"s": "a\\u00e9b"}',
    '{"s": "a\\/b"}',
    '{"s":\t"tab"}',
    '{"s": "caf\u00e9"}',
    '{"a": 1} # a YAML comment',
    "{a: 1, b: [x, y]}",
    '{"a"\n: 1}',                  # PyYAML: a key and its ':' on one line
    '{"a": [{"b"\n:2}]}',
    '{"' + "k" * 1030 + '": 1}',   # PyYAML: a key within 1,024 characters of its ':'
    '{"a"' + " " * 1030 + ': 1}',
    '{"s": "del\x7f"}',            # PyYAML: DEL is not printable
    '{\n  "a": 1\n}',               # (multi-line JSON: PyYAML reads it, as before)
]


@pytest.mark.parametrize("text", SAME)
def test_plain_json_reads_as_yaml_does(text: str) -> None:
    assert plain_json(text) == yaml.safe_load(text)
    assert load_document(text, "PROXY_CONFIG") == yaml.safe_load(text)


def outcome(parse: Callable[[], Any]) -> Any:
    try:
        return parse()
    except (ConfigError, yaml.YAMLError):
        return "refused"


@pytest.mark.parametrize("text", YAML_DECIDES)
def test_other_forms_are_left_to_yaml(text: str) -> None:
    """Including a tab between tokens, which JSON allows and PyYAML refuses: the start still fails."""
    with pytest.raises(_NotPlainJson):
        plain_json(text)
    assert outcome(lambda: load_document(text, "PROXY_CONFIG")) == outcome(
        lambda: yaml.load(text, Loader=go_yaml_loader()))


def test_yaml_booleans_are_go_yamls() -> None:
    """Upstream's YAML (go-yaml v2) reads y/Y/n/N as booleans too: `ISTIO_META_X: y` is true there."""
    doc = load_document("a: y\nb: N\nc: yes\nd: 'y'\ne: yy\nf: [n, Y]", "PROXY_CONFIG")
    assert doc == {"a": True, "b": False, "c": True, "d": "y", "e": "yy", "f": [False, True]}
    assert yaml.safe_load("a: y") == {"a": "y"}  # PyYAML's own SafeLoader does not


def test_sampling_1e3_stays_a_string_as_with_pyyaml() -> None:
    assert load_document('{"sampling": 1e3}', "PROXY_CONFIG") == {"sampling": "1e3"}


@pytest.mark.parametrize("text", ['{"a": [1, 2}', "{"])
def test_broken_json_is_still_reported_as_yaml_reports_it(text: str) -> None:
    with pytest.raises(ConfigError, match="PROXY_CONFIG: not valid YAML or JSON"):
        load_document(text, "PROXY_CONFIG")


def test_a_json_array_is_not_an_object() -> None:
    with pytest.raises(ConfigError, match="expected an object"):
        load_document("[1, 2]", "PROXY_CONFIG")

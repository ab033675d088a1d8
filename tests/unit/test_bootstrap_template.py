"""Custom bootstrap templates: the Go-template subset, upstream's parameter names, and file selection."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from istio_agent.config import env
from istio_agent.config.errors import ConfigError
from istio_agent.config.node import MetadataOptions, node_metadata
from istio_agent.config.proxyconfig import ProxyConfig
from istio_agent.envoy.bootstrap.options import BootstrapOptions
from istio_agent.envoy.bootstrap.params import template_params
from istio_agent.envoy.bootstrap.render import (
    DEFAULT_TEMPLATE_PATH,
    effective_template_path,
    output_file_name,
    render_bootstrap,
    write_bootstrap,
)
from istio_agent.envoy.bootstrap.template import TemplateError, go_json, render_template


def render(text: str, data: Any) -> str:
    return render_template(text, data)


@pytest.mark.parametrize(("text", "data", "want"), [
    ("a {{ .x }} b", {"x": 1}, "a 1 b"),
    ("a  {{- .x -}}  b", {"x": "v"}, "avb"),
    ("{{/* a comment */}}x", {}, "x"),
    ("{{ .missing }}", {}, "<no value>"),
    ("{{ .a.b }}", {"a": {"b": True}}, "true"),
    ("{{ if .a }}A{{ else if .b }}B{{ else }}C{{ end }}", {"b": 1}, "B"),
    ("{{ if and .a (not .b) }}y{{ end }}", {"a": 1, "b": 0}, "y"),
    ("{{ if or .a .b }}y{{ else }}n{{ end }}", {"a": "", "b": []}, "n"),
    ("{{ range $i, $v := .l }}{{ $i }}={{ $v }};{{ end }}", {"l": ["a", "b"]}, "0=a;1=b;"),
    ("{{ range .l }}[{{ . }}]{{ else }}none{{ end }}", {"l": []}, "none"),
    ("{{ range $k, $v := .m }}{{ $k }}{{ $v }}{{ end }}", {"m": {"b": 2, "a": 1}}, "a1b2"),
    ("{{ with .m }}{{ .k }}{{ end }}", {"m": {"k": "in"}}, "in"),
    ("{{ $x := .v }}{{ $x }}{{ $x = 3 }}{{ $x }}", {"v": 1}, "13"),
    ("{{ range .l }}{{ $.top }}{{ end }}", {"l": [1, 2], "top": "t"}, "tt"),
    ("{{ eq .a \"x\" }} {{ ne .n 2 }} {{ lt .n 3 }} {{ len .l }}", {"a": "x", "n": 2, "l": [1]}, "true false true 1"),
    ("{{ index .m \"k\" 1 }}", {"m": {"k": ["a", "b"]}}, "b"),
    ("{{ printf \"%s:%d %q\" .h .p .h }}", {"h": "host", "p": 80}, 'host:80 "host"'),
    ("{{ .v | default \"d\" | quote }}", {"v": ""}, '"d"'),
    ("{{ js .r }}", {"r": "vhost\\..*\"<"}, "vhost\\\\..*\\\"\\u003C"),
    ("{{ toJSON .m }} {{ toJSON .nothing }}", {"m": {"b": 1, "a": "<"}}, '{"a":"\\u003c","b":1} {}'),
    ("{{ (index .m \"k\").x }}", {"m": {"k": {"x": "deep"}}}, "deep"),
    ("{{ 0.25 }} {{ 3 }} {{ `raw` }}", {}, "0.25 3 raw"),
])
def test_template_language(text: str, data: Any, want: str) -> None:
    assert render(text, data) == want


@pytest.mark.parametrize(("text", "message"), [
    ("x\n{{ if .a }}", "line 2"),
    ("{{ nosuchfunc .a }}", "not defined"),
    ("{{ end }}", "unexpected"),
    ("{{ .a.b.c }}", "nil pointer"),
    ("{{ define \"x\" }}{{ end }}", "not supported"),
    ("{{ $undefined }}", "undefined variable"),
])
def test_template_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        render(text, {})


def options(pc: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> BootstrapOptions:
    config = ProxyConfig()
    config.values.update(pc or {})
    environment = env.Environment(environ or {})
    metadata = node_metadata(MetadataOptions(environment, config.to_json(), instance_ips=("10.1.1.1",),
                                             pilot_san=("spiffe://cluster.local/ns/istio-system/sa/istiod",)))
    return BootstrapOptions("sidecar~10.1.1.1~p.ns~ns.svc.cluster.local", config.to_json(), metadata,
                            instance_ips=("10.1.1.1",), delta_xds=environment.get(env.ISTIO_DELTA_XDS))


# A small custom template in the style users write, using upstream's parameter names.
CUSTOM = """{
  "node": {"id": "{{ .nodeID }}", "cluster": "{{ .cluster }}", "metadata": {{ .meta_json_str }}},
  "layered_runtime": {"layers": [{"name": "global config", "static_layer": {{ .runtime_flags }}}]},
  "admin": {"address": {"socket_address": {"address": "{{ .localhost }}", "port_value": {{ .config.ProxyAdminPort }}}}},
  "stats_config": {"stats_matcher": {"inclusion_list": {"patterns": [
    {{- range $a, $s := .inclusionPrefix }}{"prefix": "{{ $s }}"},{{- end }}
    {{- range $a, $s := .inclusionRegexps }}{"safe_regex": {"regex": "{{ js $s }}"}},{{- end }}
    {"prefix": "istio"}]}}},
  "dynamic_resources": {"ads_config": {"api_type": "{{ .xds_type }}",
    "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}]}},
  "static_resources": {"clusters": [
    {"name": "xds-grpc", "type": "STATIC", "load_assignment": {"cluster_name": "xds-grpc", "endpoints": [{
      "lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": "{{ .config.ConfigPath }}/XDS"}}}}]}]}}
    {{- if .zipkin }},
    {"name": "zipkin", "type": "STRICT_DNS", "dns_lookup_family": "{{ .dns_lookup_family }}",
     "load_assignment": {"cluster_name": "zipkin", "endpoints": [{
       "lb_endpoints": [{"endpoint": {"address": {"socket_address": {{ .zipkin }}}}}]}]}}
    {{- end }}
  ]},
  "san": {{ .pilot_SAN }}
}
"""


def test_custom_template_sees_upstreams_parameters() -> None:
    opts = options({"tracing": {"zipkin": {"address": "zipkin.istio-system:9411"}}, "proxyAdminPort": 15005})
    got = json.loads(render_template(CUSTOM, template_params(opts)))
    builtin = render_bootstrap(opts)
    assert got["node"] == {k: builtin["node"][k] for k in ("id", "cluster", "metadata")}
    assert got["layered_runtime"]["layers"][0] == builtin["layered_runtime"]["layers"][0]
    assert got["admin"] == {"address": builtin["admin"]["address"]}
    patterns = got["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
    assert {"safe_regex": {"regex": r"vhost\..*\.route\..*"}} in patterns
    clusters = {c["name"]: c for c in builtin["static_resources"]["clusters"]}
    assert got["static_resources"]["clusters"][1]["load_assignment"] == clusters["zipkin"]["load_assignment"]
    assert got["static_resources"]["clusters"][0]["load_assignment"] == clusters["xds-grpc"]["load_assignment"]
    assert got["san"] == [{"exact": "spiffe://cluster.local/ns/istio-system/sa/istiod"}]
    assert got["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"
    assert "zipkin" not in template_params(options())


def test_meta_json_str_is_go_json() -> None:
    params = template_params(options())
    assert params["meta_json_str"] == go_json(dict(options().metadata))
    assert json.loads(params["meta_json_str"])["PILOT_SAN"] == ["spiffe://cluster.local/ns/istio-system/sa/istiod"]


def test_template_path_precedence() -> None:
    assert effective_template_path({}) == DEFAULT_TEMPLATE_PATH
    assert effective_template_path({"proxyBootstrapTemplatePath": "/p"}) == "/p"
    assert effective_template_path({"proxyBootstrapTemplatePath": "/p"}, template_file="/flag") == "/flag"
    assert effective_template_path({"customConfigFile": "/c", "proxyBootstrapTemplatePath": "/p"}, "", "/f") == "/c"
    assert effective_template_path({"customConfigFile": "/c"}, istio_bootstrap="/env") == "/env"
    assert output_file_name("/x/custom.yaml.tmpl") == "envoy-rev.yaml"
    assert output_file_name("/x/custom.yaml") == "envoy-rev.yaml"
    assert output_file_name("/x/custom.json") == "envoy-rev.json"


def test_write_builtin_and_custom(tmp_path: Path) -> None:
    opts = options({"configPath": "./etc/istio/proxy"})
    written = write_bootstrap(opts, tmp_path)
    assert written.path == tmp_path / "etc/istio/proxy/envoy-rev.json"
    assert written.template is None
    assert json.loads(written.path.read_text()) == render_bootstrap(opts)

    template = tmp_path / "custom.yaml"
    template.write_text("node:\n  id: {{ .nodeID }}\n")
    custom = write_bootstrap(opts, tmp_path, istio_bootstrap=str(template))
    assert custom.path == tmp_path / "etc/istio/proxy/envoy-rev.yaml"
    assert custom.path.read_text() == f"node:\n  id: {opts.node_id}\n"

    default_file = tmp_path / DEFAULT_TEMPLATE_PATH
    default_file.parent.mkdir(parents=True)
    default_file.write_text('{"cluster": "{{ .cluster }}"}')
    assert json.loads(write_bootstrap(opts, tmp_path).path.read_text()) == {"cluster": "istio-proxy"}


def test_missing_or_broken_custom_template_is_a_config_error(tmp_path: Path) -> None:
    opts = options({"customConfigFile": str(tmp_path / "nope.json")})
    with pytest.raises(ConfigError, match=r"nope\.json"):
        write_bootstrap(opts, tmp_path)
    broken = tmp_path / "broken.json"
    broken.write_text("{{ if .nodeID }}")
    with pytest.raises(ConfigError, match=r"broken\.json: line 1"):
        write_bootstrap(options({"customConfigFile": str(broken)}), tmp_path)


def test_lightstep_token_file_is_written(tmp_path: Path) -> None:
    opts = options({"configPath": str(tmp_path / "proxy"),
                    "tracing": {"lightstep": {"address": "ls:8080", "accessToken": "secret"}}})
    written = write_bootstrap(opts, tmp_path)
    assert (tmp_path / "proxy/lightstep_access_token.txt").read_text() == "secret"
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "proxy/lightstep_access_token.txt").stat().st_mode & 0o777 == 0o666 & ~umask, \
        "os.WriteFile's 0o666 under the umask, as upstream's"
    tracer = json.loads(written.path.read_text())["tracing"]["http"]["typed_config"]
    assert tracer["access_token_file"] == str(tmp_path / "proxy/lightstep_access_token.txt")


def test_go_formatting_of_json_floats_and_durations() -> None:
    """What a Go template pastes: encoding/json's floats and time.Duration's String()."""
    from istio_agent.envoy.bootstrap.gofmt import go_duration

    assert go_json({"b": [1.0, 2.5, 1e-7, 1e21, 0.000001], "a": "<&>"}) == (
        '{"a":"\\u003c\\u0026\\u003e","b":[1,2.5,1e-7,1e+21,0.000001]}')
    assert [go_duration(s) for s in (0, 0.5, 10, 90, 3661.25)] == ["0s", "500ms", "10s", "1m30s", "1h1m1.25s"]
    assert render_template("{{ toJson .b }}", {"b": [{"buckets": [1.0, 5.0]}]}) == '[{"buckets":[1,5]}]'

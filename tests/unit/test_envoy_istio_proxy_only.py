"""The istio-proxy-only parts of a bootstrap: found, named from Envoy's own words, and left out."""

from __future__ import annotations

from typing import Any

from istio_agent.envoy.istio_proxy_only import istio_proxy_only_types, unregistered_type, without_types

TYPED_STRUCT = "type.googleapis.com/udpa.type.v1.TypedStruct"
METADATA = {"name": "metadata_discovery", "typed_config": {
    "@type": TYPED_STRUCT, "type_url": "type.googleapis.com/istio.workload.BootstrapExtension", "value": {}}}
INTERNAL = {"name": "envoy.bootstrap.internal_listener", "typed_config": {
    "@type": TYPED_STRUCT,
    "type_url": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener"}}
LIGHTSTEP = {"http": {"name": "envoy.lightstep", "typed_config": {
    "@type": "type.googleapis.com/envoy.config.trace.v3.LightstepConfig", "collector_cluster": "lightstep"}}}
ZIPKIN = {"http": {"name": "envoy.zipkin", "typed_config": {
    "@type": "type.googleapis.com/envoy.config.trace.v3.ZipkinConfig"}}}


def bootstrap(**fields: Any) -> dict[str, Any]:
    return {"admin": {}, "bootstrap_extensions": [METADATA, INTERNAL], **fields}


def test_found_in_extensions_and_the_tracer() -> None:
    assert istio_proxy_only_types(bootstrap()) == {"istio.workload.BootstrapExtension"}
    assert istio_proxy_only_types(bootstrap(tracing=LIGHTSTEP)) == {
        "istio.workload.BootstrapExtension", "envoy.config.trace.v3.LightstepConfig"}
    assert istio_proxy_only_types({"bootstrap_extensions": [INTERNAL], "tracing": ZIPKIN}) == set()
    assert istio_proxy_only_types({}) == set()


def test_the_unregistered_type_is_read_from_envoys_validation_error() -> None:
    output = ("[critical][main] error initializing configuration '/p/envoy-rev.json': Didn't find a registered "
              "implementation for 'metadata_discovery' with type URL: 'istio.workload.BootstrapExtension'\n")
    assert unregistered_type(output) == "istio.workload.BootstrapExtension"
    assert unregistered_type("error initializing configuration: Unable to parse JSON") == ""


def test_only_the_named_parts_are_left_out() -> None:
    original = bootstrap(tracing=LIGHTSTEP)
    trimmed = without_types(original, ["istio.workload.BootstrapExtension"])
    assert trimmed["bootstrap_extensions"] == [INTERNAL] and trimmed["tracing"] == LIGHTSTEP
    assert "tracing" not in without_types(original, ["envoy.config.trace.v3.LightstepConfig"])
    assert original["bootstrap_extensions"] == [METADATA, INTERNAL], "the input is not changed"
    assert without_types({"tracing": ZIPKIN}, ["envoy.config.trace.v3.LightstepConfig"]) == {"tracing": ZIPKIN}

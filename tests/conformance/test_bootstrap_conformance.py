"""Every case of the kit's Envoy bootstrap goldens (`<kit>/bootstrap`, ../shared/conformance by default).

Inputs are built as the kit's README and manifest describe them, every field
honoured: the ProxyConfig from the `.proxycfg` text format with the case's
overrides (config path under the scratch directory, the template path, status
port 15020 when unset, added `proxyMetadata`), node metadata from the shared
inputs, the case's environment list (a later entry wins) and annotations file,
the compliance policy and the secure metrics ports. The bootstrap is written by
`write_bootstrap`, the kit's normalisation regexes (read from its manifest) are
applied to the written text, the Lightstep token file must exist exactly when
the case expects it, the stats matcher must list the expected patterns, and
the rest must equal the golden as parsed JSON.

`ISTIO_AGENT_CONFORMANCE_DIR` points this at another copy of the kit in the
same format (for instance one built from all of upstream's TestGolden cases).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from envoy_types import as_envoy_bootstrap
from google.protobuf import json_format, text_format
from needs import need_conformance
from support import CONFORMANCE, scored_cases

from istio_agent.config import env
from istio_agent.config.node import MetadataOptions, node_metadata
from istio_agent.config.proxyconfig import ProxyConfig, parse_annotations, parse_layer
from istio_agent.envoy.bootstrap.options import BootstrapOptions
from istio_agent.envoy.bootstrap.render import write_bootstrap
from istio_agent.protos import proxyconfig_pb2

STATS_METADATA_KEYS = (
    "sidecar.istio.io/statsInclusionPrefixes",
    "sidecar.istio.io/statsInclusionSuffixes",
    "sidecar.istio.io/statsInclusionRegexps",
)
SCRATCH = "<scratch>"


def _cases() -> list[str]:
    manifest = CONFORMANCE / "bootstrap" / "manifest.json"
    if not manifest.exists():
        return ["kit-missing"]
    return [case["name"] for case in scored_cases(json.loads(manifest.read_text())["cases"])]


def _override_path(text: str, scratch: Path) -> str:
    """`<scratch>/bootstrap/x  (a note)` -> the path under this test's scratch directory."""
    path = re.split(r"\s+\(|\s{2,}", text.strip(), maxsplit=1)[0]
    return path.replace(SCRATCH, str(scratch))


def _proxy_config(kit: Path, case: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """The case's ProxyConfig in protojson shape, with the overrides upstream's test applies."""
    message = text_format.Parse((kit / case["proxycfg"]).read_text(), proxyconfig_pb2.ProxyConfig())
    values = parse_layer(json_format.MessageToDict(message), case["proxycfg"])
    overrides = case["inputs"].get("proxy_config_overrides") or {}
    # Upstream names the directory after the proxycfg it loaded (a case may reuse another's proxycfg).
    default_path = f"{SCRATCH}/bootstrap/{Path(case['proxycfg']).stem}"
    values["configPath"] = _override_path(overrides.get("config_path") or default_path, scratch)
    values["customConfigFile"] = f"{scratch}/envoy_bootstrap.json"
    if not values.get("statusPort"):
        values["statusPort"] = 15020
    added = overrides.get("proxy_metadata_added") or case["inputs"].get("proxy_metadata_added") or {}
    if added:
        values["proxyMetadata"] = {**values.get("proxyMetadata", {}), **added}
    return ProxyConfig(values=values).to_json()


def _environment(case: dict[str, Any]) -> env.Environment:
    environ: dict[str, str] = {}
    for item in case["inputs"].get("process_env_list") or []:
        key, _, value = item.partition("=")
        environ[key] = value  # a later entry wins, as in the kit's list
    return env.Environment(environ)


def _options(kit: Path, manifest: dict[str, Any], case: dict[str, Any], scratch: Path) -> BootstrapOptions:
    shared = manifest["shared_inputs"]
    inputs = case["inputs"]
    platform = shared.get("platform") or {}
    assert not (platform.get("locality") or platform.get("metadata") or platform.get("labels")), \
        "platform locality, metadata or labels in the kit: this test feeds none (see test_options_platform.py)"
    environment = _environment(case)
    proxy_config = _proxy_config(kit, case, scratch)
    annotations_file = scratch / "annotations"
    annotations_file.write_text(inputs.get("pod_annotations_file") or "")
    annotations = parse_annotations(annotations_file.read_text()) or dict(inputs.get("pod_annotations") or {})
    metadata = node_metadata(MetadataOptions(
        environment, proxy_config,
        instance_ips=tuple(shared["instance_ips"]),
        annotations=annotations,
        pilot_san=tuple(shared["pilot_subject_alt_names"]),
        outlier_log_path=shared["outlier_log_path"],
        envoy_status_port=shared["envoy_status_port"],
        envoy_prometheus_port=shared["envoy_prometheus_port"],
        envoy_secure_metrics_port=int(inputs.get("secure_metrics_port") or 0),
        envoy_secure_merged_metrics_port=int(inputs.get("secure_merged_metrics_port") or 0),
        workload_identity_socket_file=shared["workload_identity_socket_file"],
        exit_on_zero_active_connections=environment.get(env.EXIT_ON_ZERO_ACTIVE_CONNECTIONS),
        sts_port=int(shared.get("sts_port") or 0),
        istio_version=shared["binary_istio_version"],
        credential_socket_exists=bool(shared.get("credential_socket_exists")),
        custom_credentials_file_exists=bool(shared.get("custom_credentials_file_exists")),
    ))
    opts = BootstrapOptions(
        shared["node_id"], proxy_config, metadata,
        instance_ips=tuple(dict.fromkeys(shared["instance_ips"])),
        delta_xds=environment.get(env.ISTIO_DELTA_XDS),
        dual_stack=environment.get(env.ISTIO_DUAL_STACK),
        log_as_json=bool(shared.get("log_as_json")),
        compliance_policy=inputs.get("compliance_policy") or "",
        strip_fragment=environment.get(env.HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED),
        host_ip=environment.get(env.HOST_IP),
        status_port_proxy_protocol=environment.get(env.ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL),
    )
    # Upstream points customConfigFile at its template; here the built-in rendering is that
    # template, so only the metadata copy of ProxyConfig carries the path.
    renderer_config = {k: v for k, v in opts.proxy_config.items() if k != "customConfigFile"}
    return dataclasses.replace(opts, proxy_config=renderer_config)


def _normalise(text: str, manifest: dict[str, Any], case: dict[str, Any], scratch: Path) -> str:
    """The kit's step 1, applied to the written text (whitespace around ':' made optional)."""
    for step in manifest["comparison"]["step_1_normalise_generated_text"]:
        if step.get("only_when") == "check_locality is false" and case["check_locality"]:
            continue
        if step["regex"].startswith("<"):
            text = text.replace(str(scratch), step["replace"])
            continue
        pattern = step["regex"].replace('": "', '":\\s*"').replace('":"', '":\\s*"')
        replacement = re.sub(r"\$(\d)", r"\\g<\1>", step["replace"])
        text = re.sub(pattern, replacement, text)
    return text


def _patterns(bootstrap: dict[str, Any]) -> dict[str, list[str]]:
    patterns = bootstrap["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
    return {
        "prefixes": [p["prefix"] for p in patterns if "prefix" in p],
        "suffixes": [p["suffix"] for p in patterns if "suffix" in p],
        "regexps": [p["safe_regex"]["regex"] for p in patterns if "safe_regex" in p],
    }


def _strip_stats(bootstrap: dict[str, Any]) -> None:
    del bootstrap["stats_config"]["stats_matcher"]
    for key in STATS_METADATA_KEYS:
        bootstrap["node"]["metadata"].pop(key, None)


def _differences(want: Any, got: Any, path: str = "") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out: list[str] = []
        for key in sorted(set(want) | set(got)):
            if key not in got:
                out.append(f"{path}/{key}: missing")
            elif key not in want:
                out.append(f"{path}/{key}: unexpected {got[key]!r}")
            else:
                out += _differences(want[key], got[key], f"{path}/{key}")
        return out
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [d for i, (w, g) in enumerate(zip(want, got, strict=True)) for d in _differences(w, g, f"{path}[{i}]")]
    return [] if want == got else [f"{path}: want {want!r}, got {got!r}"]


@pytest.mark.parametrize("name", _cases())
def test_bootstrap_golden(name: str, tmp_path: Path) -> None:
    kit = need_conformance("bootstrap")
    manifest = json.loads((kit / "manifest.json").read_text())
    case = next(c for c in manifest["cases"] if c["name"] == name)
    scratch = tmp_path

    opts = _options(kit, manifest, case, scratch)
    written = write_bootstrap(opts, workdir=scratch)
    assert written.path == Path(opts.config_path) / "envoy-rev.json"
    assert written.template is None
    token = written.path.parent / "lightstep_access_token.txt"
    assert token.exists() == bool(case.get("expect_lightstep_token_file"))

    got = json.loads(_normalise(written.path.read_text(), manifest, case, scratch))
    want = json.loads((kit / case["golden"]).read_text())
    as_envoy_bootstrap(got)  # step 2: both must be valid Envoy v3 Bootstrap messages
    as_envoy_bootstrap(want)

    expected = case["expected_stats_matcher"]
    assert _patterns(got) == expected
    assert _patterns(want) == expected
    _strip_stats(got)
    _strip_stats(want)
    diff = _differences(want, got)
    assert not diff, "\n".join(diff)
    assert got == want

"""deploy/'s Helm values: they parse, set the keys Istio's charts read, and name the images `make image` tags."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _values(name: str) -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / name).read_text())
    assert isinstance(data, dict), f"{name} is not a YAML mapping"
    return data


def test_istiod_values_inject_our_proxy_image() -> None:
    values = _values("values-istiod.yaml")
    image = f"localhost/istio-agent/proxyv2:{VERSION}"
    # Istio's injection template uses these verbatim when they contain "/" (else hub/image:tag).
    assert values["global"]["proxy"]["image"] == image
    assert values["global"]["proxy_init"]["image"] == image
    assert "/" in image
    # istiod's own image (global.hub/global.tag) stays upstream's.
    assert "hub" not in values["global"] and "tag" not in values["global"]
    assert values["global"]["imagePullPolicy"] == "IfNotPresent"
    assert set(values) == {"global"}
    assert set(values["global"]) == {"proxy", "proxy_init", "imagePullPolicy"}


def test_istiod_cni_values_switch_the_injector_to_istio_validation() -> None:
    assert _values("values-istiod-cni.yaml") == {"pilot": {"cni": {"enabled": True}}}


def test_cni_values_run_our_install_cni_image_with_the_runtime_path_it_was_built_for() -> None:
    values = _values("values-cni.yaml")
    assert values["image"] == f"localhost/istio-agent/install-cni:{VERSION}"
    assert values["pullPolicy"] == "IfNotPresent"
    assert set(values) == {"image", "pullPolicy", "cniBinDir", "cniConfDir"}
    runtime = f"{values['cniBinDir']}/istio-cni.d"
    containerfile = (REPO / "packaging/images/Containerfile.install-cni").read_text()
    assert re.findall(r"^ARG RUNTIME=(\S+)$", containerfile, re.M) == [runtime, runtime]
    assert f"CNI_RUNTIME=${{CNI_RUNTIME:-{runtime}}}" in (REPO / "packaging/images/build.sh").read_text()


def test_guide_names_every_values_file_and_the_make_targets() -> None:
    guide = (DEPLOY / "README.md").read_text()
    for name in sorted(p.name for p in DEPLOY.glob("values-*.yaml")):
        assert f"`{name}`" in guide
    for needle in ("make image", "make image-check", "global.proxy.image", "global.proxy_init.image",
                   "CA_ADDR", "discoveryAddress", "istio-token", "root-cert.pem", "istio-injection=enabled"):
        assert needle in guide, needle

"""What install-cni loads (it idles on every node, so its memory is a feature): no aiohttp, no protobuf or grpc,
no YAML parser unless an ambient enablement selector needs one, and the product's own metrics rather than
prometheus_client (one metrics stack); checked in a fresh interpreter."""

from __future__ import annotations

from support import loaded_after


def test_install_cni_runtime_stays_light() -> None:
    loaded = loaded_after(
        "import istio_agent.cni.install.main, istio_agent.cni.install.installer, istio_agent.cni.install.servers\n"
        "import istio_agent.cni.install.metrics, istio_agent.cni.install.watcher\n"
        "import istio_agent.cni.install.assembly, istio_agent.cni.install.components\n"
        "from istio_agent.cni.install.installer import Installer\n"
        "from istio_agent.cni.install.options import InstallOptions\n"
        "from pathlib import Path\n"
        "Installer(InstallOptions(), Path('/nonexistent'), None)\n")
    assert "h11" in loaded and "istio_agent.metrics.exposition" in loaded
    heavy = {"aiohttp", "yaml", "google.protobuf", "grpc", "kubernetes", "istio_agent.agent", "istio_agent.status",
             "prometheus_client"}
    assert not loaded & heavy, loaded & heavy

"""install-cni's CNI config step against upstream's goldens (conformance/cni-install), read at test time.

`create_config_file` cases run the installer's config step (`wait_for_config`, with the real
inotify watcher) on a scratch net dir holding the case's files; `wait_timeout` cases must still
be waiting after ~100 ms (upstream's cancel) and leave no result. `insert_plugin_entry` cases run
the pure merge; `cleanup` cases the installer's cleanup of a file it wrote. Results are compared
as upstream does: text after trimming whitespace.
"""

from __future__ import annotations

import asyncio
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
from needs import need, need_conformance
from support import CONFORMANCE, conformance_cases

from istio_agent.cni.install import cniconfig
from istio_agent.cni.install.installer import Installer, wait_for_config, watched_directories
from istio_agent.cni.install.options import InstallOptions
from istio_agent.cni.install.watcher import DirectoryWatcher

KIT = CONFORMANCE / "cni-install"


CASES = conformance_cases("cni-install")


def _of(kind: str) -> list[dict[str, Any]]:
    return [c for c in CASES if c["kind"] == kind]


@pytest.fixture(autouse=True)
def _kit() -> None:
    need_conformance("cni-install")
    need(bool(CASES), "conformance/cni-install/cases.json holds no cases")


def kit_text(name: str) -> str:
    return (KIT / name).read_text()


def options_for(settings: dict[str, Any], net_dir: Path) -> InstallOptions:
    return InstallOptions(
        mounted_cni_net_dir=str(net_dir),
        cni_conf_name=settings.get("cni_conf_name", ""),
        chained_cni_plugin=settings.get("chained_cni_plugin", True),
        ambient_enabled=settings.get("ambient_enabled", False),
        istio_owned_cni_config=settings.get("istio_owned_cni_config", False),
        istio_owned_cni_config_filename=settings.get("istio_owned_cni_config_filename", ""),
        plugin_log_level=settings.get("plugin_log_level", "info"),
        cni_agent_run_dir=settings.get("cni_agent_run_dir", "/var/run/istio-cni"),
        pod_namespace=settings.get("pod_namespace", ""),
        exclude_namespaces=settings.get("exclude_namespaces", ""),
        ambient_enablement_selector=settings.get("ambient_enablement_selector", ""),
        enable_ambient_detection_retry=settings.get("enable_ambient_detection_retry", False),
        native_nftables=settings.get("native_nftables", False),
        cni_bin_dir=str(net_dir.parent / "bin"),
        service_account_dir=str(net_dir.parent / "sa"),
    )


def test_kit_is_complete() -> None:
    # Every scored case is of a kind this module runs (a new kind would otherwise go unrun, silently).
    assert {c["kind"] for c in CASES} <= {"create_config_file", "insert_plugin_entry", "cleanup"}


@pytest.mark.parametrize("case", _of("create_config_file"), ids=lambda c: c["name"])
async def test_create_config_file(case: dict[str, Any], tmp_path: Path) -> None:
    net_dir = tmp_path / "net"
    net_dir.mkdir()
    for target, source in case["existing_files"].items():
        shutil.copyfile(KIT / source, net_dir / target)
        (net_dir / target).chmod(0o604)  # a mode neither ours (0600/0640) nor the umask's
    before = {p.name: p.read_bytes() for p in net_dir.iterdir()}
    options = options_for(case["settings"], net_dir)
    installer = Installer(options, Path("/nonexistent/istio-cni"), None)
    watcher = DirectoryWatcher(watched_directories(options, None))
    watcher.start()
    expect = case["expect"]
    try:
        if expect["outcome"] == "wait_timeout":
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(wait_for_config(installer, watcher), 0.1)
            assert {p.name: p.read_bytes() for p in net_dir.iterdir()} == before, "waiting must write nothing"
            return
        written = await asyncio.wait_for(wait_for_config(installer, watcher), 5)
    finally:
        watcher.close()
    assert written == expect["result_file"]
    result = net_dir / expect["result_file"]
    assert result.read_text().strip() == kit_text(expect["golden"]).strip()
    for name in expect.get("untouched_files", []):
        assert (net_dir / name).read_bytes() == before[name], name
    for name in expect.get("removed_files", []):
        assert not (net_dir / name).exists(), name
    # Only the result (and any renamed source) changed; no temporary file is left behind.
    assert sorted(p.name for p in net_dir.iterdir()) == sorted(
        (set(before) - set(expect.get("removed_files", []))) | {expect["result_file"]})
    # The mode: a merge in place keeps the primary's, a file of our own gets the configured 0600.
    mode = stat.S_IMODE(result.stat().st_mode)
    if options.chained_cni_plugin and not installer.settings.istio_owned:
        assert mode == 0o604
    else:
        assert mode == 0o600


@pytest.mark.parametrize("case", _of("insert_plugin_entry"), ids=lambda c: c["name"])
def test_insert_plugin_entry(case: dict[str, Any]) -> None:
    istio, existing = kit_text(case["istio_entry"]), kit_text(case["existing_config"])
    if case["expect"]["outcome"] == "error":
        with pytest.raises(cniconfig.CniConfigError):
            cniconfig.insert_plugin_entry(istio, existing)
        return
    merged = cniconfig.marshal_config(cniconfig.insert_plugin_entry(istio, existing))
    assert merged.strip() == kit_text(case["expect"]["golden"]).strip()


@pytest.mark.parametrize("case", _of("cleanup"), ids=lambda c: c["name"])
def test_cleanup(case: dict[str, Any], tmp_path: Path) -> None:
    net_dir = tmp_path / "net"
    net_dir.mkdir()
    config = case["config_file"]
    path = net_dir / config["name"]
    shutil.copyfile(KIT / config["content"], path)
    other = net_dir / "00-other.conflist"
    other.write_text(kit_text("inputs/list.conflist"))
    installer = Installer(options_for(case["settings"], net_dir), Path("/nonexistent/istio-cni"), None)
    installer.written = config["name"]  # the file a previous install wrote
    installer.cleanup()
    if case["expect"].get("config_file_deleted"):
        assert not path.exists()
    else:
        assert path.read_text().strip() == kit_text(case["expect"]["config_file_golden"]).strip()
    assert other.read_text() == kit_text("inputs/list.conflist")


def test_group_read_mode_for_our_own_file(tmp_path: Path) -> None:
    """--cni-conf-group-read: a file of our own (standalone here) is 0640 instead of 0600."""
    net_dir = tmp_path / "net"
    net_dir.mkdir()
    options = InstallOptions(mounted_cni_net_dir=str(net_dir), chained_cni_plugin=False, cni_conf_group_read=True)
    installer = Installer(options, Path("/nonexistent/istio-cni"), None)
    assert installer.sync_config() == (True, None)
    assert stat.S_IMODE((net_dir / cniconfig.STANDALONE_DEFAULT_NAME).stat().st_mode) == 0o640

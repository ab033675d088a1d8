"""Writing the bootstrap (atomic, modes, directories) and the readiness probe over it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from istio_agent.grpcxds.bootstrap import GrpcBootstrapOptions
from istio_agent.grpcxds.readiness import BootstrapError, BootstrapProbe, watched_files
from istio_agent.grpcxds.writer import BootstrapWriter, write_atomic, write_bootstrap_file


def _options(cert_dir: str = "") -> GrpcBootstrapOptions:
    return GrpcBootstrapOptions(node_id="sidecar~1.1.1.1~p.ns~ns.svc.cluster.local", metadata={},
                                xds_uds_path="/x/XDS", cert_dir=cert_dir)


def test_write_creates_directories_and_sets_modes(tmp_path: Path) -> None:
    target = tmp_path / "etc/istio/proxy/grpc-bootstrap.json"
    data = write_bootstrap_file(target, _options())
    assert target.read_bytes() == data
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "etc").stat().st_mode) == 0o700 & ~_umask()
    assert os.listdir(target.parent) == ["grpc-bootstrap.json"], "no temporary file left behind"


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_write_replaces_in_one_rename(tmp_path: Path) -> None:
    target = tmp_path / "b.json"
    target.write_text("old")
    before = target.stat().st_ino
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert target.stat().st_ino != before, "a new inode renamed over the old one, never rewritten in place"


def test_write_failure_leaves_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        write_atomic(blocker / "sub" / "b.json", b"x")
    directory = tmp_path / "dir"
    directory.mkdir()
    (directory / "b.json").mkdir()  # renaming a file over a directory fails
    with pytest.raises(OSError):
        write_atomic(directory / "b.json", b"x")
    assert os.listdir(directory) == ["b.json"]


async def test_writer_component_names_the_path_on_failure(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = BootstrapWriter(blocker / "grpc-bootstrap.json", _options())
    with pytest.raises(OSError, match="failed generating gRPC XDS bootstrap"):
        await writer.start()
    ok = BootstrapWriter(tmp_path / "ok.json", _options())
    await ok.start()
    await ok.stop()
    assert (tmp_path / "ok.json").exists(), "left in place on stop"


def test_probe_not_ready_until_bootstrap_then_certificates(tmp_path: Path) -> None:
    target = tmp_path / "etc/istio/proxy/grpc-bootstrap.json"
    probe = BootstrapProbe(target, tmp_path)
    reason = probe.check()
    assert reason is not None and reason.startswith(f"failed loading {target}")

    write_bootstrap_file(target, _options(cert_dir="var/lib/istio/data"))
    assert probe.check() == "var/lib/istio/data/cert-chain.pem does not exist"
    certs = tmp_path / "var/lib/istio/data"
    certs.mkdir(parents=True)
    for name in ("cert-chain.pem", "key.pem"):
        (certs / name).write_text("x")
    assert probe.check() == "var/lib/istio/data/root-cert.pem does not exist"
    (certs / "root-cert.pem").write_text("x")
    assert probe.check() is None


def test_probe_without_certificate_provider_is_ready_once_loaded(tmp_path: Path) -> None:
    target = tmp_path / "b.json"
    write_bootstrap_file(target, _options())
    probe = BootstrapProbe(target, tmp_path)
    assert probe.check() is None
    target.unlink()
    assert probe.check() is None, "like upstream, the bootstrap is loaded once and kept"


_BAD_PROVIDER = '{"certificate_providers": {"default": {"plugin_name": "file_watcher", "config": 1}}}'


@pytest.mark.parametrize("text", ["{", "[]", '{"xds_servers": {}}', '{"certificate_providers": []}', _BAD_PROVIDER])
def test_probe_refuses_malformed_bootstraps(tmp_path: Path, text: str) -> None:
    target = tmp_path / "b.json"
    target.write_text(text)
    reason = BootstrapProbe(target, tmp_path).check()
    assert reason is not None and reason.startswith("failed loading")


def test_watched_files_picks_the_file_watcher_provider() -> None:
    doc = {"certificate_providers": {
        "other": {"plugin_name": "something_else", "config": {}},
        "default": {"plugin_name": "file_watcher", "config": {"certificate_file": "/c", "ca_certificate_file": "/r"}},
    }, "unknown_field": 1}
    assert watched_files(doc) == ["/c", "", "/r"]
    assert watched_files({}) == []
    with pytest.raises(BootstrapError):
        watched_files(json.loads('{"node": "x"}'))

"""OUTPUT_CERTS writer: atomic, 0600, and silent when nothing changed."""

from __future__ import annotations

import os
from pathlib import Path

from istio_agent.security.output import write_if_changed, write_output_certs


def test_writes_three_files_with_mode_0600(tmp_path: Path) -> None:
    out = tmp_path / "out"
    written = write_output_certs(out, b"KEY", b"CHAIN", b"ROOT")
    assert written == ["key.pem", "cert-chain.pem", "root-cert.pem"]
    for name, content in (("key.pem", b"KEY"), ("cert-chain.pem", b"CHAIN"), ("root-cert.pem", b"ROOT")):
        assert (out / name).read_bytes() == content
        assert (out / name).stat().st_mode & 0o777 == 0o600


def test_unchanged_content_is_not_rewritten(tmp_path: Path) -> None:
    write_output_certs(tmp_path, b"KEY", b"CHAIN", b"ROOT")
    inodes = {name: (tmp_path / name).stat().st_ino for name in ("key.pem", "cert-chain.pem", "root-cert.pem")}
    assert write_output_certs(tmp_path, b"KEY", b"CHAIN", b"ROOT") == []
    assert {name: (tmp_path / name).stat().st_ino for name in inodes} == inodes


def test_only_changed_files_are_replaced_atomically(tmp_path: Path) -> None:
    write_output_certs(tmp_path, b"KEY", b"CHAIN", b"ROOT")
    root_inode = (tmp_path / "root-cert.pem").stat().st_ino
    key_inode = (tmp_path / "key.pem").stat().st_ino
    assert write_output_certs(tmp_path, b"KEY2", b"CHAIN2", b"ROOT") == ["key.pem", "cert-chain.pem"]
    assert (tmp_path / "root-cert.pem").stat().st_ino == root_inode
    # Replaced by rename: a reader holding the old file keeps a complete old key.
    assert (tmp_path / "key.pem").stat().st_ino != key_inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cert-chain.pem", "key.pem", "root-cert.pem"]


def test_empty_content_is_not_written(tmp_path: Path) -> None:
    assert write_output_certs(tmp_path, b"", b"", b"ROOT") == ["root-cert.pem"]
    assert not (tmp_path / "key.pem").exists()


def test_mode_is_repaired_even_when_content_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "key.pem"
    path.write_bytes(b"KEY")
    os.chmod(path, 0o644)
    assert write_if_changed(path, b"KEY") is False
    assert path.stat().st_mode & 0o777 == 0o600

"""The rules for reading a certificate file an SDS caller named: regular files only, 4 MiB, the caller's rights.

The files are real (tmp_path, a FIFO, /dev/zero, a sparse 100 MB file); the
caller is a `PeerCredentials` value, so no second user or socket is needed here
(tests/component/test_security_sds_callers.py has the real callers).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from needs import need
from support import open_workdir

from istio_agent.security.filereads import (
    MAX_SECRET_FILE_BYTES,
    FileReadError,
    FileRefused,
    file_digest,
    read_secret_file,
)
from istio_agent.security.peercred import PeerCredentials, access_refusal, groups_from_proc, permits

ENVOY = PeerCredentials(pid=0, uid=1337, gid=1337)
ROOT = PeerCredentials(pid=0, uid=0, gid=0)


def fake_stat(mode: int, uid: int = 0, gid: int = 0) -> os.stat_result:
    return os.stat_result((stat.S_IFREG | mode, 1, 1, 1, uid, gid, 0, 0, 0, 0))


def test_a_fifo_is_refused_without_being_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FileReadError, match="a FIFO, not a regular file"):
        read_secret_file(fifo)  # opening it for reading would block until a writer came
    assert file_digest(fifo) is None


def test_a_character_device_is_refused() -> None:
    with pytest.raises(FileReadError, match="/dev/zero: a character device, not a regular file"):
        read_secret_file(Path("/dev/zero"))


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileReadError, match="a directory"):
        read_secret_file(tmp_path)


def test_files_over_the_cap_are_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.pem"
    with big.open("wb") as handle:
        handle.truncate(100 * 1024 * 1024)  # sparse: costs no disk
    with pytest.raises(FileReadError, match="larger than the 4 MiB limit"):
        read_secret_file(big)
    edge = tmp_path / "edge.pem"
    edge.write_bytes(b"x" * MAX_SECRET_FILE_BYTES)
    assert len(read_secret_file(edge).data) == MAX_SECRET_FILE_BYTES
    edge.write_bytes(b"x" * (MAX_SECRET_FILE_BYTES + 1))
    with pytest.raises(FileReadError, match="larger than"):
        read_secret_file(edge)


def test_missing_files_say_so(tmp_path: Path) -> None:
    with pytest.raises(FileReadError, match=r"missing\.pem: No such file"):
        read_secret_file(tmp_path / "missing.pem")


def test_symlinks_are_followed_and_the_digest_is_of_the_content(tmp_path: Path) -> None:
    target = tmp_path / "a.pem"
    target.write_bytes(b"one")
    link = tmp_path / "link.pem"
    link.symlink_to(target)
    assert read_secret_file(link).data == b"one"
    before = file_digest(link)
    target.write_bytes(b"two")
    assert file_digest(link) not in (None, before)


def test_mode_bits_are_judged_as_the_kernel_does() -> None:
    assert permits(ENVOY, fake_stat(0o400, uid=1337), 0o4)
    assert not permits(ENVOY, fake_stat(0o044, uid=1337), 0o4), "the owner class wins even when it denies"
    assert permits(ENVOY, fake_stat(0o040, gid=1337), 0o4)
    assert not permits(ENVOY, fake_stat(0o404, gid=1337), 0o4), "the group class wins over others"
    assert permits(PeerCredentials(0, 1338, 1338, frozenset({1337})), fake_stat(0o040, gid=1337), 0o4)
    assert permits(ENVOY, fake_stat(0o004), 0o4)
    assert not permits(ENVOY, fake_stat(0o640), 0o4)
    assert permits(ENVOY, fake_stat(0o001), 0o1) and not permits(ENVOY, fake_stat(0o004), 0o1)
    assert permits(ROOT, fake_stat(0o000), 0o4)


def test_a_caller_gets_only_what_it_could_read() -> None:
    need(os.geteuid() == 0, "needs root to give files to other uids")
    with open_workdir("filereads") as workdir:  # under /tmp, searchable by every uid
        check_a_caller_gets_only_what_it_could_read(workdir)


def check_a_caller_gets_only_what_it_could_read(tmp_path: Path) -> None:
    secret = tmp_path / "key.pem"
    secret.write_bytes(b"key")
    os.chown(secret, 0, 0)
    os.chmod(secret, 0o600)
    with pytest.raises(FileRefused, match=r"uid 1337 gid 1337 may not read it \(mode 0600, owner 0:0\)"):
        read_secret_file(secret, ENVOY)
    assert read_secret_file(secret, ROOT).data == b"key"
    assert read_secret_file(secret).data == b"key", "the agent itself is not checked"
    os.chown(secret, 1337, 1337)
    assert read_secret_file(secret, ENVOY).data == b"key"

    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    inside = hidden / "root.pem"
    inside.write_bytes(b"root")
    os.chmod(inside, 0o644)
    assert access_refusal(ENVOY, str(inside), os.stat(inside)) == (
        f"caller pid 0 uid 1337 gid 1337 may not search directory {hidden} (mode 0700, owner 0:0)")


def test_groups_from_proc_only_when_the_pid_still_is_the_peer(tmp_path: Path) -> None:
    status = tmp_path / "42" / "status"
    status.parent.mkdir()
    status.write_text("Name:\tenvoy\nUid:\t1337\t1337\t1337\t1337\nGid:\t1337\t1337\t1337\t1337\nGroups:\t10 20\n")
    assert groups_from_proc(42, 1337, 1337, proc=tmp_path) == (10, 20)
    assert groups_from_proc(42, 1000, 1337, proc=tmp_path) == (), "pid reused by another user"
    assert groups_from_proc(0, 1337, 1337, proc=tmp_path) == (), "peer in another pid namespace"
    assert groups_from_proc(43, 1337, 1337, proc=tmp_path) == ()

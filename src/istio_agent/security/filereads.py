"""Reading a certificate or key file named by an SDS request or watched on disk, safely.

A resource name such as `file-root:/some/path` is chosen by whoever talks to the
SDS socket, so its file may be anything: a FIFO that blocks the reader forever,
`/dev/zero` that never ends, a 100 MB log, a device whose `open()` has side
effects, or a root-only key. The rules, shared by the SDS path and the file
watcher:
- only regular files are read: the path is resolved (symlinks followed) and
  stat()ed first, so a FIFO or device is refused without being opened; the
  open itself is O_NONBLOCK|O_NOCTTY|O_NOFOLLOW on the resolved path, and the
  descriptor must still be the inode that was checked;
- at most `MAX_SECRET_FILE_BYTES` (4 MiB, far above any certificate bundle:
  the OS bundle is ~200 KiB) are read; a larger file is refused;
- with a caller, the file is served only if that caller could read it itself
  (`peercred.access_refusal`).
These functions block; callers run them off the event loop (`offloop`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from istio_agent.security.core.secrets import SecretError
from istio_agent.security.peercred import PeerCredentials, access_refusal

MAX_SECRET_FILE_BYTES = 4 * 1024 * 1024
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC


class FileReadError(SecretError):
    """A file could not be read, or is not something a certificate can be read from; says which and why."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


class FileRefused(FileReadError):
    """The caller asked for a file it could not read itself."""


@dataclass(frozen=True)
class FileContent:
    """What was read from a path, and the digest the file watcher compares later reads with."""

    data: bytes

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _too_large(size: int | str) -> str:
    return f"larger than the {MAX_SECRET_FILE_BYTES // (1024 * 1024)} MiB limit for certificate files ({size} bytes)"


def read_secret_file(path: Path, caller: PeerCredentials | None = None,
                     limit: int = MAX_SECRET_FILE_BYTES) -> FileContent:
    """The content of the regular file `path` resolves to; FileReadError (FileRefused for the caller) otherwise."""
    try:
        real = os.path.realpath(path, strict=True)
        checked = os.stat(real)
    except OSError as exc:
        raise FileReadError(path, exc.strerror or str(exc)) from None
    if not stat.S_ISREG(checked.st_mode):
        raise FileReadError(path, f"{_kind(checked.st_mode)}, not a regular file: refused")
    if caller is not None:
        refusal = access_refusal(caller, real, checked)
        if refusal is not None:
            raise FileRefused(path, refusal)
    if checked.st_size > limit:
        raise FileReadError(path, _too_large(checked.st_size))
    try:
        fd = os.open(real, _OPEN_FLAGS)
    except OSError as exc:
        raise FileReadError(path, exc.strerror or str(exc)) from None
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (checked.st_dev, checked.st_ino) or not stat.S_ISREG(opened.st_mode):
            raise FileReadError(path, "replaced while being opened: refused")
        if caller is not None:
            refusal = access_refusal(caller, real, opened)
            if refusal is not None:
                raise FileRefused(path, refusal)
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise FileReadError(path, _too_large(f"more than {limit}"))
        return FileContent(b"".join(chunks))
    except OSError as exc:
        raise FileReadError(path, exc.strerror or str(exc)) from None
    finally:
        os.close(fd)


def file_digest(path: Path) -> str | None:
    """SHA-256 of what `path` resolves to now, under the same rules; None when missing, unreadable or refused."""
    try:
        return read_secret_file(path).digest
    except SecretError:
        return None

"""Reading the node's CNI net dir with limits: what another writer put there is read, never trusted.

- A file is read only if it is a regular file (opened non-blocking, so a FIFO named `x.conflist` cannot
  hang install-cni) and at most `MAX_CONFIG_BYTES` long: a larger one is reported (`TooLarge`, and as
  `oversized` in the listing) rather than read whole. Real network configs are a few kilobytes; the limit
  keeps one install round's reading, parsing and writing (on install-cni's event loop, which also answers
  /healthz) around a tenth of a second even for a file at the limit.
- `unchanged_since` is the check install-cni makes just before it renames its merged file over another
  writer's: the file still holds exactly the bytes the merge was made from, so a newer file written
  meanwhile (in place or by rename) is never overwritten with the older content plus our entry
  (`Changed`; the installer reads again and merges again).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from istio_agent.cni.install import cniconfig

MAX_CONFIG_BYTES = 256 * 1024


class TooLarge(ValueError):
    """A file over `MAX_CONFIG_BYTES` (not read)."""

    def __init__(self, size: int, limit: int = MAX_CONFIG_BYTES) -> None:
        super().__init__(f"{size} bytes, over install-cni's limit of {limit} bytes for a CNI config file")
        self.size = size


class NotRegular(ValueError):
    """Not a regular file (a FIFO, a device, a directory): never read."""


class Changed(Exception):
    """A file changed between install-cni's read and its write over it; the message names it."""


def read_bounded(path: str | Path, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """A regular file's bytes, at most `limit` of them (TooLarge beyond; NotRegular; OSError)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegular(f"{path} is not a regular file")
        if info.st_size > limit:
            raise TooLarge(info.st_size, limit)
        data = handle.read(limit + 1)  # it may have grown since fstat
    if len(data) > limit:
        raise TooLarge(len(data), limit)
    return data


def read_listing(net_dir: str, extra_names: tuple[str, ...] = (), limit: int = MAX_CONFIG_BYTES) -> cniconfig.Listing:
    """The net dir's `.conf`/`.conflist` files (and `extra_names`) with their text, as `cniconfig` takes it."""
    files: dict[str, str | None] = {}
    problems: dict[str, str] = {}
    oversized: set[str] = set()
    try:
        entries = list(os.scandir(net_dir))
    except FileNotFoundError:
        return cniconfig.Listing({})
    wanted = set(extra_names)
    for entry in entries:
        if not (entry.name.endswith(cniconfig.CNI_EXTENSIONS) or entry.name in wanted):
            continue
        try:
            if not entry.is_file():  # follows symlinks, as libcni's reading does
                continue
            files[entry.name] = read_bounded(entry.path, limit).decode("utf-8", "surrogateescape")
        except FileNotFoundError:
            continue
        except NotRegular:
            continue  # replaced by something else since the scan: as if it were not there
        except TooLarge as exc:
            files[entry.name] = None
            problems[entry.name] = str(exc)
            oversized.add(entry.name)
        except OSError as exc:
            files[entry.name] = None
            problems[entry.name] = f"unreadable: {exc.strerror or exc}"
    return cniconfig.Listing(files, problems, frozenset(oversized))


def unchanged_since(path: Path, expected: bytes) -> None:
    """Raise `Changed` unless `path` still holds exactly `expected` (gone, grown past the limit: changed)."""
    try:
        current: bytes | None = read_bounded(path)
    except (OSError, ValueError):
        current = None
    if current != expected:
        raise Changed(f"{path} changed while install-cni was merging into it")

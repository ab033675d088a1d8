"""Knowing at once when the node's CNI setup changed: inotify on the net dir, the bin dir and the token dir.

Linux inotify through ctypes (three libc calls, read on the event loop with
`add_reader`): the small inotify libraries on PyPI (inotify_simple, asyncinotify)
are ctypes wrappers of the same calls, so a dependency would add a package and
nothing else; `ctypes` costs ~0.5 MB RSS and ~3 ms to import (docs/CNI.md, Footprint). A
directory is watched rather than files, because every writer we care about
replaces files by rename (another CNI's conflist, Kubernetes' `..data` swap of a
projected token) and a watch on a file would follow the old inode. A directory
that does not exist yet, or was removed, is watched again at the next check;
the periodic re-check is the safety net for anything inotify cannot say
(a queue overflow, a bind mount swapped under us).

`relevant` (which events matter) and `ReinstallThrottle` are pure.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger("istio_agent.cni.install")

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# A file written in place shows as CLOSE_WRITE (not every MODIFY: we would read it half-written).
WATCH_MASK = (IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
              | IN_MOVE_SELF | IN_ONLYDIR)
_SELF_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
_EVENT = struct.Struct("iIII")


def relevant(names: frozenset[str] | None, mask: int, name: str) -> bool:
    """Whether an event in a watched directory may change what install-cni must do.

    `names` limits a directory to some entries (the bin dir: only our executable); None means all.
    The directory itself going away, and a lost queue, always matter.
    """
    if mask & (_SELF_GONE | IN_Q_OVERFLOW):
        return True
    if names is not None and name not in names:
        return False
    return bool(mask & WATCH_MASK)


def parse_events(data: bytes) -> list[tuple[int, int, str]]:
    """(watch descriptor, mask, name) for each `struct inotify_event` in a read."""
    events = []
    offset = 0
    while offset + _EVENT.size <= len(data):
        wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
        raw = data[offset + _EVENT.size: offset + _EVENT.size + length]
        events.append((wd, mask, raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")))
        offset += _EVENT.size + length
    return events


class _Libc:
    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.init1 = libc.inotify_init1
        self.init1.argtypes = [ctypes.c_int]
        self.add_watch = libc.inotify_add_watch
        self.add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.rm_watch = libc.inotify_rm_watch
        self.rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]


class DirectoryWatcher:
    """Watches directories (each optionally limited to some names) and wakes `wait()` on a relevant event."""

    def __init__(self, directories: Mapping[str, frozenset[str] | None]) -> None:
        self._libc = _Libc()
        fd = self._libc.init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self._fd: int | None = fd
        self._wanted = dict(directories)
        self._watches: dict[int, str] = {}
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.events_seen = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        assert self._fd is not None
        self._loop.add_reader(self._fd, self._on_readable)
        self.ensure_watches()

    def ensure_watches(self) -> list[str]:
        """Watch every wanted directory not watched yet; the ones that could not be watched (absent)."""
        missing = []
        watched = set(self._watches.values())
        for directory in self._wanted:
            if directory in watched or self._fd is None:
                continue
            wd = self._libc.add_watch(self._fd, os.fsencode(directory), WATCH_MASK)
            if wd < 0:
                err = ctypes.get_errno()
                if err not in (errno.ENOENT, errno.ENOTDIR):
                    log.warning("cannot watch %s: %s", directory, os.strerror(err))
                missing.append(directory)
                continue
            self._watches[wd] = directory
        return missing

    def _on_readable(self) -> None:
        if self._fd is None:
            return
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        for wd, mask, name in parse_events(data):
            directory = self._watches.get(wd)
            if mask & IN_IGNORED:
                self._watches.pop(wd, None)
            if mask & IN_Q_OVERFLOW:
                log.warning("inotify queue overflowed: re-checking everything")
            if directory is None and not mask & IN_Q_OVERFLOW:
                continue
            if relevant(self._wanted.get(directory or "", None), mask, name):
                self.events_seen += 1
                log.debug("change in %s: %s (mask %#x)", directory, name, mask)
                self._changed.set()

    async def wait(self, timeout: float) -> bool:
        """Until a relevant change (True) or `timeout` seconds (False); the change flag is then cleared.

        `asyncio.timeout`, not `wait_for`: Python 3.11's `wait_for` swallows a cancellation that arrives as the
        change does, and install-cni's stop (SIGTERM while another writer changes files) then waited for ever.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()
        changed = self._changed.is_set()
        self._changed.clear()
        return changed

    def close(self) -> None:
        if self._fd is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = None


@dataclass
class ReinstallThrottle:
    """Spacing of reinstalls, and the warning upstream gives when something keeps reverting our work.

    Upstream sleeps up to 1 s before a watch when the last one was under 5 s ago; that would put
    a conflicting write's repair past a second. Here reinstalls are at least `min_interval` apart
    (a write war costs at most 1/min_interval writes a second), and more than `burst` within
    `window` seconds is warned about, at most once a `window`.
    """

    min_interval: float = 0.1
    burst: int = 5
    window: float = 5.0
    _times: list[float] = field(default_factory=list)
    _warned_at: float = float("-inf")

    def delay(self, now: float) -> float:
        """Seconds to wait before the next reinstall."""
        if not self._times:
            return 0.0
        return max(0.0, self._times[-1] + self.min_interval - now)

    def record(self, now: float) -> bool:
        """Note a reinstall at `now`; True when it is time to warn of a loop."""
        self._times = [t for t in self._times if t > now - self.window] + [now]
        if len(self._times) > self.burst and now - self._warned_at >= self.window:
            self._warned_at = now
            return True
        return False

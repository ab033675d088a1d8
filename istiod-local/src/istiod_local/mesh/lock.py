"""One `istiod-local up` per run directory: a lock file holding the owner's pid.

The lock is an `flock` on `<dir>/up.lock`, which the kernel drops when its
owner dies however it dies, so a killed run's lock is simply taken over by
the next one (whose node then sweeps what the killed run left); the pid
written in the file names the live owner in the refusal.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "up.lock"


class LockedError(RuntimeError):
    """Another live `up` holds the run directory."""


def refusal(path: Path, pid: str) -> str:
    who = f"pid {pid}" if pid else "another process"
    return (f"istiod-local up is already running for this directory ({who}, lock {path}); "
            f"stop it (Ctrl-C, or kill {pid or '<pid>'}) or use another --dir")


class RunLock:
    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise LockedError naming its holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise LockedError(refusal(self.path, holder)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None

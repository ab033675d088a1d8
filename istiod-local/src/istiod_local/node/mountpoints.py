"""Host directories that proxyless containers mount on, shared by every local node on the machine.

A bind mount needs an existing mount point, so `/etc/istio/proxy`,
`/var/lib/istio/data`, `/var/run/secrets/...` must exist on the host even
though nothing is ever mounted there in the host's own namespace. Those that
are missing are created (empty) and removed again once no node needs them.

Removal must not race with another process's node: since Linux 3.18 removing
a directory that is a mount point in some other mount namespace silently
detaches that mount, which would pull the volumes from under a live pod.
So users register under a lock: `acquire()` creates what is missing, records
what it created (so that directories that existed before are never
removed) and adds a marker for its owner (`<pid>-<token>`); `release()`
drops the marker and, when no marker of a live process is left, removes
the recorded directories that are still empty, deepest first, and the
bookkeeping itself. A run that died without `release()` leaves a marker of
a dead pid, which the next `release()` ignores and deletes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from istiod_local.node.processes import pid_alive

STATE_DIR = Path("/run/istio-agent-node-mountpoints")
# The lock must outlive the state directory, which goes away with the last user: lock /run itself
# (advisory; only cooperating local nodes take it).
LOCK_PATH = Path("/run")
CREATED_FILE = "created.json"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def missing_ancestors(path: Path) -> list[Path]:
    """`path` and its parents that do not exist, outermost first (what `mkdir -p` would create)."""
    missing = []
    current = path
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    return list(reversed(missing))


class MountPoints:
    """The shared mount points for one user (a `LocalNode`); `acquire()`/`release()` around its pods."""

    def __init__(self, targets: Iterable[str], owner: str, state_dir: Path = STATE_DIR,
                 lock_path: Path = LOCK_PATH, is_alive: Callable[[int], bool] | None = None) -> None:
        self.targets = [Path(t) for t in targets]
        self.owner = owner
        self.state_dir = state_dir
        self.lock_path = lock_path
        self._is_alive = is_alive or pid_alive
        self._held = False

    def acquire(self) -> None:
        """Create the missing mount points and register this owner. Idempotent."""
        if self._held:
            return
        with _locked(self.lock_path):
            self.state_dir.mkdir(mode=0o700, exist_ok=True)
            (self.state_dir / "users").mkdir(mode=0o700, exist_ok=True)
            (self.state_dir / "users" / self.owner).touch()
            self._held = True
            created = self._created()
            for target in self.targets:
                for folder in missing_ancestors(target):
                    folder.mkdir(mode=0o755)
                    created.append(str(folder))
                    self._save(created)

    def release(self) -> list[str]:
        """Unregister; the last live user removes what was created and is still empty. Returns what went."""
        if not self._held:
            return []
        self._held = False
        with _locked(self.lock_path):
            users = self.state_dir / "users"
            (users / self.owner).unlink(missing_ok=True)
            live = []
            for marker in users.iterdir() if users.is_dir() else []:
                pid = marker.name.split("-", 1)[0]
                if pid.isdigit() and self._is_alive(int(pid)):
                    live.append(marker)
                else:
                    marker.unlink(missing_ok=True)
            if live:
                return []
            removed = []
            for folder in sorted(self._created(), key=lambda p: p.count("/"), reverse=True):
                with contextlib.suppress(OSError):  # not empty (someone put a file there): leave it
                    os.rmdir(folder)
                    removed.append(folder)
            (self.state_dir / CREATED_FILE).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                users.rmdir()
                self.state_dir.rmdir()
            return removed

    def _created(self) -> list[str]:
        try:
            data = json.loads((self.state_dir / CREATED_FILE).read_text())
        except (OSError, ValueError):
            return []
        return [str(p) for p in data] if isinstance(data, list) else []

    def _save(self, created: list[str]) -> None:
        temp = self.state_dir / f".{CREATED_FILE}.tmp"
        temp.write_text(json.dumps(created))
        temp.replace(self.state_dir / CREATED_FILE)


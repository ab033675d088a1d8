"""`istio-cni.log`: the plugin's own small rolling log on the node, beside the node agent's socket.

Upstream's plugin tees each ADD's log (from the moment its network configuration is read, at info and above)
to `<cni_agent_run_dir>/istio-cni.log`, so the lines survive when install-cni is down and its log socket with
it: the very case (a pod started before the node agent was ready) that repair exists for. As upstream's
rolling writer keeps it: JSON lines (the same entries the socket gets), a new file once the next write would
pass 10 MB, the old one renamed `istio-cni-<UTC time>.log` (`2006-01-02T15-04-05.000`), one such backup kept,
and none older than 2 days; files are created 0600.

Several plugin processes, and install-cni's fast path, may write at once: each invocation's lines go in one
`O_APPEND` write, and a rotation is a rename, so a writer that lost the race appends to the backup, which is
the log's content either way. Nothing here ever fails an ADD: errors are swallowed.
"""

from __future__ import annotations

import os
import time

LOG_NAME = "istio-cni.log"
MAX_BYTES = 10 * 1024 * 1024  # upstream's RollingLogMaxSizeMB
MAX_BACKUPS = 1
MAX_AGE = 2 * 24 * 3600.0  # seconds
_STAMP = "%Y-%m-%dT%H-%M-%S"


def backup_name(path: str, now: float) -> str:
    """The name the current file is renamed to when it rolls over (UTC time, milliseconds)."""
    base, ext = os.path.splitext(path)
    millis = int(now * 1000) % 1000
    return f"{base}-{time.strftime(_STAMP, time.gmtime(now))}.{millis:03d}{ext}"


def backup_time(name: str, prefix: str, ext: str) -> float | None:
    """When a backup named `name` (a file name) was made, from its name; None for any other file."""
    if not (name.startswith(prefix) and name.endswith(ext)):
        return None
    stamp = name[len(prefix):len(name) - len(ext)]
    seconds, dot, millis = stamp.rpartition(".")
    if not dot or len(millis) != 3 or not millis.isdigit():
        return None
    try:
        parsed = time.strptime(seconds, _STAMP)
    except ValueError:
        return None
    import calendar

    return calendar.timegm(parsed) + int(millis) / 1000


def stale_backups(names: list[str], prefix: str, ext: str, now: float, keep: int = MAX_BACKUPS,
                  max_age: float = MAX_AGE) -> list[str]:
    """Backups to delete: all but the `keep` newest, and any older than `max_age` (pure)."""
    dated = sorted(((t, n) for n in names if (t := backup_time(n, prefix, ext)) is not None), reverse=True)
    return [name for index, (made, name) in enumerate(dated) if index >= keep or now - made > max_age]


def append(path: str, lines: list[str], now: float | None = None) -> bool:
    """Append `lines` to the rolling log at `path`, rolling it over first when they would not fit; False on
    any error (nothing raised)."""
    if not lines:
        return True
    data = "".join(line + "\n" for line in lines).encode("utf-8", "replace")
    now = time.time() if now is None else now
    try:
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            size = 0
        if size and size + len(data) > MAX_BYTES:
            os.replace(path, backup_name(path, now))
            _remove_stale(path, now)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return False
    return True


def _remove_stale(path: str, now: float) -> None:
    directory, name = os.path.split(path)
    base, ext = os.path.splitext(name)
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return
    for stale in stale_backups(names, base + "-", ext, now):
        try:
            os.unlink(os.path.join(directory, stale))
        except OSError:
            pass

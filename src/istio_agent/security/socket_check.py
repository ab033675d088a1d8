"""Is another SDS server already listening on a well-known socket? (upstream's checkSocket)

Asked once at start, before node metadata is written: a healthy server on the
workload socket (SPIRE, say) means the agent serves only file certificates, on
its own files socket; a healthy credential socket adds the `credential`
metadata key. A socket file nobody answers on is stale: it is removed, as
upstream removes it, so that the agent's own server can bind later.

Plain `connect()`: a listener that accepts is responsive. No gRPC here, so the
check costs nothing when the file is absent (the common case).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

from istio_agent.config.errors import ConfigError

# sun_path holds 108 bytes with the terminating NUL.
MAX_UDS_PATH = 107


def _connect_target(path: Path, opened: contextlib.ExitStack) -> str:
    """`path`, or `/proc/self/fd/N/name` for a path longer than a socket address allows."""
    if len(os.fsencode(str(path))) <= MAX_UDS_PATH:
        return str(path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    opened.callback(os.close, fd)
    return f"/proc/self/fd/{fd}/{path.name}"


def socket_accepts(path: Path, timeout: float = 1.0) -> bool:
    """True when something accepts a connection on the UDS `path`."""
    with contextlib.ExitStack() as opened:
        probe = opened.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        probe.settimeout(timeout)
        try:
            probe.connect(_connect_target(path, opened))
        except OSError:
            return False
        return True


def check_socket(path: Path, timeout: float = 1.0) -> bool:
    """True when a server answers on `path`; a stale socket is removed (False); absent is False.

    ConfigError when a stale socket cannot be removed: the agent could not bind its own there.
    """
    try:
        info = path.lstat()
    except OSError:
        return False
    if stat.S_ISDIR(info.st_mode):
        return False
    if stat.S_ISSOCK(info.st_mode) and socket_accepts(path, timeout):
        return True
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigError(f"existing SDS socket {path} could not be removed: {exc.strerror}") from None
    return False

"""Who is on the other end of a Unix socket, and which files that caller could read itself.

The SDS socket is mode 0666 (any local process may ask for `default`, as
upstream), but `file-cert:` and `file-root:` names point at arbitrary paths, and
the agent often runs with more rights than its callers (root, in the local node).
So a file is served only to a caller that could have opened it: its uid, gid and
supplementary groups, taken from the kernel when it connected (SO_PEERCRED,
SO_PEERGROUPS), are checked against the file's owner and mode and against search
permission on every directory of its real path. The model is SPIRE's agent, which
attests each caller of its socket before answering.

The rules are Unix's classic ones (owner class, then group class, then others;
uid 0 may read anything). POSIX ACLs and capabilities such as CAP_DAC_READ_SEARCH
of a non-root caller are not consulted: such a caller is judged by mode bits alone.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

# Linux's SO_PEERGROUPS (4.13+); Python's socket module does not name it.
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
_UCRED = struct.Struct("3i")
_MAX_GROUPS = 65536  # NGROUPS_MAX

READ = 0o4
SEARCH = 0o1


@dataclass(frozen=True)
class PeerCredentials:
    """A socket peer's identity at connect time: pid (0 when in another pid namespace), uid, gid, groups."""

    pid: int
    uid: int
    gid: int
    groups: frozenset[int] = frozenset()

    def describe(self) -> str:
        return f"caller pid {self.pid} uid {self.uid} gid {self.gid}"


def read_peer_credentials(sock: socket.socket) -> PeerCredentials:
    """The connected peer's credentials; OSError when the socket has no peer any more."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    groups = _peer_groups(sock)
    if groups is None:
        groups = groups_from_proc(pid, uid, gid)
    return PeerCredentials(pid, uid, gid, frozenset(groups))


def _peer_groups(sock: socket.socket) -> tuple[int, ...] | None:
    """The supplementary groups the kernel recorded at connect time; None when it cannot say."""
    size = 64 * 4
    while size <= _MAX_GROUPS * 4:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, size)
        except OSError as exc:
            if exc.errno == errno.ERANGE:  # more groups than the buffer holds
                size *= 4
                continue
            return None
        return struct.unpack(f"{len(raw) // 4}I", raw)
    return None


def groups_from_proc(pid: int, uid: int, gid: int, proc: Path = Path("/proc")) -> tuple[int, ...]:
    """Supplementary groups from /proc/<pid>/status, if that pid still has the peer's uid and gid.

    A pid can be reused once its process exits; when the process found there is not
    the peer (other effective ids), no supplementary group is granted.
    """
    if pid <= 0:
        return ()
    try:
        text = (proc / str(pid) / "status").read_text()
    except OSError:
        return ()
    fields: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.split()
    try:
        effective_uid, effective_gid = int(fields["Uid"][1]), int(fields["Gid"][1])
        groups = tuple(int(g) for g in fields.get("Groups", []))
    except (KeyError, IndexError, ValueError):
        return ()
    if (effective_uid, effective_gid) != (uid, gid):
        return ()
    return groups


def permits(caller: PeerCredentials, st: os.stat_result, want: int) -> bool:
    """Whether the mode bits in `st` grant `caller` the access `want` (READ or SEARCH), as the kernel decides."""
    if caller.uid == 0:
        return True
    mode = st.st_mode
    if st.st_uid == caller.uid:
        return bool(mode & (want << 6))
    if st.st_gid == caller.gid or st.st_gid in caller.groups:
        return bool(mode & (want << 3))
    return bool(mode & want)


def describe_mode(st: os.stat_result) -> str:
    return f"mode {stat.S_IMODE(st.st_mode):04o}, owner {st.st_uid}:{st.st_gid}"


def access_refusal(caller: PeerCredentials, real_path: str, st: os.stat_result) -> str | None:
    """Why `caller` could not read the file at `real_path` (no symlinks in it) with status `st`; None if it could.

    Every directory from `/` down must be searchable by the caller and the file readable.
    """
    if caller.uid == 0:
        return None
    parts = Path(real_path).parents
    for directory in reversed(parts):
        try:
            dir_st = os.stat(directory)
        except OSError as exc:
            return f"directory {directory} cannot be checked: {exc.strerror}"
        if not permits(caller, dir_st, SEARCH):
            return f"{caller.describe()} may not search directory {directory} ({describe_mode(dir_st)})"
    if not permits(caller, st, READ):
        return f"{caller.describe()} may not read it ({describe_mode(st)})"
    return None

"""Run a command with optional stdin, capturing stdout and stderr.

A small stand-in for `subprocess.run` built on `os.posix_spawn` and `poll`:
importing `subprocess` costs more than running `iptables-restore` itself,
and `istio-iptables` start-up time is what the capture benchmark measures.
"""

from __future__ import annotations

import os
import select

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

SEARCH_PATH_FALLBACK = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
_SIGPIPE = 13  # Python ignores it; children get the default back (the `signal` module is not imported)


class Completed:
    """Exit status and output of one finished command."""

    __slots__ = ("argv", "returncode", "stderr", "stdout")

    def __init__(self, argv: Sequence[str], returncode: int, stdout: bytes, stderr: bytes) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        err = self.stderr.decode(errors="replace").strip()
        return f"`{' '.join(self.argv)}` exited with {self.returncode}" + (f": {err}" if err else "")


class CommandError(RuntimeError):
    def __init__(self, result: Completed) -> None:
        super().__init__(result.describe())
        self.result = result


def which(name: str) -> str | None:
    """Absolute path of an executable on $PATH (plus the sbin directories), or None."""
    if "/" in name:
        return name if os.access(name, os.X_OK) else None
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    for directory in [*dirs, *SEARCH_PATH_FALLBACK]:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def run(argv: Sequence[str], stdin: bytes | None = None, check: bool = False) -> Completed:
    """Run `argv` to completion; raise FileNotFoundError when the program is missing."""
    path = which(argv[0])
    if path is None:
        raise FileNotFoundError(f"{argv[0]}: command not found")
    in_r, in_w = os.pipe() if stdin is not None else (os.open(os.devnull, os.O_RDONLY), -1)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    actions = [
        (os.POSIX_SPAWN_DUP2, in_r, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, err_w, 2),
    ]
    try:
        pid = os.posix_spawn(path, list(argv), os.environ, file_actions=actions, setsigdef=(_SIGPIPE,))
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    pending = memoryview(stdin or b"")
    poller = select.poll()
    for fd in chunks:
        poller.register(fd, select.POLLIN)
    if in_w >= 0:
        os.set_blocking(in_w, False)
        poller.register(in_w, select.POLLOUT)
    open_fds = set(chunks) | ({in_w} if in_w >= 0 else set())
    try:
        while open_fds:
            for fd, event in poller.poll():
                if fd == in_w:
                    try:
                        pending = pending[os.write(in_w, pending[:65536]) :] if pending else pending
                    except BrokenPipeError:
                        pending = memoryview(b"")
                    if not pending or event & (select.POLLERR | select.POLLHUP):
                        poller.unregister(in_w)
                        os.close(in_w)
                        open_fds.discard(in_w)
                    continue
                data = os.read(fd, 65536)
                if data:
                    chunks[fd].append(data)
                else:
                    poller.unregister(fd)
                    open_fds.discard(fd)
    finally:
        if in_w in open_fds:
            os.close(in_w)
        os.close(out_r)
        os.close(err_r)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    result = Completed(argv, code, b"".join(chunks[out_r]), b"".join(chunks[err_r]))
    if check and not result.ok:
        raise CommandError(result)
    return result

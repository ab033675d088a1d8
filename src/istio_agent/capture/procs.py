"""Run a command with optional stdin, capturing stdout and stderr.

A small stand-in for `subprocess.run` built on `posix_spawn` and `poll`:
importing `subprocess` costs more than running `iptables-restore` itself,
and `istio-iptables` start-up time is what the capture benchmark measures.
For the same reason it uses `posix` rather than `os`: under `python -S` (the
lean launcher, `cli/iptables_launcher.py`) nothing else loads `os`, whose
import (`_collections_abc`, `os.environ`'s mapping) costs ~1 ms, a quarter of
the tool's own work. `environment()` is the process environment either way.
"""

from __future__ import annotations

import posix
import select
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

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


def environment() -> Mapping[str, str]:
    """The process environment, as `os.environ` has it.

    `os.environ` itself once `os` is loaded (it may have been changed since start); before that nothing
    can have changed it, and the interpreter's start-up copy (`posix.environ`, bytes) is decoded as `os` does.
    """
    os_module = sys.modules.get("os")
    if os_module is not None:
        return os_module.environ  # type: ignore[no-any-return]
    if not _START_ENVIRONMENT:
        encoding = sys.getfilesystemencoding()
        _START_ENVIRONMENT.update((key.decode(encoding, "surrogateescape"), value.decode(encoding, "surrogateescape"))
                                  for key, value in posix.environ.items())
    return _START_ENVIRONMENT


_START_ENVIRONMENT: dict[str, str] = {}  # posix.environ decoded, filled on first use without `os`


def _is_executable_file(path: str) -> bool:
    try:
        mode = posix.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return mode & _S_IFMT == _S_IFREG and posix.access(path, posix.X_OK)


_S_IFMT, _S_IFREG = 0o170000, 0o100000


def which(name: str, path: str | None = None) -> str | None:
    """Absolute path of an executable on $PATH (or `path`), then the sbin directories; None when absent."""
    if "/" in name:
        return name if posix.access(name, posix.X_OK) else None
    search = environment().get("PATH", "") if path is None else path
    for directory in [*(d for d in search.split(":") if d), *SEARCH_PATH_FALLBACK]:
        candidate = f"{directory.rstrip('/')}/{name}"
        if _is_executable_file(candidate):
            return candidate
    return None


def run(argv: Sequence[str], stdin: bytes | None = None, check: bool = False) -> Completed:
    """Run `argv` to completion; raise FileNotFoundError when the program is missing."""
    env = environment()
    path = which(argv[0], env.get("PATH", ""))
    if path is None:
        raise FileNotFoundError(f"{argv[0]}: command not found")
    in_r, in_w = posix.pipe() if stdin is not None else (posix.open("/dev/null", posix.O_RDONLY | posix.O_CLOEXEC), -1)
    out_r, out_w = posix.pipe()
    err_r, err_w = posix.pipe()
    actions = [
        (posix.POSIX_SPAWN_DUP2, in_r, 0),
        (posix.POSIX_SPAWN_DUP2, out_w, 1),
        (posix.POSIX_SPAWN_DUP2, err_w, 2),
    ]
    try:
        pid = posix.posix_spawn(path, list(argv), env, file_actions=actions, setsigdef=(_SIGPIPE,))
    finally:
        for fd in (in_r, out_w, err_w):
            posix.close(fd)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    pending = memoryview(stdin or b"")
    poller = select.poll()
    for fd in chunks:
        poller.register(fd, select.POLLIN)
    if in_w >= 0:
        posix.set_blocking(in_w, False)
        poller.register(in_w, select.POLLOUT)
    open_fds = set(chunks) | ({in_w} if in_w >= 0 else set())
    try:
        while open_fds:
            for fd, event in poller.poll():
                if fd == in_w:
                    try:
                        pending = pending[posix.write(in_w, pending[:65536]) :] if pending else pending
                    except BrokenPipeError:
                        pending = memoryview(b"")
                    if not pending or event & (select.POLLERR | select.POLLHUP):
                        poller.unregister(in_w)
                        posix.close(in_w)
                        open_fds.discard(in_w)
                    continue
                data = posix.read(fd, 65536)
                if data:
                    chunks[fd].append(data)
                else:
                    poller.unregister(fd)
                    open_fds.discard(fd)
    finally:
        if in_w in open_fds:
            posix.close(in_w)
        posix.close(out_r)
        posix.close(err_r)
    _, status = posix.waitpid(pid, 0)
    code = posix.waitstatus_to_exitcode(status)
    result = Completed(argv, code, b"".join(chunks[out_r]), b"".join(chunks[err_r]))
    if check and not result.ok:
        raise CommandError(result)
    return result

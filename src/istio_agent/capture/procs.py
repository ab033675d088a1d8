"""Run a command with optional stdin, capturing stdout and stderr.

A small stand-in for `subprocess.run`: importing `subprocess` costs more than
running `iptables-restore` itself, and `istio-iptables` start-up time is what
the capture benchmark measures. The child is started with `posix_spawn`, its
standard streams are files in memory (so neither side ever waits for the
other, and no poll loop or `select` is needed), and it uses `posix` rather
than `os`: under `python -S` (the lean launcher, `cli/iptables_launcher.py`)
nothing else loads `os`, whose import (`_collections_abc`, `os.environ`'s
mapping) costs ~1 ms, a quarter of the tool's own work. `environment()` is the
process environment either way.
"""

from __future__ import annotations

import posix
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
    """An executable regular file (`access` first: a miss, the common case, costs one call and no exception)."""
    try:
        return posix.access(path, posix.X_OK) and posix.stat(path).st_mode & _S_IFMT == _S_IFREG
    except (OSError, ValueError):
        return False


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


def _memory_file(name: str, data: bytes = b"") -> int:
    """A file in memory (memfd, close-on-exec) holding `data`, its offset back at the start."""
    fd = posix.memfd_create(name, posix.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[posix.write(fd, view) :]
        posix.lseek(fd, 0, 0)
    except BaseException:
        posix.close(fd)
        raise
    return fd


def _contents(fd: int) -> bytes:
    """A memory file's bytes, read by its size: a read into a 1 MiB buffer costs an mmap and munmap (and page
    faults) for the usual few bytes; the size first makes it one `fstat` and one `pread` of what is there."""
    size = posix.fstat(fd).st_size
    chunks = []
    offset = 0
    while offset < size and (chunk := posix.pread(fd, size - offset, offset)):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def run(
    argv: Sequence[str], stdin: bytes | None = None, check: bool = False, executable: str | None = None
) -> Completed:
    """Run `argv` to completion; raise FileNotFoundError when the program is missing.

    The child's stdin, stdout and stderr are files in memory (memfd): it never waits for this side to
    read, nor this side for it, so there is no poll loop, and the output is read once it has exited.
    `executable`: where `which(argv[0])` found the program earlier (one $PATH walk fewer); when it is
    no longer there, $PATH is searched again, as without it.
    """
    env = environment()
    if executable is not None:
        try:
            return _spawn(argv, executable, env, stdin, check)
        except FileNotFoundError:
            pass
    path = which(argv[0], env.get("PATH", ""))
    if path is None:
        raise FileNotFoundError(f"{argv[0]}: command not found")
    return _spawn(argv, path, env, stdin, check)


def _spawn(argv: Sequence[str], path: str, env: Mapping[str, str], stdin: bytes | None, check: bool) -> Completed:
    """Start the program at `path` with `argv` (argv[0] as given), wait for it, and collect its output."""
    fds: list[int] = []
    try:
        fds.append(_memory_file("stdin", stdin) if stdin is not None else posix.open("/dev/null", posix.O_RDONLY))
        fds.append(_memory_file("stdout"))
        fds.append(_memory_file("stderr"))
        actions = [(posix.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)]
        pid = posix.posix_spawn(path, list(argv), env, file_actions=actions, setsigdef=(_SIGPIPE,))
        _, status = posix.waitpid(pid, 0)
        result = Completed(argv, posix.waitstatus_to_exitcode(status), _contents(fds[1]), _contents(fds[2]))
    finally:
        for fd in fds:
            posix.close(fd)
    if check and not result.ok:
        raise CommandError(result)
    return result

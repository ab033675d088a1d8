"""The plugin executable in the CNI bin dir: found, written atomically (temp file + rename, 0755), removed.

The source is the `istio-cni` console script of this installation: the one
beside the running interpreter (a venv's bin dir), else the one on PATH. What
install-cni writes into the bin dir is the launcher generated from it
(`launcher.py`: its interpreter, the fast-path socket, the import paths), which
the node's container runtime execs on a host where the project is installed.
A write is skipped when the target already holds the same bytes with mode
0755, so a re-check writes nothing and wakes no watcher.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import stat
import sys
from collections.abc import Callable
from pathlib import Path

PLUGIN_NAME = "istio-cni"
PLUGIN_MODE = 0o755


class BinaryError(OSError):
    """The plugin executable could not be found or installed (the message names the path)."""


def find_plugin_source() -> Path:
    """The `istio-cni` console script of this installation."""
    beside = Path(sys.executable).parent / PLUGIN_NAME
    if beside.is_file():
        return beside
    found = shutil.which(PLUGIN_NAME)
    if found:
        return Path(found)
    raise BinaryError(f"the {PLUGIN_NAME} executable is neither beside {sys.executable} nor on PATH")


def _content(source: Path | bytes) -> bytes:
    return source if isinstance(source, bytes) else source.read_bytes()


def plugin_installed(source: Path | bytes, bin_dir: str) -> bool:
    """Whether `bin_dir` holds the plugin with `source`'s bytes (a file's, or these) and mode 0755."""
    target = Path(bin_dir) / PLUGIN_NAME
    try:
        info = target.stat()
        if not stat.S_ISREG(info.st_mode) or stat.S_IMODE(info.st_mode) != PLUGIN_MODE:
            return False
        data = _content(source)
        if info.st_size != len(data):
            return False
        return target.read_bytes() == data
    except OSError:
        return False


def atomic_write(path: Path, data: bytes, mode: int, owner: tuple[int, int] | None = None,
                 before_rename: Callable[[], None] | None = None) -> None:
    """Replace `path` with `data` (mode `mode`, and `owner` when given and permitted) by rename.

    `before_rename` runs last, just before the rename: raising there leaves `path` untouched (the
    caller's check that nobody changed it meanwhile).
    """
    temporary = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fchmod(fd, mode)
            if owner is not None:
                with contextlib.suppress(PermissionError):
                    os.fchown(fd, *owner)
            os.fsync(fd)
        if before_rename is not None:
            before_rename()
        os.rename(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def install_plugin(source: Path | bytes, bin_dir: str) -> bool:
    """Write the plugin (a file's bytes, or these) into `bin_dir` unless it is already there; True when written."""
    if plugin_installed(source, bin_dir):
        return False
    target = Path(bin_dir) / PLUGIN_NAME
    for leftover in glob.glob(glob.escape(str(target)) + ".tmp.*"):  # a copy interrupted by a crash
        with contextlib.suppress(OSError):
            os.unlink(leftover)
    try:
        atomic_write(target, _content(source), PLUGIN_MODE)
    except OSError as exc:
        hint = " (read-only file system: set --cni-bin-dir to the node's CNI bin dir)" if exc.errno == 30 else ""
        what = "the launcher" if isinstance(source, bytes) else str(source)
        raise BinaryError(f"copy {what} to {target}: {exc.strerror or exc}{hint}") from None
    return True


def remove_plugin(bin_dir: str) -> bool:
    """Remove our executable; True when there was one."""
    try:
        os.unlink(Path(bin_dir) / PLUGIN_NAME)
    except FileNotFoundError:
        return False
    return True

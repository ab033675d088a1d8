"""Writing the gRPC bootstrap file: atomically, and once at agent start.

The app's gRPC library may read the file at any moment (it shares the
volume), so it must never see a half-written file: write a temporary file in
the same directory, then rename it over the target, as upstream's
AtomicWrite does (mode 0644 so the app's user can read it; missing parent
directories are created 0700, as upstream's MkdirAll).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path

from istio_agent.grpcxds.bootstrap import GrpcBootstrapOptions, build_bootstrap, render_bootstrap

log = logging.getLogger(__name__)

FILE_MODE = 0o644
DIR_MODE = 0o700


def make_dirs(directory: Path, mode: int = DIR_MODE) -> None:
    """Create `directory` and missing parents, each with `mode` (Go's MkdirAll; pathlib sets only the last)."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        if directory.parent == directory:
            break
        directory = directory.parent
    for folder in reversed(missing):
        folder.mkdir(mode=mode, exist_ok=True)


def write_atomic(path: Path, data: bytes, mode: int = FILE_MODE) -> None:
    """Replace `path` with `data` in one rename; raise OSError (and leave no temp file) on failure."""
    make_dirs(path.parent)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def write_bootstrap_file(path: Path, options: GrpcBootstrapOptions) -> bytes:
    """Build, render and write the bootstrap; returns the bytes written."""
    data = render_bootstrap(build_bootstrap(options))
    write_atomic(path, data)
    return data


class BootstrapWriter:
    """Agent component: writes GRPC_XDS_BOOTSTRAP at start; a failure stops the agent, as upstream's does.

    The file is left in place on stop: the app may still be running and
    re-reading it (upstream never removes it either).
    """

    def __init__(self, path: Path, options: GrpcBootstrapOptions) -> None:
        self.path = path
        self.options = options

    async def start(self) -> None:
        try:
            write_bootstrap_file(self.path, self.options)
        except OSError as exc:
            raise OSError(exc.errno, f"failed generating gRPC XDS bootstrap {self.path}: {exc.strerror}") from None
        log.info("gRPC xDS bootstrap written to %s", self.path)

    async def stop(self) -> None:
        return None

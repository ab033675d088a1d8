"""A lean `istio-iptables` executable (not upstream): the same entry point, started with `python -IS`.

pip's console script starts the interpreter with `site`: the venv's
site-packages scan, its `.pth` files (setuptools' distutils shim, an editable
install's path) and `os`, ~3 ms before the tool's first line, on a tool whose
whole job (flags, host facts, one `iptables-restore`) takes about as long.
istio-init pays that on every pod. This launcher runs
`istio_agent.cli.iptables:main` unchanged, with `-I` (no PYTHON* variables,
no script directory on `sys.path`) and `-S` (no site): the directories this
installation imports from are written into it (appended after the standard
library, in site's order), so it needs nothing else. Flags, environment,
output and exit codes are the console script's (`tests/component/test_capture_launcher.py`).

Beside it, in `__pycache__/<name>.<cache tag>.bundle`, the launcher's bundle:
the compiled code of every module the tool can import from this installation
(`BUNDLED`: the CLI, the capture package, Go's booleans, `__future__`) in one
file, and the paths of the extension modules it loads (`_socket`, `_ctypes`).
A meta-path finder (`BOOT`) serves them in place of the path finder's work per
module (a walk over `sys.path`, directory listings, several stats, opening
and checking a `.pyc`), reading each module's code when it is imported:
~0.7 ms of a ~16 ms run here (paired runs in fresh namespaces). Each
module is checked as its `.pyc` would be (the source's size and mtime, in
seconds; an extension's file likewise): a module edited since the bundle was
written, a bundle from another Python (magic number), of the wrong length, or
missing, leaves that import to the path finder, so the bundle changes the
tool's speed, never what it does.

    python -m istio_agent.cli.iptables_launcher [--interpreter PYTHON] DEST

writes both to DEST atomically (0755), e.g. over the console script after an
install: `.venv/bin/istio-iptables`. It names its interpreter and paths, so
it is rewritten after the installation moves. `render` is pure.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

TEMPLATE = '''#!{interpreter} -IS
# istio-iptables, written by `python -m istio_agent.cli.iptables_launcher` (not upstream): the console script's
# entry point without site. It names its interpreter and import paths: rewrite it when the installation moves.
import gc
import sys
gc.disable()
sys.path += {paths!r}
{bundle}from istio_agent.cli.iptables import main
main()
'''

# Loads the bundle's index (its header: magic number, index length, file length; a file of another length is
# not used) and installs its finder; any failure leaves the ordinary imports in charge.
BUNDLE_PRELUDE = '''try:  # the compiled modules from one file (see istio_agent.cli.iptables_launcher)
    import _frozen_importlib_external
    import marshal
    import posix
    bundle = posix.open({path!r}, posix.O_RDONLY | posix.O_CLOEXEC)
    head = posix.read(bundle, 12)
    if head[:4] == _frozen_importlib_external.MAGIC_NUMBER and posix.fstat(bundle).st_size == int.from_bytes(
            head[8:], "little"):
        boot, table = marshal.loads(posix.read(bundle, int.from_bytes(head[4:8], "little")))
        exec(boot, {{"BUNDLE": bundle, "TABLE": table}})
        del boot, table
    else:
        posix.close(bundle)
    del bundle, head
except Exception:
    pass
'''

# The bundle's finder, compiled into the bundle itself. It runs with BUNDLE (the open bundle) and TABLE
# (module name -> (source path, source mtime in seconds, source size, is a package, code offset, code length,
# its .pyc's path for __cached__, as importlib would compute it); an extension module's entry names its file,
# with offset -1).
# Each module's code is read when it is imported, in its own small buffer as a .pyc would be: one read of
# the whole file touched ~90 more pages of fresh memory, at ~3.7 us a page fault here.
BOOT = '''
import marshal
import posix
import sys
from _frozen_importlib import ModuleSpec
from _frozen_importlib_external import ExtensionFileLoader


class BundleFinder:
    """The bundle's modules whose source is unchanged since it was written (size and mtime, as a .pyc)."""

    def __init__(self, fd, table):
        self.fd = fd
        self.table = table

    def find_spec(self, name, path=None, target=None):
        entry = self.table.get(name)
        if entry is None:
            return None
        origin, mtime, size, package, offset, _, cached = entry
        try:
            stat = posix.stat(origin)
        except OSError:
            return None
        if int(stat.st_mtime) != mtime or stat.st_size != size:
            return None
        if offset < 0:  # an extension module: its file, without the walk over sys.path to find it
            spec = ModuleSpec(name, ExtensionFileLoader(name, origin), origin=origin)
            spec.has_location = True
            return spec
        spec = ModuleSpec(name, self, origin=origin, is_package=package)
        spec.has_location = True
        spec.cached = cached
        if package:
            spec.submodule_search_locations = [origin.rpartition("/")[0]]
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        _, _, _, _, offset, length, _ = self.table[module.__spec__.name]
        exec(marshal.loads(posix.pread(self.fd, length, offset)), module.__dict__)


sys.meta_path.insert(0, BundleFinder(BUNDLE, TABLE))
'''

# What the tool can import from source files: the entry point and its packages, Go's boolean rules (a boolean
# flag's value), `__future__` (every module's first import), and the whole capture package (found when written).
BUNDLED = ("__future__", "istio_agent", "istio_agent.cli", "istio_agent.cli.iptables", "istio_agent.config",
           "istio_agent.config.errors", "istio_agent.config.gobool", "istio_agent.config.settings", "istio_agent.libc",
           "istio_agent.capture")
BUNDLED_PACKAGES = ("istio_agent.capture",)
# The extension modules it loads (rtnetlink and nfnetlink sockets; setns on Python 3.11): the bundle names their
# files, which spares a walk over sys.path and a listing of lib-dynload. Absent or built-in ones are left out.
BUNDLED_EXTENSIONS = ("_socket", "_ctypes")


# What pip writes as the console script (the interpreter with site), for comparing the two: `make setup`
# puts the launcher in place of pip's script, so tests and bench_capture write this reference themselves.
CONSOLE_SCRIPT = '''#!{interpreter}
import sys
from istio_agent.cli.iptables import main
if __name__ == '__main__':
    sys.exit(main())
'''


def console_script(dest: Path, interpreter: str = sys.executable) -> Path:
    """Write pip's form of the `istio-iptables` console script to `dest` (0755)."""
    write(dest, CONSOLE_SCRIPT.format(interpreter=interpreter).encode())
    return dest


class LauncherError(ValueError):
    """The launcher cannot be written for these inputs (the message says why)."""


def render(interpreter: str, paths: list[str], bundle: str | None = None) -> bytes:
    """The launcher's bytes (the same inputs give the same bytes); `bundle`: the bundle's path, if any."""
    if not os.path.isabs(interpreter) or any(ch.isspace() for ch in interpreter):
        raise LauncherError(f"interpreter {interpreter!r}: a #! line needs an absolute path without spaces")
    if not paths:
        raise LauncherError("no import path for istio_agent")
    if bundle is not None and not os.path.isabs(bundle):
        raise LauncherError(f"bundle {bundle!r}: the launcher needs an absolute path")
    prelude = BUNDLE_PRELUDE.format(path=bundle) if bundle is not None else ""
    return TEMPLATE.format(interpreter=interpreter, paths=list(paths), bundle=prelude).encode()


def import_paths() -> list[str]:
    """Where this installation imports `istio_agent` (and its dependencies) from."""
    from istio_agent.cni.install.launcher import import_paths as installation_paths

    return installation_paths()


def bundle_path(dest: Path) -> Path:
    """Where the launcher at `dest` keeps its bundle (beside it, as Python keeps a .pyc)."""
    return dest.parent / "__pycache__" / f"{dest.name}.{sys.implementation.cache_tag}.bundle"


def bundled_modules() -> list[str]:
    """`BUNDLED`, every module of `BUNDLED_PACKAGES`, then `BUNDLED_EXTENSIONS` (as this installation has them)."""
    import importlib
    import importlib.machinery
    import importlib.util
    import pkgutil

    names = list(BUNDLED)
    for package in BUNDLED_PACKAGES:
        found = pkgutil.iter_modules(importlib.import_module(package).__path__, f"{package}.")
        names += sorted(info.name for info in found if not info.ispkg)
    for name in BUNDLED_EXTENSIONS:
        spec = importlib.util.find_spec(name)  # None when missing; built in: no file to name
        if spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            names.append(name)
    return names


def pyc_path(origin: str) -> str:
    """What importlib sets as a source module's `__cached__` under the launcher (`-IS`: no -O, no pycache prefix)."""
    head, _, tail = origin.rpartition("/")
    return f"{head}/__pycache__/{tail.rpartition('.')[0]}.{sys.implementation.cache_tag}.pyc"


def compiled(source: bytes, origin: str) -> bytes:
    """A module's code, marshalled, as the launcher's interpreter would compile it (no -O)."""
    import marshal

    return marshal.dumps(compile(source, origin, "exec", dont_inherit=True, optimize=0))


def build_bundle(names: list[str]) -> bytes:
    """The bundle: magic number, index length, file length (4 bytes each), the index, then each module's code.

    The index is (BOOT's code, TABLE) marshalled; TABLE's offsets count from the file's start.
    """
    import importlib.machinery
    import importlib.util
    import marshal

    sources: list[tuple[str, str, int, int, bool, bytes | None]] = []
    for name in names:
        spec = importlib.util.find_spec(name)
        origin = str(spec.origin) if spec is not None and spec.has_location else ""
        extension = spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)
        if not (origin.endswith(".py") or extension):
            raise LauncherError(f"cannot bundle {name}: not a module with a source file or an extension module")
        with open(origin, "rb") as handle:
            stat = os.fstat(handle.fileno())
            code = None if extension else compiled(handle.read(), origin)
        package = spec is not None and spec.submodule_search_locations is not None
        sources.append((name, origin, int(stat.st_mtime), stat.st_size, package, code))
    boot = compile(BOOT, "<istio-iptables bundle>", "exec", dont_inherit=True, optimize=0)

    def index(start: int) -> bytes:
        table: dict[str, tuple[str, int, int, bool, int, int, str | None]] = {}
        offset = start
        for name, origin, mtime, size, package, code in sources:
            if code is None:
                table[name] = (origin, mtime, size, False, -1, 0, None)
            else:
                table[name] = (origin, mtime, size, package, offset, len(code), pyc_path(origin))
                offset += len(code)
        return marshal.dumps((boot, table))

    start = 12 + len(index(0))
    while len(index(start)) + 12 != start:  # the offsets' own size in the index (marshal's ints vary in length)
        start = 12 + len(index(start))
    body = index(start) + b"".join(code for *_, code in sources if code is not None)
    total = 12 + len(body)
    return importlib.util.MAGIC_NUMBER + (start - 12).to_bytes(4, "little") + total.to_bytes(4, "little") + body


def write(dest: Path, data: bytes, mode: int = 0o755) -> None:
    """Replace `dest` with `data` (temp file in the same directory, then rename; mode 0755)."""
    from istio_agent.cni.install.binaries import atomic_write

    atomic_write(dest, data, mode)


def write_launcher(dest: Path, interpreter: str = sys.executable, warn: Callable[[str], None] | None = None) -> Path:
    """Write the bundle, then the launcher that names it, for `interpreter`; the launcher's path.

    A bundle that cannot be written (a read-only directory, a module without its source) only costs speed:
    the launcher is written without it, and `warn` is told why.
    """
    bundle = bundle_path(dest.absolute())
    named: str | None = str(bundle)
    try:
        if os.path.realpath(interpreter) != os.path.realpath(sys.executable):
            # The bundle holds this interpreter's code and extension paths; another build of the same version
            # would pass its magic-number check and load them.
            raise LauncherError(f"{interpreter} is not the Python writing the bundle ({sys.executable})")
        data = build_bundle(bundled_modules())
        bundle.parent.mkdir(exist_ok=True)
        write(bundle, data, 0o644)
    except (LauncherError, OSError) as exc:
        if warn is not None:
            warn(f"no bundle ({exc}): the launcher imports each module from its file")
        named = None
    write(dest, render(interpreter, import_paths(), named))
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m istio_agent.cli.iptables_launcher",
                                     description="Write the lean istio-iptables launcher (python -IS).")
    parser.add_argument("dest", type=Path, help="where to write it, e.g. the console script's path")
    parser.add_argument("--interpreter", default=sys.executable,
                        help="the Python it runs with (default: this one, %(default)s)")
    args = parser.parse_args(argv)
    try:
        write_launcher(args.dest, args.interpreter, lambda text: print(f"iptables_launcher: {text}", file=sys.stderr))
    except (LauncherError, OSError) as exc:
        print(f"iptables_launcher: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

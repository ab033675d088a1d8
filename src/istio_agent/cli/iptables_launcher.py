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

    python -m istio_agent.cli.iptables_launcher [--interpreter PYTHON] DEST

writes it to DEST atomically (0755), e.g. over the console script after an
install: `.venv/bin/istio-iptables`. It names its interpreter and paths, so
it is rewritten after the installation moves. `render` is pure.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

TEMPLATE = '''#!{interpreter} -IS
# istio-iptables, written by `python -m istio_agent.cli.iptables_launcher` (not upstream): the console script's
# entry point without site. It names its interpreter and import paths: rewrite it when the installation moves.
import gc
import sys
gc.disable()
sys.path += {paths!r}
from istio_agent.cli.iptables import main
main()
'''


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


def render(interpreter: str, paths: list[str]) -> bytes:
    """The launcher's bytes (the same inputs give the same bytes)."""
    if not os.path.isabs(interpreter) or any(ch.isspace() for ch in interpreter):
        raise LauncherError(f"interpreter {interpreter!r}: a #! line needs an absolute path without spaces")
    if not paths:
        raise LauncherError("no import path for istio_agent")
    return TEMPLATE.format(interpreter=interpreter, paths=list(paths)).encode()


def import_paths() -> list[str]:
    """Where this installation imports `istio_agent` (and its dependencies) from."""
    from istio_agent.cni.install.launcher import import_paths as installation_paths

    return installation_paths()


def write(dest: Path, data: bytes) -> None:
    """Replace `dest` with the launcher (temp file in the same directory, then rename; mode 0755)."""
    from istio_agent.cni.install.binaries import atomic_write

    atomic_write(dest, data, 0o755)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m istio_agent.cli.iptables_launcher",
                                     description="Write the lean istio-iptables launcher (python -IS).")
    parser.add_argument("dest", type=Path, help="where to write it, e.g. the console script's path")
    parser.add_argument("--interpreter", default=sys.executable,
                        help="the Python it runs with (default: this one, %(default)s)")
    args = parser.parse_args(argv)
    try:
        write(args.dest, render(args.interpreter, import_paths()))
    except (LauncherError, OSError) as exc:
        print(f"iptables_launcher: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The `istio-cni` executable install-cni puts in the CNI bin dir: a lean launcher (not upstream).

The container runtime execs the plugin once per pod, and a Python process that
imports the plugin pays ~40 ms before its first rule (interpreter, json, ssl,
a TLS handshake). The launcher is a few lines that start with `-IS` (no site,
no environment-driven paths), import `fastclient` (builtins only: `_socket`,
`posix`; `python -X importtime` shows nothing else but it) from its directory
in this installation, put this installation's import paths (the `istio_agent`
package's root and the interpreter's site-packages, after the standard
library as site would) on `sys.path` for the in-process fallback, and call
`fastclient.launch`, which hands the call to install-cni over
`<cni-agent-run-dir>/sidecar-add.sock` (`fastwire` framing): the environment
names the plugin reads and stdin go in, the plugin's stdout, exit status and
log lines come back and are written out unchanged. The code is a module rather
than the script's own text because a script is compiled from source on every
exec and a module runs from its cached bytecode.

When the socket is absent, refuses the connection or refuses the caller (not
root), or for a dry run (`DRY_RUN_FILE_PATH`: the recording is written as the
caller), it runs the full plugin in-process instead, from the same paths, so
it needs nothing else on the node. Once the request has been sent, the agent's
answer is final: a lost connection is a CNI error 11 (formatted by the
plugin's own code), never a second ADD in-process, as the agent may have
started applying rules.

`render` is pure: the same installation gives the same bytes, so install-cni's
"already installed" check still skips an identical copy.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from istio_agent.cni.install import fastwire

TEMPLATE = '''#!{interpreter} -IS
# istio-cni launcher, written by install-cni (istio_agent.cni.install.launcher); it is rewritten on every install.
# Hands the CNI call to install-cni's fast path on {socket}; without it, runs the plugin in-process.
import sys
sys.path.append({client_dir!r})
from fastclient import launch
sys.path[-1:] = {paths!r}
launch({socket!r})
'''


# Where `fastclient` is under the package root (`import_paths()[0]`): the launcher imports it as a top-level
# module from that directory, which is on `sys.path` for that one import only; importing it through its
# packages cost ~0.4 ms more per exec (a directory listing and a .pyc for each of three `__init__`s).
CLIENT_PACKAGE = ("istio_agent", "cni", "install")


class LauncherError(OSError):
    """The launcher cannot be written for this installation (names what is missing)."""


def interpreter_of(console_script: Path) -> str:
    """The interpreter the `istio-cni` console script runs with (its `#!` line)."""
    try:
        with console_script.open("rb") as handle:
            first = handle.readline(4096)
    except OSError as exc:
        raise LauncherError(f"read {console_script}: {exc.strerror or exc}") from None
    if not first.startswith(b"#!"):
        raise LauncherError(f"{console_script} has no #! line naming its interpreter")
    parts = first[2:].decode(errors="surrogateescape").split()
    if not parts:
        raise LauncherError(f"{console_script}: its #! line names no interpreter")
    if os.path.basename(parts[0]) == "env" and len(parts) > 1:  # `#!/usr/bin/env python3`
        return parts[1] if os.path.isabs(parts[1]) else sys.executable
    return parts[0]


def import_paths() -> list[str]:
    """Where this installation imports `istio_agent` and its dependencies from, for the -S fallback."""
    import istio_agent

    root = str(Path(istio_agent.__file__).resolve().parent.parent)
    paths = [root]
    for name in ("purelib", "platlib"):
        path = sysconfig.get_paths()[name]
        if path not in paths:
            paths.append(path)
    return paths


def render(interpreter: str, socket_path: str, paths: list[str]) -> bytes:
    """The launcher's bytes (deterministic for the same inputs)."""
    if any(ch.isspace() for ch in interpreter) or not os.path.isabs(interpreter):
        raise LauncherError(f"interpreter {interpreter!r}: a launcher needs an absolute path without spaces")
    if not paths:
        raise LauncherError("no import path for istio_agent")
    client_dir = os.path.join(paths[0], *CLIENT_PACKAGE)
    return TEMPLATE.format(interpreter=interpreter, socket=socket_path, paths=paths, client_dir=client_dir).encode()


def launcher_for(console_script: Path, run_dir: str) -> bytes:
    """The launcher for this installation and `--cni-agent-run-dir`."""
    return render(interpreter_of(console_script), os.path.join(run_dir, fastwire.SOCKET_NAME), import_paths())

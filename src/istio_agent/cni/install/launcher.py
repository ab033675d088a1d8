"""The `istio-cni` executable install-cni puts in the CNI bin dir: a lean launcher (not upstream).

The container runtime execs the plugin once per pod, and a Python process that
imports the plugin pays ~40 ms before its first rule (interpreter, json, ssl,
a TLS handshake). The launcher is a short generated script that starts with
`-IS` (no site, no environment-driven paths), imports only builtins (`_socket`,
`posix`, `sys`: `python -X importtime` shows nothing else) and hands the call
to install-cni over `<cni-agent-run-dir>/sidecar-add.sock` (`fastwire`
framing): the environment names the plugin reads and stdin go in, the plugin's
stdout, exit status and log lines come back and are written out unchanged.

When the socket is absent, refuses the connection or refuses the caller (not
root), or for a dry run (`DRY_RUN_FILE_PATH`: the recording is written as the
caller), it runs the full plugin in-process instead: the paths this
installation imports from (the `istio_agent` package's root and the
interpreter's site-packages) are written into the script, so it needs nothing
else on the node. Once the request has been sent, the agent's answer is final:
a lost connection is a CNI error 11 (formatted by the plugin's own code),
never a second ADD in-process, as the agent may have started applying rules.

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
import _socket
import posix
import sys

SOCKET = {socket!r}
PATHS = {paths!r}
PREFIXES = {prefixes!r}
NAMES = {names!r}
MAGIC = {magic!r}


def plugin():
    sys.path[:0] = PATHS
    import istio_agent.cni.plugin.main as plugin_main
    return plugin_main


def read_stdin():
    chunks = []
    while True:
        chunk = posix.read(0, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def u32(data, pos):
    return int.from_bytes(data[pos:pos + 4], "big")


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[posix.write(fd, view):]


def launch():
    try:
        stdin = read_stdin()
    except OSError as err:
        return plugin().main(err)
    env = posix.environ  # bytes names and values
    if env.get(b"DRY_RUN_FILE_PATH"):
        return plugin().main(stdin)
    block = b"\\0".join(k + b"=" + v for k, v in env.items() if k.startswith(PREFIXES) or k in NAMES)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(SOCKET)
    except OSError:
        sock.close()
        return plugin().main(stdin)
    sent = True
    reply = b""
    try:
        try:
            sock.sendall(MAGIC + len(block).to_bytes(4, "big") + block + len(stdin).to_bytes(4, "big") + stdin)
        except OSError:
            sent = False  # the agent closed first: it refused, or never read the whole request
        chunks = []
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        reply = b"".join(chunks)
    except OSError as err:
        if sent:
            return plugin().agent_failed(stdin, "reading its answer: " + str(err))
    finally:
        sock.close()
    if reply == MAGIC + b"R" or not sent:
        return plugin().main(stdin)
    if len(reply) < len(MAGIC) + 13 or not reply.startswith(MAGIC + b"A"):
        return plugin().agent_failed(stdin, "it closed the connection without an answer")
    pos = len(MAGIC) + 1
    code, out_len = u32(reply, pos), u32(reply, pos + 4)
    pos += 8
    out = reply[pos:pos + out_len]
    err_len = u32(reply, pos + out_len)
    err = reply[pos + out_len + 4:]
    if len(out) != out_len or len(err) != err_len:
        return plugin().agent_failed(stdin, "its answer was truncated")
    write_all(2, err)
    write_all(1, out)
    posix._exit(code)


launch()
'''


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
    text = TEMPLATE.format(interpreter=interpreter, socket=socket_path, paths=paths,
                           prefixes=tuple(p.encode() for p in fastwire.FORWARDED_PREFIXES),
                           names=tuple(n.encode() for n in fastwire.FORWARDED_NAMES), magic=fastwire.MAGIC)
    return text.encode()


def launcher_for(console_script: Path, run_dir: str) -> bytes:
    """The launcher for this installation and `--cni-agent-run-dir`."""
    return render(interpreter_of(console_script), os.path.join(run_dir, fastwire.SOCKET_NAME), import_paths())

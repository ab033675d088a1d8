"""The `istio-cni` launcher's side of the fast path (not upstream): builtins only, run from its cached bytecode.

The launcher install-cni writes (`launcher.py`) is a few lines that import this
module (as the top-level `fastclient`, from this directory: no package
`__init__` on the way) and call `launch`; the code lives here rather than in
the script because a script is compiled from source on every exec (~0.6 ms for
this much code, on every pod's ADD), while an imported module runs from its
`.pyc`. Nothing here may import more than `_socket` and `posix` (no `os`, no
package of this project, not even `from __future__`): `python -X importtime`
of the launcher on the fast path shows only these and this module.

`launch` sends the environment names the plugin reads and stdin to install-cni
(`fastwire`'s request framing), then reads the answer only until it is whole,
not until the connection closes: install-cni logs the call after answering, and
the pod's ADD does not wait for that. Without a listening socket, on a refusal
or for a dry run, the plugin runs in-process (`plugin.main.main`); once the
request was sent, a lost or malformed answer is error 11 (`plugin.main.agent_failed`).
"""

import _socket
import posix

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

# The framing's constants; `fastwire` takes them from here, so both sides share one definition.
MAGIC = b"ICNI1\n"
ANSWER = b"A"
REFUSED = b"R"
# The environment the plugin reads: CNI_*, the pod-retrieval tunables and istio-iptables' ISTIO_* settings,
# ENVOY_USER. DRY_RUN_FILE_PATH is never forwarded: a dry run is recorded in-process, as the caller.
FORWARDED_PREFIXES = (b"CNI_", b"ISTIO_")
FORWARDED_NAMES = (b"ENVOY_USER",)
_HEAD = len(MAGIC) + 1  # magic and kind
_CHUNK = 1 << 16


def _plugin() -> "ModuleType":
    """`plugin.main`, imported only on the in-process paths."""
    import istio_agent.cni.plugin.main as plugin_main

    return plugin_main


def _read_stdin() -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = posix.read(0, _CHUNK)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _u32(data: bytes, pos: int) -> int:
    return int.from_bytes(data[pos:pos + 4], "big")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[posix.write(fd, view):]


def request(env: dict[bytes, bytes], stdin: bytes) -> bytes:
    """The request frame for this environment (only the forwarded names) and stdin (pure)."""
    block = b"\0".join(k + b"=" + v for k, v in env.items() if k.startswith(FORWARDED_PREFIXES)
                       or k in FORWARDED_NAMES)
    return MAGIC + len(block).to_bytes(4, "big") + block + len(stdin).to_bytes(4, "big") + stdin


def reply_size(data: bytes) -> int:
    """How many bytes the reply that `data` begins has, as far as `data` tells (pure).

    Read until `len(data)` reaches it: more than `len(data)` means more is needed
    (the figure grows as the lengths arrive); a reply that is neither an answer
    nor a refusal is as long as what came.
    """
    if len(data) < _HEAD:
        return _HEAD
    if not data.startswith(MAGIC) or data[len(MAGIC):_HEAD] not in (ANSWER, REFUSED):
        return len(data)
    if data[len(MAGIC):_HEAD] == REFUSED:
        return _HEAD
    if len(data) < _HEAD + 8:  # status, stdout's length
        return _HEAD + 8
    stderr_at = _HEAD + 8 + _u32(data, _HEAD + 4)
    if len(data) < stderr_at + 4:
        return stderr_at + 4
    return stderr_at + 4 + _u32(data, stderr_at)


def parse_reply(reply: bytes) -> tuple[int, bytes, bytes] | str | None:
    """(status, stdout, stderr) of a whole answer; None for a refusal; what is wrong otherwise (pure)."""
    if reply == MAGIC + REFUSED:
        return None
    if len(reply) < _HEAD + 12 or not reply.startswith(MAGIC + ANSWER):
        return "it closed the connection without an answer"
    code, out_len = _u32(reply, _HEAD), _u32(reply, _HEAD + 4)
    pos = _HEAD + 8
    out = reply[pos:pos + out_len]
    err_len = _u32(reply, pos + out_len)
    err = reply[pos + out_len + 4:]
    if len(out) != out_len or len(err) != err_len:
        return "its answer was truncated"
    return code, out, err


def _read_reply(sock: _socket.socket) -> bytes:
    """The reply, read until it is whole or the connection closes."""
    reply = b""
    while len(reply) < reply_size(reply):
        chunk = sock.recv(_CHUNK)
        if not chunk:
            break
        reply += chunk
    return reply


def launch(socket_path: str) -> None:
    """One CNI call: answered by install-cni on `socket_path`, or by the plugin in-process."""
    try:
        stdin = _read_stdin()
    except OSError as err:
        _plugin().main(err)
        return
    env = posix.environ  # bytes names and values
    if env.get(b"DRY_RUN_FILE_PATH"):
        _plugin().main(stdin)
        return
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(socket_path)
    except OSError:
        sock.close()
        _plugin().main(stdin)
        return
    sent = True
    reply = b""
    try:
        try:
            sock.sendall(request(env, stdin))
        except OSError:
            sent = False  # the agent closed first: it refused, or never read the whole request
        reply = _read_reply(sock)
    except OSError as err:
        if sent:
            _plugin().agent_failed(stdin, "reading its answer: " + str(err))
            return
    finally:
        sock.close()
    if not sent:
        _plugin().main(stdin)  # nothing was taken
        return
    answer = parse_reply(reply)
    if answer is None:
        _plugin().main(stdin)
        return
    if isinstance(answer, str):
        _plugin().agent_failed(stdin, answer)
        return
    code, out, log_lines = answer
    _write_all(2, log_lines)
    _write_all(1, out)
    posix._exit(code)

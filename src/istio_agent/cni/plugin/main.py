"""`istio-cni`: the thin edge. The CNI runtime execs it once per pod with CNI_* in the environment.

Everything protocol-shaped is in `protocol` (pure); `handle` is one
invocation from the environment and stdin to what the plugin answers (stdout
bytes, exit status, its log entries) and is shared by the two ways a call
arrives: this process (`run`, `main`) and install-cni's fast path
(`cni/install/fastpath.py`), which runs the same function for the launcher
install-cni puts in the CNI bin dir (`cni/install/launcher.py`). `run` writes
the answer and hands the log to the node agent's socket at the end. The
module stays small on purpose: its import graph is what every pod's ADD pays
for when it runs in-process (`python -X importtime`).
"""

from __future__ import annotations

import os
import sys
import time

from istio_agent.cni.plugin.log import SOCKET_NAME, PluginLog, send_to_socket
from istio_agent.cni.plugin.protocol import (
    ABOUT,
    ERR_INTERNAL,
    ERR_IO_FAILURE,
    ERR_TRY_AGAIN_LATER,
    SUPPORTED_VERSIONS,
    CniError,
    add_result,
    error_result,
    error_version,
    parse_request,
    version_result,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import BinaryIO, TextIO

    from istio_agent.cni.plugin.add import GetPod


class Outcome:
    """What one invocation answers: the exit status, stdout's bytes, the log socket it would post to, and (ADD)
    the rolling log file its entries at info and above go to."""

    __slots__ = ("code", "log_file", "socket_path", "stdout")

    def __init__(self, code: int, stdout: bytes, socket_path: str = "", log_file: str = "") -> None:
        self.code = code
        self.stdout = stdout
        self.socket_path = socket_path
        self.log_file = log_file


def handle(env: Mapping[str, str], stdin: bytes | OSError, log: PluginLog,
           sleep: Callable[[float], None] = time.sleep, get: GetPod | None = None) -> Outcome:
    """One invocation: status 0 on success, 1 with a CNI error object as stdout.

    `stdin` is what was read, or the error reading it (skel's I/O failure, code 5).
    `get` fetches the pod (default: one fresh HTTPS GET per attempt); the log's
    entries are in `log` (and on its stderr) when this returns.
    """
    socket_path = log_file = ""
    version = ""
    if isinstance(stdin, OSError):
        if env.get("CNI_COMMAND", "") in ("", "VERSION"):
            stdin = b""
        else:
            err = CniError(ERR_IO_FAILURE, f"error reading the network configuration from stdin: {stdin}")
            log.error(str(err))
            return Outcome(1, error_result(err))
    try:
        request = parse_request(env, stdin)
        if request is None:
            log.stderr.write(f"{ABOUT}\nCNI protocol versions supported: {', '.join(SUPPORTED_VERSIONS)}\n")
            return Outcome(0, b"")
        if request.command == "VERSION":
            return Outcome(0, version_result(stdin))
        version = request.version
        from istio_agent.cni.plugin.netconf import parse_plugin_config

        conf = parse_plugin_config(request.config)
        log.set_level(conf.plugin_log_level)
        socket_path = os.path.join(conf.cni_agent_run_dir, SOCKET_NAME)
        result = b""
        if request.command == "ADD":
            from istio_agent.cni.plugin.add import cmd_add
            from istio_agent.cni.plugin.rollinglog import LOG_NAME

            log_file = os.path.join(conf.cni_agent_run_dir, LOG_NAME)

            log.debug(f"istio-cni ADD for container {request.container_id}, netns {request.netns}, "
                      f"if {request.ifname}, args {request.args!r}")
            result = add_result(request.config, version)  # a bad prevResult fails before anything is applied
            if get is None:
                cmd_add(request, conf, env, log, sleep=sleep)
            else:
                cmd_add(request, conf, env, log, get=get, sleep=sleep)
        # DEL, CHECK, STATUS and GC have nothing to do in sidecar mode (upstream's are no-ops too):
        # the rules live in the pod's netns and go with it.
        return Outcome(0, result, socket_path, log_file)
    except CniError as err:
        log.error(f"istio-cni {env.get('CNI_COMMAND', '')} error: {err}")
        return Outcome(1, error_result(err, version or error_version(stdin)), socket_path, log_file)
    except Exception as err:
        log.error(f"istio-cni {env.get('CNI_COMMAND', '')} failed unexpectedly: {type(err).__name__}: {err}")
        return Outcome(1, error_result(CniError(ERR_INTERNAL, f"istio-cni failed: {type(err).__name__}: {err}"),
                                       version or error_version(stdin)), socket_path, log_file)


def run(env: Mapping[str, str], stdin: bytes | OSError, stdout: BinaryIO, stderr: TextIO,
        sleep: Callable[[float], None] = time.sleep) -> int:
    """One in-process invocation: the answer written to `stdout`, the log to the node agent's socket; the status."""
    log = PluginLog(stderr=stderr)
    try:
        outcome = handle(env, stdin, log, sleep)
    except Exception as err:  # past handle's own guards: still the spec's error object, never a traceback
        outcome = Outcome(1, error_result(CniError(ERR_INTERNAL, f"istio-cni failed: {type(err).__name__}")))
    try:
        if outcome.stdout:
            stdout.write(outcome.stdout)
    finally:
        if outcome.socket_path:
            send_to_socket(outcome.socket_path, log.entries)
        if outcome.log_file:
            write_log_file(outcome.log_file, log.file_entries)
    return outcome.code


def write_log_file(path: str, entries: list[str]) -> None:
    """ADD's entries at info and above to the rolling `istio-cni.log` (best effort, as the socket)."""
    if entries:
        from istio_agent.cni.plugin.rollinglog import append

        append(path, entries)


def read_stdin() -> bytes | OSError:
    try:
        return sys.stdin.buffer.read() if sys.stdin is not None else b""
    except OSError as err:
        return err


def main(stdin: bytes | OSError | None = None) -> None:
    """Console-script entry point (and the launcher's fallback, which has read stdin already)."""
    code = run(os.environ, read_stdin() if stdin is None else stdin, sys.stdout.buffer, sys.stderr)
    sys.stdout.flush()
    sys.exit(code)


def agent_failed(stdin: bytes, message: str) -> None:
    """The launcher's answer when the node agent took the call but gave no answer: code 11, never a retry here.

    The agent may have started applying the pod's rules, so running ADD again in
    this process could apply them twice; the runtime retries the whole sandbox.
    """
    err = CniError(ERR_TRY_AGAIN_LATER, f"istio-cni: the node agent's fast path failed: {message}")
    PluginLog(stderr=sys.stderr).error(str(err))
    sys.stdout.buffer.write(error_result(err, error_version(stdin)))
    sys.stdout.flush()
    sys.exit(1)

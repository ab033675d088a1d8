"""`istio-cni`: the thin edge. The CNI runtime execs it once per pod with CNI_* in the environment.

Everything protocol-shaped is in `protocol` (pure); this module reads the
environment and stdin, dispatches the command, writes the result or the
error object to stdout (non-zero exit on error), and hands the log to the
node agent's socket at the end. It stays small on purpose: its import graph
is what every pod's ADD pays for before doing anything (`python -X importtime`).
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


def run(env: Mapping[str, str], stdin: bytes | OSError, stdout: BinaryIO, stderr: TextIO,
        sleep: Callable[[float], None] = time.sleep) -> int:
    """One invocation: 0 on success, 1 after writing a CNI error object to stdout.

    `stdin` is what was read, or the error reading it (skel's I/O failure, code 5).
    """
    log = PluginLog(stderr=stderr)
    socket_path = ""
    version = ""
    if isinstance(stdin, OSError):
        if env.get("CNI_COMMAND", "") in ("", "VERSION"):
            stdin = b""
        else:
            err = CniError(ERR_IO_FAILURE, f"error reading the network configuration from stdin: {stdin}")
            log.error(str(err))
            stdout.write(error_result(err))
            return 1
    try:
        request = parse_request(env, stdin)
        if request is None:
            stderr.write(f"{ABOUT}\nCNI protocol versions supported: {', '.join(SUPPORTED_VERSIONS)}\n")
            return 0
        if request.command == "VERSION":
            stdout.write(version_result(stdin))
            return 0
        version = request.version
        from istio_agent.cni.plugin.netconf import parse_plugin_config

        conf = parse_plugin_config(request.config)
        log.set_level(conf.plugin_log_level)
        socket_path = os.path.join(conf.cni_agent_run_dir, SOCKET_NAME)
        if request.command == "ADD":
            from istio_agent.cni.plugin.add import cmd_add

            log.debug(f"istio-cni ADD for container {request.container_id}, netns {request.netns}, "
                      f"if {request.ifname}, args {request.args!r}")
            result = add_result(request.config, version)  # a bad prevResult fails before anything is applied
            cmd_add(request, conf, env, log, sleep=sleep)
            stdout.write(result)
        # DEL, CHECK, STATUS and GC have nothing to do in sidecar mode (upstream's are no-ops too):
        # the rules live in the pod's netns and go with it.
        return 0
    except CniError as err:
        log.error(f"istio-cni {env.get('CNI_COMMAND', '')} error: {err}")
        stdout.write(error_result(err, version or error_version(stdin)))
        return 1
    except Exception as err:
        log.error(f"istio-cni {env.get('CNI_COMMAND', '')} failed unexpectedly: {type(err).__name__}: {err}")
        stdout.write(error_result(CniError(ERR_INTERNAL, f"istio-cni failed: {type(err).__name__}: {err}"),
                                  version or error_version(stdin)))
        return 1
    finally:
        if socket_path:
            send_to_socket(socket_path, log.entries)


def main() -> None:
    """Console-script entry point."""
    stdin: bytes | OSError
    try:
        stdin = sys.stdin.buffer.read() if sys.stdin is not None else b""
    except OSError as err:
        stdin = err
    code = run(os.environ, stdin, sys.stdout.buffer, sys.stderr)
    sys.stdout.flush()
    sys.exit(code)

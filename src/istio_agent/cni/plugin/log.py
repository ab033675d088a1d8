"""The plugin's log: JSON lines on stderr, and the same entries POSTed to the node agent's log socket (and, for
ADD, those at info and above appended to `istio-cni.log`: `rollinglog.py`).

stdout belongs to the CNI protocol, so the plugin logs to stderr (the runtime
keeps it) and, as upstream does, to install-cni's `<cni_agent_run_dir>/log.sock`:
one HTTP POST to `/log` at exit whose body is a JSON array of strings, each
string one JSON log entry with `level`, `time` (RFC 3339), `msg` and the
entry's labels as further keys (what upstream's `cni/pkg/log/uds.go`
decodes). The socket is best effort: sent only when it exists, with a
one-second timeout (upstream's), and any failure is ignored, so ADD never
fails because the node agent is away.

Entry formatting is pure (time passed in); `send_to_socket` is the I/O.
"""

from __future__ import annotations

import json
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TextIO

LEVELS = {"none": 100, "error": 40, "warn": 30, "info": 20, "debug": 10}
DEFAULT_LEVEL = "info"
SOCKET_NAME = "log.sock"
LOG_PATH = "/log"
SOCKET_TIMEOUT = 1.0


def format_time(now: float) -> str:
    """RFC 3339 in UTC with microseconds, as Go's time.Time unmarshals it."""
    seconds = int(now)
    micros = round((now - seconds) * 1_000_000)
    if micros >= 1_000_000:
        seconds, micros = seconds + 1, micros - 1_000_000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


def format_entry(level: str, msg: str, now: float, labels: dict[str, str]) -> str:
    """One log entry as a JSON object (labels after the fixed keys)."""
    entry: dict[str, object] = {"level": level, "time": format_time(now), "msg": msg}
    for key, value in labels.items():
        if key not in entry:
            entry[key] = value
    return json.dumps(entry)


def request_bytes(entries: list[str]) -> bytes:
    """The POST upstream's log server handles: a JSON array of the entries' JSON strings."""
    body = json.dumps(entries).encode()
    head = (f"POST {LOG_PATH} HTTP/1.1\r\nHost: unix\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class PluginLog:
    """Entries at or above the level go to stderr now and are kept for the socket."""

    def __init__(self, level: str = DEFAULT_LEVEL, stderr: TextIO | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.threshold = LEVELS.get(level, LEVELS[DEFAULT_LEVEL])
        self.stderr = stderr if stderr is not None else sys.stderr
        self.clock = clock
        self.labels: dict[str, str] = {}
        self.entries: list[str] = []
        self.file_entries: list[str] = []  # those at info and above: what upstream's rolling file keeps

    def set_level(self, level: str) -> None:
        if level and level not in LEVELS:
            self.threshold = LEVELS[DEFAULT_LEVEL]
            self.warn(f"plugin_log_level {level!r} is not one of {', '.join(LEVELS)}; logging at info")
            return
        self.threshold = LEVELS.get(level or DEFAULT_LEVEL, LEVELS[DEFAULT_LEVEL])

    def log(self, level: str, msg: str) -> None:
        if LEVELS[level] < self.threshold:
            return
        line = format_entry(level, msg, self.clock(), self.labels)
        self.entries.append(line)
        if LEVELS[level] >= LEVELS["info"]:
            self.file_entries.append(line)
        try:
            self.stderr.write(line + "\n")
            self.stderr.flush()
        except (OSError, ValueError):
            pass

    def debug(self, msg: str) -> None:
        self.log("debug", msg)

    def info(self, msg: str) -> None:
        self.log("info", msg)

    def warn(self, msg: str) -> None:
        self.log("warn", msg)

    def error(self, msg: str) -> None:
        self.log("error", msg)


def send_to_socket(path: str, entries: list[str], timeout: float = SOCKET_TIMEOUT) -> bool:
    """POST the entries to the log socket; False (and nothing raised) when it is absent or fails."""
    if not entries:
        return True
    import os

    try:
        if not os.path.exists(path):
            return False
    except (OSError, ValueError):
        return False
    import socket

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(request_bytes(entries))
            reply = sock.recv(64)
    except (OSError, ValueError):
        return False
    return reply.startswith(b"HTTP/1.") and reply[9:12] == b"200"

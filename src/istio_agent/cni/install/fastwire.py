"""The fast path's framing between the `istio-cni` launcher and install-cni (not upstream), sans-IO.

One connection carries one CNI call. All integers are 4-byte big-endian.

- request: `MAGIC`, the length and bytes of the environment block (`KEY=VALUE`
  entries joined by NUL, only the names the plugin reads: `forwarded`), the
  length and bytes of stdin;
- reply: `MAGIC`, one kind byte, then for `ANSWER` the exit status, the
  length and bytes of stdout and the length and bytes of stderr (the plugin's
  log lines, as the in-process plugin writes them). `REFUSED` (the caller is
  not root) has nothing after it and tells the launcher nothing was done.

The launcher's side (`fastclient.py`) is written with builtins only and holds
the constants; these functions are install-cni's side and the reference the
tests hold the launcher's to.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from istio_agent.cni.install import fastclient

MAGIC = fastclient.MAGIC  # the launcher's module holds the constants (it can import nothing but builtins)
ANSWER = fastclient.ANSWER
REFUSED = fastclient.REFUSED
SOCKET_NAME = "sidecar-add.sock"
# The environment the plugin reads (CNI_*, the pod-retrieval tunables, istio-iptables' ISTIO_* settings,
# ENVOY_USER); DRY_RUN_FILE_PATH is never forwarded: the launcher runs a dry run in-process.
FORWARDED_PREFIXES = tuple(p.decode() for p in fastclient.FORWARDED_PREFIXES)
FORWARDED_NAMES = tuple(n.decode() for n in fastclient.FORWARDED_NAMES)
MAX_ENV = 1 << 20
MAX_STDIN = 16 << 20


class FrameError(ValueError):
    """The bytes are not one fast-path frame (names what is wrong)."""


def forwarded(name: str) -> bool:
    return name.startswith(FORWARDED_PREFIXES) or name in FORWARDED_NAMES


def _u32(value: int) -> bytes:
    return value.to_bytes(4, "big")


def encode_request(env: Mapping[str, str], stdin: bytes) -> bytes:
    block = b"\0".join(os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items() if forwarded(k))
    return MAGIC + _u32(len(block)) + block + _u32(len(stdin)) + stdin


def request_size(data: bytes) -> int:
    """How many bytes the request that `data` begins has, as far as `data` tells (pure).

    More than `len(data)` while more is needed (the figure grows as the lengths arrive); FrameError as soon
    as the bytes cannot be a request (bad magic, a length over the limits), before the rest is read.
    """
    head = len(MAGIC) + 4
    if not MAGIC.startswith(data[:len(MAGIC)]):
        raise FrameError("not a fast-path request (bad magic)")
    if len(data) < head:
        return head
    env_len = int.from_bytes(data[len(MAGIC):head], "big")
    if env_len > MAX_ENV:
        raise FrameError(f"environment block of {env_len} bytes exceeds {MAX_ENV}")
    stdin_at = head + env_len + 4
    if len(data) < stdin_at:
        return stdin_at
    stdin_len = int.from_bytes(data[stdin_at - 4:stdin_at], "big")
    if stdin_len > MAX_STDIN:
        raise FrameError(f"stdin of {stdin_len} bytes exceeds {MAX_STDIN}")
    return stdin_at + stdin_len


def decode_env(block: bytes) -> dict[str, str]:
    """The environment block decoded as Python decodes a process environment (file-system encoding), filtered again."""
    env: dict[str, str] = {}
    if not block:
        return env
    for entry in block.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if not sep or not name:
            raise FrameError(f"environment entry {entry[:60]!r} is not KEY=VALUE")
        key = os.fsdecode(name)
        if forwarded(key):
            env[key] = os.fsdecode(value)
    return env


def decode_request(data: bytes) -> tuple[dict[str, str], bytes]:
    """A whole request: the environment and stdin (FrameError when it is not exactly one request)."""
    if request_size(data) != len(data):  # bad magic and lengths over the limits raise there
        raise FrameError("truncated or oversized fast-path request")
    head = len(MAGIC) + 4
    env_end = head + int.from_bytes(data[len(MAGIC):head], "big")
    return decode_env(data[head:env_end]), data[env_end + 4:]


def encode_answer(code: int, stdout: bytes, stderr: bytes) -> bytes:
    return MAGIC + ANSWER + _u32(code) + _u32(len(stdout)) + stdout + _u32(len(stderr)) + stderr


def encode_refusal() -> bytes:
    return MAGIC + REFUSED


def decode_reply(data: bytes) -> tuple[int, bytes, bytes] | None:
    """(status, stdout, stderr) of an answer; None for a refusal; FrameError otherwise."""
    if data == MAGIC + REFUSED:
        return None
    if not data.startswith(MAGIC + ANSWER) or len(data) < len(MAGIC) + 9:
        raise FrameError("not a fast-path answer")
    pos = len(MAGIC) + 1
    code = int.from_bytes(data[pos:pos + 4], "big")
    out_len = int.from_bytes(data[pos + 4:pos + 8], "big")
    pos += 8
    stdout = data[pos:pos + out_len]
    pos += out_len
    err_len = int.from_bytes(data[pos:pos + 4], "big")
    pos += 4
    if len(stdout) != out_len or len(data) != pos + err_len:
        raise FrameError("truncated fast-path answer")
    return code, stdout, data[pos:]

"""Configuration files as text: UTF-8 or a ConfigError naming the file, line and byte.

Python's own decode error names neither the file nor the line, and a start that ends
in it leaves the user guessing which of several files is at fault.
"""

from __future__ import annotations

from pathlib import Path

from istio_agent.config.errors import ConfigError


def non_utf8_problem(data: bytes) -> tuple[int, str] | None:
    """(line, description) of the first byte that is not UTF-8; None for valid text."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return line, f"not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})"
    return None


def utf8_text(data: bytes, source: str) -> str:
    problem = non_utf8_problem(data)
    if problem is not None:
        raise ConfigError(f"{source} line {problem[0]}: {problem[1]}")
    return data.decode("utf-8")


def read_text(path: Path, source: str) -> str:
    """The file's text; FileNotFoundError passes through (callers decide what missing means)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ConfigError(f"{source}: {exc.strerror}") from None
    return utf8_text(data, source)

"""Shared test plumbing.

`REQUIRE_ALL=1` (set by CI) turns every skip into a failure, so that a missing
tool or missing root privileges can never make the suite look greener than it is.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
CONFORMANCE = SHARED / "conformance"
VENV_BIN = ROOT / ".venv" / "bin"


def require_all() -> bool:
    return os.environ.get("REQUIRE_ALL", "") not in ("", "0", "false")


def need(condition: bool, reason: str) -> None:
    """Skip (or, under REQUIRE_ALL, fail) when a prerequisite is missing."""
    if condition:
        return
    if require_all():
        pytest.fail(f"REQUIRE_ALL=1 and a prerequisite is missing: {reason}")
    pytest.skip(reason)


def need_root() -> None:
    need(os.geteuid() == 0, "needs root (network namespaces, iptables)")


def need_tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")
    need(path is not None, f"needs the '{name}' tool on PATH")
    assert path is not None
    return path


def need_conformance(sub: str) -> Path:
    folder = CONFORMANCE / sub
    need(folder.is_dir(), f"conformance kit not found at {folder}")
    return folder


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if require_all() and report.skipped and call.when in ("setup", "call"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"skipped under REQUIRE_ALL=1: {reason}"

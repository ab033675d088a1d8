"""Shared test plumbing for every tier.

`REQUIRE_ALL=1` (set by CI) turns every skip into a failure, so that a missing
tool or missing root privileges can never make the suite look greener than it is.
The prerequisite checks live in `needs.py`, the processes in `launchers.py` and
`support.py`, the fixtures built on them in `fixtures.py` (each tier's
conftest.py exposes them): import from those, not from `conftest`, which is a
different module in each tier.
"""

from __future__ import annotations

import pytest
from needs import need, need_conformance, need_root, need_tool, require_all
from support import CONFORMANCE, ROOT, SHARED, VENV_BIN

# Still importable from here for tests not yet moved to `needs` / `support`.
__all__ = ["CONFORMANCE", "ROOT", "SHARED", "VENV_BIN", "need", "need_conformance", "need_root", "need_tool",
           "require_all"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if require_all() and report.skipped and call.when in ("setup", "call"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"skipped under REQUIRE_ALL=1: {reason}"

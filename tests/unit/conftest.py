"""The unit tier is pure: the guard in `unit_purity.py` fails any unit test that opens a socket,
starts a process or sleeps for real longer than 0.1 s."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from unit_purity import GUARD, guarded_event_loop


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
    """pytest-asyncio's loops for the unit tier measure their idle waits."""
    return {"guarded-loop": guarded_event_loop}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    if call.when == "call":
        item.stash[_CALL_FAILED] = outcome.get_result().failed


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def unit_purity(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    GUARD.test, GUARD.slept, GUARD.violations = request.node.nodeid, 0.0, []
    monkeypatch.setattr(time, "sleep", GUARD.sleep)
    GUARD.active = True
    try:
        yield
    finally:
        GUARD.active = False
    # A violation raised in the test already failed it; report here what it swallowed or only measured.
    if GUARD.violations and not request.node.stash.get(_CALL_FAILED, False):
        pytest.fail(GUARD.violations[0], pytrace=False)

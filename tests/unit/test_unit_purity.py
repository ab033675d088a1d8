"""The unit tier's guard itself: what it refuses, what it lets through."""

from __future__ import annotations

import socket

import pytest
from unit_purity import REAL_SLEEP_LIMIT, Guard, PurityViolation


def active_guard() -> Guard:
    guard = Guard()
    guard.active, guard.test = True, "test_example"
    return guard


@pytest.mark.parametrize("event", ["subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec", "os.system"])
def test_starting_a_process_is_refused(event: str) -> None:
    with pytest.raises(PurityViolation, match="started a process"):
        active_guard().audit(event, ("/bin/true",))


def test_internet_sockets_and_any_bind_or_connect_are_refused() -> None:
    guard = active_guard()
    with pytest.raises(PurityViolation, match="internet socket"):
        guard.audit("socket.__new__", (None, socket.AF_INET, socket.SOCK_STREAM, 0))
    with pytest.raises(PurityViolation, match=r"socket\.connect"):
        guard.audit("socket.connect", (None, "/run/some.sock"))
    guard.audit("socket.__new__", (None, socket.AF_UNIX, socket.SOCK_STREAM, 0))  # asyncio's self-pipe


def test_real_sleep_adds_up_to_the_limit() -> None:
    guard = active_guard()
    guard.sleep(REAL_SLEEP_LIMIT / 4)
    guard.idle(REAL_SLEEP_LIMIT / 4)
    assert guard.violations == []
    guard.idle(REAL_SLEEP_LIMIT)
    assert "waited" in guard.violations[0]
    with pytest.raises(PurityViolation, match="slept for real"):
        guard.sleep(0.001)


def test_an_inactive_guard_lets_everything_through() -> None:
    guard = Guard()
    guard.audit("subprocess.Popen", ("x",))
    guard.idle(10.0)
    guard.sleep(0.0)
    assert guard.violations == []

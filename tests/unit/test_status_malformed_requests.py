"""The status server's malformed-request log: every one counted, one line per interval."""

from __future__ import annotations

import logging

import pytest

from istio_agent.status.malformed_requests import MalformedRequestLog


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_counted_always_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock, counted = Clock(), []
    log = MalformedRequestLog(on_malformed=lambda: counted.append(1), clock=clock, interval=60.0)
    with caplog.at_level(logging.DEBUG):
        for second in range(0, 150, 5):
            clock.now = float(second)
            log("10.0.0.9", "Bad header\nx")
        log("10.0.0.9", "unsupported method 'GARBAGE'")
    lines = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(lines) == 3, lines  # at 0 s, 60 s and 120 s
    assert lines[0] == ("status server: 1 malformed request(s) answered 400 (latest from 10.0.0.9: Bad header); "
                        "at most one such line every 60s")
    assert lines[1].startswith("status server: 12 malformed")
    assert log.total == len(counted) == 31 and log.unreported == 6
    assert not any(r.exc_info for r in caplog.records), "no tracebacks"

"""The status server's malformed-request log: every one counted, one line per interval, the rest passed on."""

from __future__ import annotations

import logging

import pytest
from aiohttp.http_exceptions import BadHttpMessage, BadHttpMethod

from istio_agent.status.malformed_requests import MalformedRequestLog


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_counted_always_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock, counted = Clock(), []
    log = MalformedRequestLog(logging.getLogger("aiohttp.server"), on_malformed=lambda: counted.append(1),
                              clock=clock, interval=60.0)
    with caplog.at_level(logging.DEBUG):
        for second in range(0, 150, 5):
            clock.now = float(second)
            log.exception("Error handling request from %s", "10.0.0.9", exc_info=BadHttpMessage("Bad header\nx"))
        log.debug("Error handling request from %s", "10.0.0.9", exc_info=BadHttpMethod("GARBAGE"))
    lines = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(lines) == 3, lines  # at 0 s, 60 s and 120 s
    assert lines[0].startswith("status server: 1 malformed request(s) answered 400 (latest from 10.0.0.9: ")
    assert lines[1].startswith("status server: 12 malformed")
    assert log.total == len(counted) == 31 and log.unreported == 6
    assert not any(r.exc_info for r in caplog.records), "no tracebacks"


def test_other_errors_reach_aiohttps_logger(caplog: pytest.LogCaptureFixture) -> None:
    log = MalformedRequestLog(logging.getLogger("aiohttp.server"))
    with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
        try:
            raise RuntimeError("handler bug")
        except RuntimeError as exc:
            log.exception("Unhandled exception", exc_info=exc)
        log.debug("Ignored premature client disconnection")
        assert log.isEnabledFor(logging.DEBUG), "anything else is the real logger's"
    assert [r.getMessage() for r in caplog.records] == ["Unhandled exception",
                                                        "Ignored premature client disconnection"]
    assert log.total == 0

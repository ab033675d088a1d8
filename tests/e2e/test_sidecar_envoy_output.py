"""Envoy's output relay never stops draining the pipe, whatever Envoy prints.

Envoy writes its log to the pipe the agent reads; a line longer than the
reader's buffer used to end the relay task, after which the pipe filled and
Envoy blocked on its next log write (a rejected push naming thousands of
clusters makes such a line). A stand-in child prints over-long lines and then
a lot more; it must run to completion and the later lines must reach the log.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from istio_agent.envoy.process import OUTPUT_LINE_LIMIT, EnvoyProcess

CHILD = (
    "import sys\n"
    "out = sys.stdout\n"
    "out.write('a' * int(sys.argv[1]) + '\\n')\n"
    "out.write('b' * int(sys.argv[2]) + '\\n')\n"
    "out.write(('filler ' * 20 + '\\n') * 5000)\n"
    "out.write('last line\\n')\n"
)


@pytest.mark.parametrize("first,second", [(200_000, 10), (3 * OUTPUT_LINE_LIMIT, OUTPUT_LINE_LIMIT + 5)])
async def test_long_lines_do_not_stall_the_child(first: int, second: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="istio_agent.envoy.proc")
    exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def on_exit(code: int) -> None:
        if not exited.done():
            exited.set_result(code)

    process = EnvoyProcess([sys.executable, "-c", CHILD, str(first), str(second)], on_exit=on_exit)
    await process.start()
    try:
        assert await asyncio.wait_for(exited, 20) == 0
    finally:
        await process.stop(grace=2)
    messages = [record.getMessage() for record in caplog.records]
    assert "last line" in messages
    if first < OUTPUT_LINE_LIMIT:
        assert "a" * first in messages, "a long line under the limit is relayed whole"
    else:
        assert any("not relayed" in message for message in messages)

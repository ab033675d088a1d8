"""The pod-retrieval retry settings (not upstream): whole numbers only, and the fast path's deadline follows."""

from __future__ import annotations

import pytest

from istio_agent.cni.install.fastcalls import DEADLINE_SLACK, GET_TIMEOUT, call_deadline
from istio_agent.cni.plugin.add import RETRIES_ENV, retry_settings
from istio_agent.cni.plugin.protocol import CniError


@pytest.mark.parametrize("text", ["0", "-1", "two", "1.5", "²", "٣", " 3"])
def test_a_retry_count_that_is_not_a_plain_whole_number_is_refused(text: str) -> None:
    with pytest.raises(CniError, match=RETRIES_ENV):
        retry_settings({RETRIES_ENV: text})


def test_the_deadline_covers_every_retry_and_a_bad_setting_gets_the_slack_only() -> None:
    assert retry_settings({RETRIES_ENV: "3"})[0] == 3
    three = {RETRIES_ENV: "3", "ISTIO_CNI_POD_RETRIEVAL_INTERVAL": "1s"}
    assert call_deadline(three) == 3 * (1 + GET_TIMEOUT) + DEADLINE_SLACK
    assert call_deadline({RETRIES_ENV: "²"}) == DEADLINE_SLACK

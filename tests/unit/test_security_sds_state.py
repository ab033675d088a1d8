"""SDS subscription rules of one StreamSecrets stream (sans-IO)."""

from __future__ import annotations

import pytest

from istio_agent.security.core.sds_state import (
    MAX_NAMES_PER_REQUEST,
    NameSubscribers,
    SdsProtocolError,
    SubscriptionState,
)

NODE = "sidecar~10.0.0.1~pod.ns~ns.svc.cluster.local"


def started(names: list[str], nonce: str = "n1") -> SubscriptionState:
    state = SubscriptionState()
    assert state.on_request(names, "", None, NODE) == tuple(names)
    state.on_sent(nonce)
    return state


def test_first_request_gets_every_name() -> None:
    state = SubscriptionState()
    assert state.on_request(["default", "ROOTCA"], "", None, NODE) == ("default", "ROOTCA")
    assert state.watched == frozenset({"default", "ROOTCA"})


def test_duplicate_names_are_answered_once() -> None:
    state = SubscriptionState()
    assert state.on_request(["default", "default"], "", None, NODE) == ("default",)


def test_first_request_without_node_is_refused() -> None:
    with pytest.raises(SdsProtocolError, match="missing node"):
        SubscriptionState().on_request(["default"], "", None, "")


def test_later_requests_may_omit_the_node() -> None:
    state = started(["default"])
    assert state.on_request(["default"], "n1", None, "") == ()


def test_ack_gets_no_response() -> None:
    state = started(["default"])
    assert state.on_request(["default"], "n1", None, NODE) == ()
    assert state.nonce_acked == "n1"


def test_nack_gets_no_response_and_keeps_the_watch() -> None:
    state = started(["default"])
    assert state.on_request(["default", "extra"], "n1", "bad certificate", NODE) == ()
    assert state.last_error == "bad certificate"
    assert state.watched == frozenset({"default"})


def test_ack_clears_the_last_error() -> None:
    state = started(["default"])
    state.on_request(["default"], "n1", "bad", NODE)
    state.on_request(["default"], "n1", None, NODE)
    assert state.last_error == ""


def test_response_carries_only_newly_subscribed_names() -> None:
    state = started(["default"])
    assert state.on_request(["default", "ROOTCA", "file-root:/x"], "n1", None, NODE) == ("ROOTCA", "file-root:/x")
    assert state.watched == frozenset({"default", "ROOTCA", "file-root:/x"})


def test_removing_a_name_gets_no_response() -> None:
    state = started(["default", "ROOTCA"])
    assert state.on_request(["default"], "n1", None, NODE) == ()
    assert state.watched == frozenset({"default"})


def test_unsubscribe_gets_no_response_and_stops_pushes() -> None:
    state = started(["default"])
    assert state.on_request([], "n1", None, NODE) == ()
    assert state.watched is None
    assert state.on_push("default") == ()


def test_resubscribe_after_unsubscribe_gets_everything() -> None:
    state = started(["default"])
    state.on_request([], "n1", None, NODE)
    assert state.on_request(["default"], "n1", None, NODE) == ("default",)


def test_stale_nonce_is_ignored() -> None:
    state = started(["default"], nonce="n1")
    state.on_sent("n2")
    assert state.on_request(["default", "ROOTCA"], "n1", None, NODE) == ()
    assert state.watched == frozenset({"default"})


def test_request_without_nonce_restarts_the_watch() -> None:
    state = started(["default"])
    assert state.on_request(["ROOTCA"], "", None, NODE) == ("ROOTCA",)
    assert state.watched == frozenset({"ROOTCA"})


def test_push_goes_only_to_watchers_of_that_name() -> None:
    default_stream = started(["default"])
    root_stream = started(["ROOTCA"])
    assert default_stream.on_push("default") == ("default",)
    assert root_stream.on_push("default") == ()
    assert root_stream.on_push("ROOTCA") == ("ROOTCA",)


def test_push_before_any_request_is_not_sent() -> None:
    assert SubscriptionState().on_push("default") == ()


def test_a_request_naming_too_many_resources_is_refused() -> None:
    state = SubscriptionState()
    names = [f"file-root:/etc/{i}.pem" for i in range(MAX_NAMES_PER_REQUEST)]
    assert len(state.on_request(names, "", None, NODE)) == MAX_NAMES_PER_REQUEST
    with pytest.raises(SdsProtocolError, match=f"at most {MAX_NAMES_PER_REQUEST} resources; this one names 101"):
        state.on_request([*names, "default"], "", None, NODE)
    assert state.watched == frozenset(names), "the refused request changed nothing"


def test_name_subscribers_report_the_first_and_the_last() -> None:
    subscribers = NameSubscribers()
    assert subscribers.change(None, frozenset({"a", "b"})) == (["a", "b"], [])
    assert subscribers.change(None, frozenset({"b"})) == ([], []), "b already had a subscriber"
    assert subscribers.change(frozenset({"a", "b"}), frozenset({"b", "c"})) == (["c"], ["a"])
    assert subscribers.change(frozenset({"b", "c"}), None) == ([], ["c"])
    assert subscribers.change(frozenset({"b"}), frozenset()) == ([], ["b"])
    assert subscribers.counts == {}

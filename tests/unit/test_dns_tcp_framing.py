"""The sans-IO DNS-over-TCP framer: framing, back-pressure and deadlines, with `now` passed in.

Queries are real DNS messages built by dnspython (the independent oracle) and
parsed back by it; no sockets, no clock.
"""

from __future__ import annotations

import dns.message
import pytest
from hypothesis import given
from hypothesis import strategies as st

from istio_agent.dns.core.tcp_framing import MAX_MESSAGE, TcpFramer, frame

IDLE = 8.0


def query(n: int) -> bytes:
    q = dns.message.make_query(f"q{n}.example.test.", "A")
    q.id = n
    return q.to_wire()


def pull_all(framer: TcpFramer) -> list[bytes]:
    out = []
    while (msg := framer.next_message()) is not None:
        out.append(msg)
    return out


def test_frame_prefixes_the_length() -> None:
    msg = query(7)
    framed = frame(msg)
    assert framed[:2] == len(msg).to_bytes(2, "big")
    assert dns.message.from_wire(framed[2:]).id == 7
    assert frame(b"") == b"\x00\x00"
    assert len(frame(b"x" * MAX_MESSAGE)) == MAX_MESSAGE + 2
    with pytest.raises(ValueError, match="at most 65535"):
        frame(b"x" * (MAX_MESSAGE + 1))
    assert TcpFramer.frame is frame  # the adapter may use either


def test_frame_split_over_many_chunks() -> None:
    framer = TcpFramer(0.0, IDLE)
    framed = frame(query(1))
    for i, byte in enumerate(framed[:-1]):
        framer.receive_data(bytes([byte]), now=i * 0.01)
        assert framer.next_message() is None
    framer.receive_data(framed[-1:], now=1.0)
    msg = framer.next_message()
    assert msg is not None and dns.message.from_wire(msg).id == 1
    assert framer.next_message() is None
    assert framer.buffered == 0


def test_many_frames_in_one_chunk_come_out_in_order() -> None:
    framer = TcpFramer(0.0, IDLE)
    framer.receive_data(b"".join(frame(query(i)) for i in range(50)), now=0.5)
    assert [dns.message.from_wire(m).id for m in pull_all(framer)] == list(range(50))
    assert framer.buffered == 0


def test_zero_length_frame_is_an_empty_message() -> None:
    framer = TcpFramer(0.0, IDLE)
    framer.receive_data(b"\x00\x00" + frame(query(2)), now=0.0)
    assert framer.next_message() == b""  # the responder counts it as malformed
    msg = framer.next_message()
    assert msg is not None and dns.message.from_wire(msg).id == 2


def test_partial_frame_waits_for_the_rest() -> None:
    framer = TcpFramer(0.0, IDLE)
    body = b"y" * 48
    framed = (50).to_bytes(2, "big") + body[:8]  # 10 bytes of a 52-byte frame
    framer.receive_data(framed, now=1.0)
    assert framer.next_message() is None
    assert framer.buffered == 10
    framer.receive_data(b"z" * 2 + body[8:], now=2.0)
    assert framer.next_message() == body[:8] + b"zz" + body[8:]


def test_lone_length_byte_is_partial() -> None:
    framer = TcpFramer(0.0, IDLE)
    framer.receive_data(b"\x00", now=0.0)
    assert framer.next_message() is None
    framer.receive_data(b"\x01!", now=0.1)
    assert framer.next_message() == b"!"


@given(st.lists(st.binary(max_size=300), max_size=20), st.lists(st.integers(1, 64), min_size=1))
def test_any_split_of_a_stream_gives_the_same_messages(messages: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(m) for m in messages)
    framer = TcpFramer(0.0, IDLE)
    got: list[bytes] = []
    pos, i = 0, 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        framer.receive_data(stream[pos:pos + step], now=float(i))
        got += pull_all(framer)
        pos += step
        i += 1
    assert got == messages
    assert framer.buffered == 0


def test_idle_deadline_moves_with_activity() -> None:
    framer = TcpFramer(10.0, IDLE)
    assert framer.idle_deadline() == framer.deadline() == 18.0
    assert not framer.should_close(17.9)
    assert framer.should_close(18.0)
    framer.receive_data(frame(query(1)), now=15.0)
    pull_all(framer)
    assert framer.deadline() == 23.0
    assert not framer.should_close(18.0)
    framer.receive_data(b"\x00", now=20.0)  # part of a frame is activity too
    assert framer.deadline() == 28.0
    assert framer.partial_frame_deadline() is None  # off by default


def test_queries_in_flight_hold_off_the_idle_close() -> None:
    framer = TcpFramer(0.0, IDLE)
    framer.receive_data(frame(query(1)) + frame(query(2)), now=1.0)
    pull_all(framer)
    assert framer.forward_started() is False
    assert framer.forward_started() is False
    assert framer.inflight == 2
    assert framer.idle_deadline() is None and framer.deadline() is None
    assert not framer.should_close(1000.0)
    assert framer.forward_finished(now=30.0) is False
    assert framer.deadline() is None  # one still in flight
    assert framer.forward_finished(now=40.0) is False
    # Answers are not client activity: the idle clock still runs from the last bytes received,
    # so a connection idle for longer than the timeout closes as soon as nothing is in flight.
    assert framer.deadline() == 9.0
    assert framer.should_close(40.0)


def test_forward_finished_without_one_in_flight_is_a_bug() -> None:
    with pytest.raises(ValueError):
        TcpFramer(0.0, IDLE).forward_finished(now=1.0)


def test_too_many_forwards_hold_back_reading_until_half_are_answered() -> None:
    framer = TcpFramer(0.0, IDLE, max_inflight=4)
    framer.receive_data(b"".join(frame(query(i)) for i in range(10)), now=1.0)
    pulled = []
    while (msg := framer.next_message()) is not None:
        pulled.append(msg)
        if framer.forward_started():
            break
    assert len(pulled) == 4 and framer.reading_paused
    assert framer.next_message() is None  # six whole frames are buffered, but held back
    assert framer.forward_finished(now=2.0) is False  # 3 in flight
    assert framer.forward_finished(now=3.0) is False  # 2: not yet fewer than half
    assert framer.forward_finished(now=4.0) is True  # 1: resume reading
    assert not framer.reading_paused
    assert framer.idle_deadline() is None  # one still in flight
    assert framer.forward_finished(now=5.0) is False
    assert framer.idle_deadline() == 4.0 + IDLE  # resuming counted as activity
    assert [dns.message.from_wire(m).id for m in pull_all(framer)] == list(range(4, 10))


def test_partial_frame_deadline_when_enabled() -> None:
    framer = TcpFramer(0.0, IDLE, partial_frame_timeout=3.0)
    assert framer.partial_frame_deadline() is None
    framer.receive_data((50).to_bytes(2, "big") + b"x" * 8, now=1.0)  # 10 bytes of a 52-byte frame
    assert framer.next_message() is None
    assert framer.partial_frame_deadline() == 4.0
    assert framer.deadline() == 4.0  # before the idle deadline (9.0)
    framer.receive_data(b"x" * 10, now=2.0)  # trickling more of the same frame does not push it
    framer.receive_data(b"x" * 10, now=3.5)
    assert framer.next_message() is None
    assert framer.deadline() == 4.0
    assert not framer.should_close(3.9)
    assert framer.should_close(4.0)


def test_partial_frame_deadline_ends_with_the_frame_and_restarts_with_the_next() -> None:
    framer = TcpFramer(0.0, IDLE, partial_frame_timeout=3.0)
    framed = frame(query(1))
    framer.receive_data(framed[:5], now=1.0)
    assert framer.partial_frame_deadline() == 4.0
    # the rest of the frame and the start of the next one arrive together
    framer.receive_data(framed[5:] + frame(query(2))[:3], now=2.0)
    assert framer.partial_frame_deadline() is None  # a whole frame is waiting to be pulled
    msg = framer.next_message()
    assert msg is not None and dns.message.from_wire(msg).id == 1
    assert framer.next_message() is None
    assert framer.partial_frame_deadline() == 5.0  # the next frame began at 2.0
    framer.receive_data(frame(query(2))[3:], now=3.0)
    assert framer.next_message() is not None
    assert framer.partial_frame_deadline() is None
    assert framer.deadline() == 3.0 + IDLE


def test_partial_frame_deadline_applies_with_queries_in_flight() -> None:
    framer = TcpFramer(0.0, IDLE, partial_frame_timeout=3.0)
    framer.receive_data(frame(query(1)) + b"\x00\x30", now=1.0)
    assert framer.next_message() is not None
    framer.forward_started()
    assert framer.idle_deadline() is None
    assert framer.deadline() == 4.0  # a stalled frame is the client's doing, whatever is in flight


def test_partial_frame_clock_stops_while_reading_is_held_back() -> None:
    framer = TcpFramer(0.0, IDLE, partial_frame_timeout=3.0, max_inflight=2)
    framer.receive_data(frame(query(1)) + frame(query(2)) + b"\x00\x30abc", now=1.0)
    framer.next_message()
    framer.forward_started()
    framer.next_message()
    assert framer.forward_started() is True
    assert framer.partial_frame_deadline() is None  # we are not reading: the client cannot finish it
    framer.forward_finished(now=2.0)
    assert framer.forward_finished(now=6.0) is True
    assert framer.next_message() is None
    assert framer.partial_frame_deadline() == 9.0  # restarted when reading resumed


def test_partial_frame_deadline_is_off_by_default() -> None:
    framer = TcpFramer(0.0, IDLE)
    framer.receive_data(b"\xff\xff" + b"x" * 100, now=1.0)
    assert framer.next_message() is None
    assert framer.partial_frame_deadline() is None
    assert framer.deadline() == 1.0 + IDLE


def test_first_query_deadline_closes_a_silent_connection() -> None:
    framer = TcpFramer(10.0, IDLE, first_message_timeout=3.0)
    assert framer.first_message_deadline() == 13.0
    assert framer.deadline() == 13.0  # before the idle deadline (18.0)
    assert not framer.should_close(12.9)
    assert framer.should_close(13.0)


def test_first_query_deadline_is_not_pushed_by_dripping_bytes() -> None:
    framer = TcpFramer(0.0, IDLE, first_message_timeout=3.0)
    framed = frame(query(1))
    for i, byte in enumerate(framed[:-1]):  # one byte every 0.1 s: each is activity, none a query
        framer.receive_data(bytes([byte]), now=0.1 * i)
        assert framer.next_message() is None
        assert framer.deadline() == 3.0


def test_first_query_deadline_ends_with_the_first_whole_frame() -> None:
    framer = TcpFramer(0.0, IDLE, first_message_timeout=3.0, partial_frame_timeout=3.0)
    framer.receive_data(frame(query(1)), now=2.5)
    assert framer.first_message_deadline() == 3.0  # not yet: the frame is still to be pulled
    assert framer.next_message() is not None
    assert framer.first_message_deadline() is None
    assert framer.deadline() == 2.5 + IDLE  # from now on, the idle rule between queries
    framer.receive_data(b"\x00", now=4.0)
    assert framer.deadline() == 7.0  # and the partial-frame rule for the next one


def test_first_query_deadline_counts_an_empty_frame() -> None:
    """The framer judges framing, not content: a zero-length frame is a whole one (the responder drops it)."""
    framer = TcpFramer(0.0, IDLE, first_message_timeout=3.0)
    framer.receive_data(b"\x00\x00", now=1.0)
    assert framer.next_message() == b""
    assert framer.first_message_deadline() is None


def test_first_query_deadline_is_off_by_default() -> None:
    framer = TcpFramer(0.0, IDLE)
    assert framer.first_message_deadline() is None
    assert framer.deadline() == IDLE

"""DNS over TCP (RFC 7766) without I/O: length-prefixed framing, in-flight accounting, deadlines.

Each DNS message on a TCP stream is preceded by its length as two bytes,
big-endian, and a client may pipeline many queries before reading any answer.
`TcpFramer` is the state of one such connection as a small machine in h11's
style: the adapter feeds it the bytes it read (`receive_data`), pulls complete
queries out one at a time (`next_message`), tells it when a forwarded query
starts and finishes, and asks it when the connection should be closed
(`deadline`, `should_close`). Time is always passed in, so every rule here is
tested without sockets or clocks.

Queries are pulled rather than returned in a batch because the decision to
stop reading is made between two queries: after a query is forwarded, the
framer may hold the rest of the buffer back (`reading_paused`) until enough
forwarded answers came back, exactly where the adapter stops reading the
socket.

Deadlines:

* idle: `idle_timeout` after the last activity (bytes received, or reading
  resumed after back-pressure), but only while no forwarded query is in
  flight: a client waiting for a slow upstream is not idle;
* partial frame (off unless `partial_frame_timeout` is given): a frame whose
  first bytes arrived but which is still incomplete that long after is given
  up, however slowly its remaining bytes trickle in. It does not run while the
  framer holds reading back, since the client cannot send then;
* first query (off unless `first_message_timeout` is given): a connection
  that has not delivered one complete frame that long after it was accepted
  is given up, whether it sent nothing or trickled bytes. Without it, a client
  that connects and stays silent keeps its slot for the whole idle timeout,
  and a first byte sent just before each idle deadline would keep it forever.
  Any whole frame counts (the framer does not judge its content); from then
  on the idle and partial-frame deadlines apply as for every later query.
"""

from __future__ import annotations

MAX_MESSAGE = 0xFFFF  # the largest length the 2-byte prefix can carry


def frame(message: bytes) -> bytes:
    """`message` with its 2-byte length prefix, ready to write to the stream."""
    size = len(message)
    if size > MAX_MESSAGE:
        raise ValueError(f"a DNS message over TCP is at most {MAX_MESSAGE} bytes, got {size}")
    return size.to_bytes(2, "big") + message


class TcpFramer:
    """One DNS-over-TCP connection's framing and timing state (no I/O, time passed in)."""

    frame = staticmethod(frame)

    def __init__(self, now: float, idle_timeout: float, *, partial_frame_timeout: float | None = None,
                 first_message_timeout: float | None = None, max_inflight: int = 64) -> None:
        """`now`: when the connection was accepted (the idle and first-query clocks start there).

        `max_inflight`: forwarded queries in flight at which the framer stops
        handing out queries; it resumes once fewer than half that many remain.
        """
        if max_inflight < 1:
            raise ValueError("max_inflight must be at least 1")
        self.idle_timeout = idle_timeout
        self.partial_frame_timeout = partial_frame_timeout
        self.max_inflight = max_inflight
        self._buf = bytearray()
        self._pos = 0  # start of the bytes not yet handed out
        self._last_activity = now
        self._last_received = now
        self._partial_since: float | None = None  # when the incomplete frame at the head began
        # Until the first whole frame is handed out: when the connection must have delivered one.
        self._first_due: float | None = None if first_message_timeout is None else now + first_message_timeout
        self._inflight = 0
        self._paused = False

    # ---- input -----------------------------------------------------------------------------

    def receive_data(self, data: bytes, now: float) -> None:
        """Buffer bytes read from the stream at `now`; pull the queries with `next_message()`."""
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data
        self._last_activity = now
        self._last_received = now
        if self.partial_frame_timeout is not None:
            self._track_partial(now)

    def next_message(self) -> bytes | None:
        """The next complete query (possibly empty), or None: no whole frame yet, or reading held back."""
        if self._paused:
            return None
        buf = self._buf
        pos = self._pos
        if len(buf) - pos >= 2:
            end = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
            if len(buf) >= end:
                message = bytes(buf[pos + 2:end])
                self._pos = end
                self._first_due = None
                if self.partial_frame_timeout is not None:
                    # What is left arrived no later than the last read: a new partial frame starts then.
                    self._track_partial(self._last_received)
                return message
        if pos:
            del buf[:pos]
            self._pos = 0
        return None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out as queries."""
        return len(self._buf) - self._pos

    # ---- forwarded queries -----------------------------------------------------------------

    @property
    def inflight(self) -> int:
        """Forwarded queries whose answers have not been written yet."""
        return self._inflight

    @property
    def reading_paused(self) -> bool:
        """True while too many forwarded queries are in flight to take more from this client."""
        return self._paused

    def forward_started(self) -> bool:
        """A query pulled from this connection went upstream. True: stop reading the socket now."""
        self._inflight += 1
        if self._inflight >= self.max_inflight and not self._paused:
            self._paused = True
            self._partial_since = None
            return True
        return False

    def forward_finished(self, now: float) -> bool:
        """A forwarded query's answer was written (or given up). True: resume reading and pull again."""
        if self._inflight == 0:
            raise ValueError("forward_finished() without a forwarded query in flight")
        self._inflight -= 1
        if self._paused and self._inflight < self.max_inflight // 2:
            self._paused = False
            self._last_activity = now
            if self.partial_frame_timeout is not None:
                self._track_partial(now)
            return True
        return False

    # ---- deadlines -------------------------------------------------------------------------

    def idle_deadline(self) -> float | None:
        """When an idle connection should be closed; None while forwarded queries are in flight."""
        if self._inflight:
            return None
        return self._last_activity + self.idle_timeout

    def partial_frame_deadline(self) -> float | None:
        """When to give up on the incomplete frame being received; None without one (or when off)."""
        if self._partial_since is None or self.partial_frame_timeout is None:
            return None
        return self._partial_since + self.partial_frame_timeout

    def first_message_deadline(self) -> float | None:
        """When to give up on a connection that has not delivered its first whole frame; None after it
        (or when off)."""
        return self._first_due

    def deadline(self) -> float | None:
        """The earliest time the connection should be closed, None when nothing is due.

        The adapter arms one timer for it and asks again (and re-arms) whenever
        it fires or an event may have brought the deadline forward.
        """
        due = self.idle_deadline()
        for other in (self.partial_frame_deadline(), self._first_due):
            if other is not None and (due is None or other < due):
                due = other
        return due

    def should_close(self, now: float) -> bool:
        """Whether the connection is due to be closed at `now`."""
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    # ---- internals -------------------------------------------------------------------------

    def _track_partial(self, started: float) -> None:
        """Start, keep or stop the partial-frame clock after the buffer or the pause changed."""
        buf = self._buf
        pos = self._pos
        available = len(buf) - pos
        if self._paused or available == 0 or (
                available >= 2 and available >= 2 + ((buf[pos] << 8) | buf[pos + 1])):
            self._partial_since = None  # nothing pending, a whole frame waiting, or we are not reading
        elif self._partial_since is None:
            self._partial_since = started

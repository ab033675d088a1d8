"""Who may hold one of the proxy's DNS-over-TCP connection slots, without I/O.

The proxy keeps at most `max_connections` TCP connections open (each one is a
socket, a buffer and a timer). A plain cap that refuses every newcomer once
full lets one client hold all the slots with connections it never uses (see
the deadlines in `tcp_framing`, which bound how long one such connection
lives, but not how fast it is replaced), and every real query is then reset.
So the slots are shared by two rules, decided here with time passed in:

* **per source**: one client address holds at most `max_per_source`
  connections. A newcomer from a source at its limit takes the place of that
  source's own longest-idle connection, so a client flooding us only ever
  competes with itself;
* **global**: when all `max_connections` slots are taken, a newcomer takes
  the place of the longest-idle connection of any source.

"Idle" is ordered by the last activity reported (`touch`: bytes received, an
answer written); a connection with a forwarded query in flight (`set_busy`)
is never chosen, since its client is waiting on us, not holding a slot for
nothing. Only when every candidate is busy is the newcomer refused. A
newcomer is never refused in favour of an idle connection: the one that just
connected is the one most likely to send a query now.

`ConnectionTable.admit` returns the decision; the adapter closes the evicted
connection and the refused newcomer. Connections are opaque keys (the adapter
uses its protocol objects); sources are whatever identifies a client (the
peer's IP address, not its port).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Admission(Generic[C]):
    """The decision on one newcomer: whether it is admitted, and which connection to close for it."""

    admitted: bool
    evict: C | None = None  # already removed from the table; the caller closes it


@dataclass(slots=True)
class _Entry:
    source: Hashable
    last_active: float
    busy: bool = False


class ConnectionTable(Generic[C]):
    """The open connections, in order of last activity, per source and overall.

    `now` values come from one monotonic clock and never decrease, so keeping
    each ordering by moving a touched connection to the end is the same as
    sorting by last activity, at O(1) per touch. Finding a victim walks from
    the least recently active end past busy connections only.
    """

    def __init__(self, max_connections: int, max_per_source: int) -> None:
        if max_connections < 1 or max_per_source < 1:
            raise ValueError("connection limits must be at least 1")
        self.max_connections = max_connections
        self.max_per_source = min(max_per_source, max_connections)
        self._all: OrderedDict[C, _Entry] = OrderedDict()
        self._by_source: dict[Hashable, OrderedDict[C, None]] = {}
        self.evicted = 0  # connections closed to make room for a newcomer
        self.refused = 0  # newcomers turned away: every candidate had a query in flight

    # ---- the decision ----------------------------------------------------------------------

    def admit(self, conn: C, source: Hashable, now: float) -> Admission[C]:
        """Decide on `conn`, just accepted from `source` at `now`; an admitted one is in the table."""
        if conn in self._all:
            raise ValueError("connection admitted twice")
        victim: C | None = None
        peers = self._by_source.get(source)
        if peers is not None and len(peers) >= self.max_per_source:
            victim = self._longest_idle(peers)
            if victim is None:
                return self._refuse()
        elif len(self._all) >= self.max_connections:
            victim = self._longest_idle(self._all)
            if victim is None:
                return self._refuse()
        if victim is not None:
            self.remove(victim)
            self.evicted += 1
        self._all[conn] = _Entry(source, now)
        self._by_source.setdefault(source, OrderedDict())[conn] = None
        return Admission(True, victim)

    def _refuse(self) -> Admission[C]:
        self.refused += 1
        return Admission(False)

    def _longest_idle(self, ordered: OrderedDict[C, _Entry] | OrderedDict[C, None]) -> C | None:
        entries = self._all
        for conn in ordered:
            if not entries[conn].busy:
                return conn
        return None

    # ---- what the adapter reports ----------------------------------------------------------

    def touch(self, conn: C, now: float) -> None:
        """`conn` was active at `now` (received bytes, or an answer went out): least likely to go."""
        entry = self._all.get(conn)
        if entry is None:
            return
        entry.last_active = now
        self._all.move_to_end(conn)
        self._by_source[entry.source].move_to_end(conn)

    def set_busy(self, conn: C, busy: bool) -> None:
        """Whether `conn` has forwarded queries in flight (then it is never evicted)."""
        entry = self._all.get(conn)
        if entry is not None:
            entry.busy = busy

    def remove(self, conn: C) -> None:
        """`conn` is gone (closed by either side); a connection not in the table is ignored."""
        entry = self._all.pop(conn, None)
        if entry is None:
            return
        peers = self._by_source[entry.source]
        del peers[conn]
        if not peers:
            del self._by_source[entry.source]

    # ---- views -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._all)

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._all))

    def __contains__(self, conn: object) -> bool:
        return conn in self._all

    def count(self, source: Hashable) -> int:
        """Connections `source` holds now."""
        peers = self._by_source.get(source)
        return 0 if peers is None else len(peers)

    def idle_since(self, conn: C) -> float | None:
        """When `conn` was last active, None when it is not in the table."""
        entry = self._all.get(conn)
        return None if entry is None else entry.last_active

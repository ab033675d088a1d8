"""Which connections an HTTP server keeps when clients open more than it has room for (sans-IO).

A port that any pod can reach must not let one client hold every connection
slot with connections that never complete a request (a slow drip, a TLS
handshake left half done). Two rules share the slots:

* **per source**: one client address holds at most `max_per_source`
  connections; a newcomer from a source at its limit takes the place of that
  source's own longest-unused connection, so a client that floods the port
  competes only with itself;
* **global**: when all `max_connections` slots are taken, a newcomer takes the
  place of the longest-unused connection of the source holding the most.

"Unused" is ordered by the last request a connection completed (its admission
when it has completed none), not by the bytes it sent: a client dripping a
request one byte at a time never looks fresh. A connection whose request is
being answered (`set_busy`: a handler running, a response or a watch being
streamed) is never chosen; when every candidate is busy the newcomer is
refused.

`ConnectionSlots.admit` returns the decision; the server closes the evicted
connection and the refused newcomer. Connections are opaque keys; sources are
whatever identifies a client (the peer's IP address, not its port).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Admission(Generic[C]):
    """The decision on one newcomer: whether it is admitted, and which connection to close for it."""

    admitted: bool
    evict: C | None = None  # already removed from the slots; the caller closes it


class ConnectionSlots(Generic[C]):
    """The open connections, least recently used first, per source and overall."""

    def __init__(self, max_connections: int, max_per_source: int) -> None:
        if max_connections < 1 or max_per_source < 1:
            raise ValueError("connection limits must be at least 1")
        self.max_connections = max_connections
        self.max_per_source = min(max_per_source, max_connections)
        self._sources: dict[C, Hashable] = {}
        self._busy: set[C] = set()
        self._by_source: dict[Hashable, OrderedDict[C, None]] = {}
        self.evicted = 0
        self.refused = 0

    def admit(self, conn: C, source: Hashable) -> Admission[C]:
        """Decide on `conn`, just accepted from `source`; an admitted one holds a slot."""
        if conn in self._sources:
            raise ValueError("connection admitted twice")
        victim: C | None = None
        peers = self._by_source.get(source)
        if peers is not None and len(peers) >= self.max_per_source:
            victim = self._least_used(peers)
        elif len(self._sources) >= self.max_connections:
            for _, crowded in sorted(self._by_source.items(), key=lambda item: -len(item[1])):
                victim = self._least_used(crowded)
                if victim is not None:
                    break
        else:
            return self._take(conn, source, None)
        if victim is None:
            self.refused += 1
            return Admission(False)
        self.remove(victim)
        self.evicted += 1
        return self._take(conn, source, victim)

    def _take(self, conn: C, source: Hashable, victim: C | None) -> Admission[C]:
        self._sources[conn] = source
        self._by_source.setdefault(source, OrderedDict())[conn] = None
        return Admission(True, victim)

    def _least_used(self, peers: OrderedDict[C, None]) -> C | None:
        return next((conn for conn in peers if conn not in self._busy), None)

    def set_busy(self, conn: C, busy: bool) -> None:
        """Whether a request of `conn` is being answered (then it is never evicted)."""
        if conn not in self._sources:
            return
        if busy:
            self._busy.add(conn)
        else:
            self._busy.discard(conn)

    def served(self, conn: C) -> None:
        """`conn` completed a request: it becomes the last of its source to give way."""
        source = self._sources.get(conn)
        if source is not None:
            self._by_source[source].move_to_end(conn)

    def remove(self, conn: C) -> None:
        """`conn` is gone; one not held is ignored."""
        source = self._sources.pop(conn, None)
        if source is None:
            return
        self._busy.discard(conn)
        peers = self._by_source[source]
        del peers[conn]
        if not peers:
            del self._by_source[source]

    def __len__(self) -> int:
        return len(self._sources)

    def count(self, source: Hashable) -> int:
        peers = self._by_source.get(source)
        return 0 if peers is None else len(peers)

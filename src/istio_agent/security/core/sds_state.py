"""SDS subscription rules for one StreamSecrets stream, with no I/O.

Upstream's agent answers SotW SDS with these rules (pkg/xds ShouldRespond):
- the first request must name the node;
- a request carrying `error_detail` is a NACK: remember it, answer nothing;
- an empty name list unsubscribes: forget the watch, answer nothing;
- a request with no nonce (or after an unsubscribe) starts a watch: answer every name;
- a request whose nonce is not the last one sent is stale: answer nothing;
- otherwise it ACKs: answer only the names it newly added (none → pure ACK);
- a push (rotation, file change) goes out only if this stream watches that name.

One rule is ours: a request may name at most `MAX_NAMES_PER_REQUEST` (100)
resources. Envoy asks for one name per stream; the bound keeps one caller from
making the agent load and watch an unbounded number of files. `NameSubscribers`
counts, across all streams, who watches each name, so that the cache hears when
a name's first subscriber comes and its last one goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MAX_NAMES_PER_REQUEST = 100


class SdsProtocolError(Exception):
    """The client broke the protocol (for example no node on the first request)."""


def _unique(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


@dataclass
class SubscriptionState:
    """What one stream watches and which response it last saw; each method returns the names to send."""

    watched: frozenset[str] | None = None
    nonce_sent: str = ""
    nonce_acked: str = ""
    last_error: str = ""
    node_id: str = ""
    requests: int = field(default=0)
    expired_nonces: int = 0  # requests answering a nonce older than the last one sent

    def on_request(
        self, names: Sequence[str], response_nonce: str, error_message: str | None, node_id: str = ""
    ) -> tuple[str, ...]:
        """Apply one DiscoveryRequest; `error_message` is None unless it carries `error_detail`."""
        self.requests += 1
        if not self.node_id:
            if not node_id:
                raise SdsProtocolError("missing node information")
            self.node_id = node_id
        if len(names) > MAX_NAMES_PER_REQUEST:
            raise SdsProtocolError(
                f"a request may name at most {MAX_NAMES_PER_REQUEST} resources; this one names {len(names)}")
        if error_message is not None:
            self.last_error = error_message
            return ()
        if not names:
            self.watched = None
            return ()
        wanted = _unique(names)
        if not response_nonce or self.watched is None:
            self.watched = frozenset(wanted)
            return wanted
        if response_nonce != self.nonce_sent:
            self.expired_nonces += 1
            return ()
        previous = self.watched
        self.watched = frozenset(wanted)
        self.nonce_acked = response_nonce
        self.last_error = ""
        return tuple(name for name in wanted if name not in previous)

    def on_push(self, name: str) -> tuple[str, ...]:
        """A secret changed: send it only if this stream watches it."""
        if self.watched is not None and name in self.watched:
            return (name,)
        return ()

    def on_sent(self, nonce: str) -> None:
        self.nonce_sent = nonce


@dataclass
class NameSubscribers:
    """How many streams watch each name, server-wide."""

    counts: dict[str, int] = field(default_factory=dict)

    def change(self, before: frozenset[str] | None, after: frozenset[str] | None) -> tuple[list[str], list[str]]:
        """One stream's watch set went from `before` to `after`: (names now first watched, names no longer watched)."""
        old, new = before or frozenset(), after or frozenset()
        first: list[str] = []
        gone: list[str] = []
        for name in sorted(new - old):
            self.counts[name] = self.counts.get(name, 0) + 1
            if self.counts[name] == 1:
                first.append(name)
        for name in sorted(old - new):
            left = self.counts.get(name, 0) - 1
            if left > 0:
                self.counts[name] = left
            else:
                self.counts.pop(name, None)
                gone.append(name)
        return first, gone

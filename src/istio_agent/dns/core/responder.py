"""What to do with one incoming DNS message: answer it, forward it, or drop it.

Sans-IO: `Responder.respond(data, tcp, counts)` returns the bytes to send back,
an `AskUpstream` (the decision to ask the upstream resolvers), or None (send
nothing). It never blocks and never raises on any input.

The fast path handles the shape nearly every stub resolver sends (one
question in lower case, opcode QUERY, optionally one OPT record) for a name in
the compiled table with a single dictionary lookup. Everything else takes the
slow path, which validates the whole message and decides like upstream's
miekg/dns-based server: a header its accept function refuses (an opcode but
QUERY and NOTIFY, other counts than one question) -> NOTIMP or FORMERR on the
header alone (`wire.accept_rejection`); malformed -> FORMERR (or dropped when
it has no header or is a response); a bare header claiming one question ->
SERVFAIL (miekg passes it on with no question); no table yet -> SERVFAIL. A
NOTIFY is handled as a query (miekg's server accepts both; the reply keeps the
opcode and copies RD and CD only for a QUERY, as its SetReply). A name spelled
with capitals is answered with lower-case owners, as upstream writes them. The
EDNS version is not checked (miekg's server leaves that to the handler, and
upstream's does not look): a version-1 query is answered or forwarded as a
version-0 one.
"""

from __future__ import annotations

from istio_agent.dns.core import wire
from istio_agent.dns.core.answers import CompiledTable, Prepared

# Outcome indexes into a counts list (see metrics.Counts).
LOCAL = 0
FORWARDED = 1
FAILED = 2
MALFORMED = 3

_ONE_QUESTION = b"\x00\x01\x00\x00\x00\x00"  # QDCOUNT=1, ANCOUNT=0, NSCOUNT=0
_NO_ADDITIONAL = b"\x00\x00"
_ONE_ADDITIONAL = b"\x00\x01"
_OPT_TYPE = b"\x00\x29"
_OPT_PLAIN = wire.opt_record(False)
_OPT_DO = wire.opt_record(True)


class AskUpstream:
    """Decision: ask the upstream resolvers (from resolv.conf); reply to the client within `limit` bytes.

    Named for what it asks of the I/O edge, so it is not confused with the XDS
    proxy's decision to send a message on to Envoy.
    """

    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def __repr__(self) -> str:
        return f"AskUpstream(limit={self.limit})"


class Responder:
    """Holds the current compiled table; swapping `table` is atomic for readers on any thread."""

    def __init__(self, respond_before_sync: bool = False) -> None:
        self.table: CompiledTable | None = None
        self.respond_before_sync = respond_before_sync

    def respond(self, data: bytes, tcp: bool, counts: list[int]) -> bytes | AskUpstream | None:
        table = self.table
        if table is not None and data[4:10] == _ONE_QUESTION and not data[2] & 0xF8:
            end = data.find(0, 12) + 5
            question = data[12:end]
            entry = table.answers.get(question)
            if entry is not None:
                arcount = data[10:12]
                size = len(data)
                if arcount == _NO_ADDITIONAL:
                    if size == end:
                        resp = (data[:2] + entry.plain[(data[2] & 0x01) | (data[3] & 0x10)] + question
                                + entry.bodies[data[1] % entry.variants])
                        if tcp or len(resp) <= wire.MIN_UDP_SIZE:
                            counts[LOCAL] += 1
                            return resp
                elif (arcount == _ONE_ADDITIONAL and size >= end + 11 and data[end] == 0
                      and data[end + 1:end + 3] == _OPT_TYPE and data[end + 6] == 0
                      and _options_end(data, end + 11) == size
                      and (data[end + 9] << 8 | data[end + 10]) == size - end - 11):
                    resp = (data[:2] + entry.edns[(data[2] & 0x01) | (data[3] & 0x10)] + question
                            + entry.bodies[data[1] % entry.variants]
                            + (_OPT_DO if data[end + 7] & 0x80 else _OPT_PLAIN))
                    if tcp or len(resp) <= max(wire.MIN_UDP_SIZE, data[end + 3] << 8 | data[end + 4]):
                        counts[LOCAL] += 1
                        return resp
        return self._slow(data, tcp, counts)

    def _slow(self, data: bytes, tcp: bool, counts: list[int]) -> bytes | AskUpstream | None:
        if len(data) < 12 or data[2] & 0x80:
            counts[MALFORMED] += 1
            return None
        rejected = wire.accept_rejection(data)
        if rejected is not None:
            counts[MALFORMED] += 1
            return rejected
        if wire.is_header_only_query(data):
            counts[FAILED] += 1
            return wire.header_reply(data, wire.RCODE_SERVFAIL)
        try:
            query = wire.parse_query(data)
        except wire.WireError:
            counts[MALFORMED] += 1
            return wire.formerr(data)
        if query.qdcount != 1:  # cannot be: accept_rejection refused it
            counts[MALFORMED] += 1
            return wire.error_reply(data, query, wire.RCODE_FORMERR)
        limit = wire.MAX_MSG_SIZE if tcp else query.udp_limit
        table = self.table
        if table is None:
            if self.respond_before_sync:
                return AskUpstream(limit)
            counts[FAILED] += 1
            return wire.error_reply(data, query, wire.RCODE_SERVFAIL)
        # Upstream ignores the class: a known name answers IN records for any class.
        entry = table.find(query.qname, query.qtype)
        if entry is None:
            return AskUpstream(limit)
        if query.question[:len(query.qname)] != query.qname:  # spelled with capitals
            entry = table.find_spelled(query.qname, query.qtype)
            if entry is None:  # cannot be: find() matched the same name
                return AskUpstream(limit)
        counts[LOCAL] += 1
        return wire.fit(build_reply(data, query, entry), limit)


def build_reply(data: bytes, query: wire.Query, entry: Prepared) -> bytes:
    """The full (untruncated) local answer for a validated query."""
    query_opcode = query.opcode == wire.OPCODE_QUERY
    index = (data[2] & 0x01) | (data[3] & 0x10) if query_opcode else 0
    header = (entry.plain if query.edns is None else entry.edns)[index]
    if not query_opcode:  # a NOTIFY: the reply keeps its opcode
        header = bytes((header[0] | query.opcode << 3,)) + header[1:]
    body = entry.bodies[data[1] % entry.variants]
    if query.edns is None:
        return data[:2] + header + query.question + body
    return data[:2] + header + query.question + body + (_OPT_DO if query.edns.do else _OPT_PLAIN)


def _options_end(data: bytes, off: int) -> int:
    """Offset after the EDNS options starting at `off` (walks code/length pairs)."""
    size = len(data)
    while off + 4 <= size:
        off += 4 + (data[off + 2] << 8 | data[off + 3])
    return off if off <= size else -1

"""Ready-to-send answers, keyed by the raw question bytes.

A known-name query must cost a dictionary lookup and a few byte copies, so
an answer is packed once per NameTable, on the name's first query, and kept
for as long as the table serves (a pod asks for a few of a mesh's names; packing
every name up front held ~1 MB per 1,000 services that were never asked for,
twice while a new table replaced the old). The key is the question as it
appears on the wire after the header, `qname + qtype + qclass`, with the name
in lower case: the form stub resolvers send, so their queries hit it as they
come.

Answer sections are built for a question at offset 12: owner names that are
the question become the pointer 0xC00C. Upstream writes owners in lower case
whatever the client's spelling (only the question section echoes it), so a
question spelled with capitals is answered from `find_spelled()`, which
writes the lower-case owner out instead. A/AAAA order is shuffled for DNS
load balancing (as upstream does) by packing a few orderings up front; the
query id picks one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from istio_agent.dns.core import wire
from istio_agent.dns.core.table import TTL, Lookup, Record, match, records, resolve
from istio_agent.protos import nds_pb2

MAX_VARIANTS = 8  # orderings packed per multi-address answer
DYNAMIC_LIMIT = 10_000  # wildcard answers cached per table
_IN = wire.CLASS_IN.to_bytes(2, "big")
_RR_TAIL = _IN + TTL.to_bytes(4, "big")


@dataclass(frozen=True, slots=True)
class Prepared:
    """Everything after the id for one question: header variants and answer sections.

    `plain[i]`/`edns[i]` are the 10 header bytes after the id for a query without /
    with an OPT record, indexed by `(flags byte 2 & 0x01) | (flags byte 3 & 0x10)`,
    i.e. by the RD and CD bits the reply copies.
    """

    plain: tuple[bytes, ...]
    edns: tuple[bytes, ...]
    bodies: tuple[bytes, ...]
    variants: int


_HEADER_CACHE: dict[int, tuple[tuple[bytes, ...], tuple[bytes, ...]]] = {}


def _headers(ancount: int) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    cached = _HEADER_CACHE.get(ancount)
    if cached is not None:
        return cached
    plain: list[bytes] = []
    edns: list[bytes] = []
    for index in range(0x12):
        rd, cd = index & 0x01, index & 0x10
        flags = bytes((0x84 | rd, cd))  # QR + AA (+RD), opcode QUERY, NOERROR (+CD)
        counts = b"\x00\x01" + ancount.to_bytes(2, "big") + b"\x00\x00"
        plain.append(flags + counts + b"\x00\x00")
        edns.append(flags + counts + b"\x00\x01")
    result = (tuple(plain), tuple(edns))
    _HEADER_CACHE[ancount] = result
    return result


def pack_records(qname: bytes, question_len: int, recs: Sequence[Record], echo: bool = True) -> bytes:
    """Answer section for a question of `question_len` bytes (name + type + class) at offset 12.

    With `echo`, owner names equal to `qname` point at the question (its bytes
    are `qname`); otherwise `qname` is written out where it first appears, for
    a question the client spelled with capitals, since upstream's owners are
    lower case.
    """
    base = 12 + question_len
    out = bytearray()
    offsets: dict[bytes, int] = {qname: 12} if echo else {}

    def name_ref(name: bytes, at: int) -> bytes:
        known = offsets.get(name)
        if known is not None:
            return (0xC000 | known).to_bytes(2, "big")
        if at < 0x4000:  # a pointer reaches only this far
            offsets[name] = at
        return name

    for rec in recs:
        out += name_ref(rec.owner, base + len(out))
        out += rec.rtype.to_bytes(2, "big") + _RR_TAIL
        rdata = name_ref(rec.data, base + len(out) + 2) if rec.rtype == wire.TYPE_CNAME else rec.data
        out += len(rdata).to_bytes(2, "big") + rdata
    return bytes(out)


def _orderings(recs: list[Record], rng: random.Random) -> list[list[Record]]:
    """A few orderings of the address records, CNAMEs kept first (as upstream's round robin)."""
    head = [r for r in recs if r.rtype == wire.TYPE_CNAME]
    addrs = [r for r in recs if r.rtype != wire.TYPE_CNAME]
    n = len(addrs)
    if n <= 1:
        return [recs]
    if n <= MAX_VARIANTS:
        return [head + addrs[i:] + addrs[:i] for i in range(n)]
    out = [head + addrs]
    for _ in range(MAX_VARIANTS - 1):
        shuffled = addrs[:]
        rng.shuffle(shuffled)
        out.append(head + shuffled)
    return out


def prepare(qname: bytes, question_len: int, recs: list[Record], rng: random.Random, echo: bool = True) -> Prepared:
    bodies = tuple(pack_records(qname, question_len, order, echo) for order in _orderings(recs, rng))
    plain, edns = _headers(len(recs))
    return Prepared(plain=plain, edns=edns, bodies=bodies, variants=len(bodies))


class CompiledTable:
    """One NameTable compiled for answering.

    Answers are packed on a name's first query (the slow path), keyed by the
    lower-case question, and kept: names with addresses and search-expanded
    (CNAME) names for as long as the table serves (at most two per name),
    wildcard matches up to DYNAMIC_LIMIT. Compiling is then only the lookup's
    maps, and a name costs one slow-path query per table. `answers` is only
    ever added to (never changed), so readers on other threads see either no
    entry or a complete one.
    """

    def __init__(self, source: nds_pb2.NameTable, lookup: Lookup, seed: int | None = None) -> None:
        # The table as its wire bytes, parsed again only when asked (/debug/ndsz, a restart): the parsed
        # message held ~4.5 times as much (1,000 services: 350 KB against 75 KB).
        self._source = source.SerializeToString()
        self.lookup = lookup
        self._rng = random.Random(seed)
        self.answers: dict[bytes, Prepared] = {}
        self._dynamic = 0
        self._shared: dict[tuple[object, ...], Prepared] = {}

    @property
    def source(self) -> nds_pb2.NameTable:
        """The NameTable this was compiled from (a new message each time)."""
        return nds_pb2.NameTable.FromString(self._source)

    def _prepare(self, name: bytes, question_len: int, qtype: int) -> Prepared:
        recs = records(self.lookup, name, name, qtype)
        assert recs is not None
        # Answers that own no name but the question are shared across names; a CNAME
        # answer's pointers depend only on the question's length.
        if not recs or recs[0].rtype != wire.TYPE_CNAME:
            sig: tuple[object, ...] = (qtype, tuple(r.data for r in recs))
        else:
            sig = (qtype, question_len, recs[0].data)
        prepared = self._shared.get(sig)
        if prepared is None:
            prepared = self._shared[sig] = prepare(name, question_len, recs, self._rng)
        return prepared

    def find(self, qname: bytes, qtype: int) -> Prepared | None:
        """Answer for a lower-case wire qname (class IN assumed), including wildcard matches."""
        key = qname + qtype.to_bytes(2, "big") + _IN
        prepared = self.answers.get(key)
        if prepared is not None:
            return prepared
        if qtype not in (wire.TYPE_A, wire.TYPE_AAAA):
            return None
        if qname in self.lookup:  # a name of the table (a CNAME's expansion first): kept for the table's life
            prepared = self.answers[key] = self._prepare(qname, len(key), qtype)
            return prepared
        if not self.lookup.wildcards:
            return None
        name = match(self.lookup, qname)
        if name is None:
            return None
        recs = records(self.lookup, qname, name, qtype)
        if recs is None:
            return None
        prepared = prepare(qname, len(key), recs, self._rng)
        if self._dynamic < DYNAMIC_LIMIT:
            self._dynamic += 1
            self.answers[key] = prepared
        return prepared

    def find_spelled(self, qname: bytes, qtype: int) -> Prepared | None:
        """As find(), for a question spelled with capitals: owners written out in lower case.

        Not cached: stub resolvers ask in lower case; this serves the odd
        client that does not (or one that randomizes case).
        """
        recs = resolve(self.lookup, qname, qtype)
        if recs is None:
            return None
        return prepare(qname, len(qname) + 4, recs, self._rng, echo=False)

"""Ready-to-send answers, keyed by the raw question bytes.

A known-name query must cost a dictionary lookup and a few byte copies, so
every answer is packed once per NameTable. The key is the question exactly as
it appears on the wire after the header, lower-cased: `qname + qtype + qclass`.
Lower-casing the whole slice is safe because label lengths are < 64 (never
an ASCII capital) and the type/class bytes of our keys (A, AAAA, IN) are below
0x41, so no other type or class can lower-case into one of them.

Answer sections are built for a question at offset 12: owner names that are
the question become the pointer 0xC00C, so the response echoes the client's
spelling of the name and the same bytes serve any case variant. A/AAAA order is
shuffled for DNS load balancing (as upstream does) by packing a few orderings
up front; the query id picks one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from istio_agent.dns import wire
from istio_agent.dns.table import TTL, Lookup, Record, match, records
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


def pack_records(qname: str, question_len: int, recs: list[Record], wires: dict[str, bytes] | None = None) -> bytes:
    """Answer section for a question of `question_len` bytes (name + type + class) at offset 12.

    `wires` may hold names already encoded (the Lookup's), to avoid encoding them again.
    """
    base = 12 + question_len
    out = bytearray()
    offsets: dict[str, int] = {qname: 12}
    known_wires = wires or {}

    def name_ref(name: str, at: int) -> bytes:
        known = offsets.get(name)
        if known is not None:
            return (0xC000 | known).to_bytes(2, "big")
        offsets[name] = at
        encoded = known_wires.get(name)
        return encoded if encoded is not None else wire.encode_name(name)

    for rec in recs:
        out += name_ref(rec.owner, base + len(out))
        out += rec.rtype.to_bytes(2, "big") + _RR_TAIL
        rdata = name_ref(rec.data, base + len(out) + 2) if isinstance(rec.data, str) else rec.data
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


def prepare(qname: str, question_len: int, recs: list[Record], rng: random.Random,
            wires: dict[str, bytes] | None = None) -> Prepared:
    bodies = tuple(pack_records(qname, question_len, order, wires) for order in _orderings(recs, rng))
    plain, edns = _headers(len(recs))
    return Prepared(plain=plain, edns=edns, bodies=bodies, variants=len(bodies))


class CompiledTable:
    """One NameTable compiled for answering.

    Answers for the table's own names are packed up front. Search-expanded
    (CNAME) names, half of all names, are packed on their first query, like
    wildcard matches: that halves compile time, and a name costs one slow-path
    query per table. `answers` is only ever added to (never changed), so readers
    on other threads see either no entry or a complete one.
    """

    def __init__(self, source: nds_pb2.NameTable, lookup: Lookup, seed: int | None = None) -> None:
        self.source = source
        self.lookup = lookup
        self._rng = random.Random(seed)
        self.answers: dict[bytes, Prepared] = {}
        self._dynamic = 0
        self._wildcards = frozenset(wire.encode_name(name) for name in lookup.wildcards())
        self._shared: dict[tuple[object, ...], Prepared] = {}
        wires = lookup.wires
        self._lazy = {wires.get(name) or wire.encode_name(name): name for name in lookup.cnames}
        type_class = {qtype: qtype.to_bytes(2, "big") + _IN for qtype in (wire.TYPE_A, wire.TYPE_AAAA)}
        for name in lookup.hosts:
            qwire = wires.get(name) or wire.encode_name(name)
            for qtype, suffix in type_class.items():
                self.answers[qwire + suffix] = self._prepare(name, len(qwire) + 4, qtype)

    def _prepare(self, name: str, question_len: int, qtype: int) -> Prepared:
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
            prepared = self._shared[sig] = prepare(name, question_len, recs, self._rng, self.lookup.wires)
        return prepared

    def find(self, qname: bytes, qtype: int) -> Prepared | None:
        """Answer for a lower-case wire qname (class IN assumed), including wildcard matches."""
        key = qname + qtype.to_bytes(2, "big") + _IN
        prepared = self.answers.get(key)
        if prepared is not None:
            return prepared
        if qtype not in (wire.TYPE_A, wire.TYPE_AAAA):
            return None
        lazy = self._lazy.get(qname)
        if lazy is not None:
            prepared = self.answers[key] = self._prepare(lazy, len(key), qtype)
            return prepared
        if not self._wildcards or not self._wildcard_candidate(qname):
            return None
        text = wire.decode_name(qname)
        name = match(self.lookup, text)
        if name is None:
            return None
        recs = records(self.lookup, text, name, qtype)
        if recs is None:
            return None
        prepared = prepare(text, len(key), recs, self._rng)
        if self._dynamic < DYNAMIC_LIMIT:
            self._dynamic += 1
            self.answers[key] = prepared
        return prepared

    def _wildcard_candidate(self, qname: bytes) -> bool:
        """Whether a `*.suffix` of qname is in the table, judged on wire labels.

        Working on the wire form keeps a label that itself contains a dot from
        being mistaken for two labels.
        """
        off = 0
        while qname[off]:
            off += 1 + qname[off]
            if qname[off] and b"\x01*" + qname[off:] in self._wildcards:
                return not any(b"." in label for label in _labels(qname))
        return False


def _labels(qname: bytes) -> list[bytes]:
    out = []
    off = 0
    while qname[off]:
        out.append(qname[off + 1 : off + 1 + qname[off]])
        off += 1 + qname[off]
    return out

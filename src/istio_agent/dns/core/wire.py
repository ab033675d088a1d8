"""DNS wire format, just as much as the proxy needs (RFC 1035, RFC 6891).

Why our own and not dnspython here: the proxy never needs to *understand* most
of a message, only to validate its structure, find the question, read the
client's EDNS size and cut a response at a record boundary. Walking the bytes
does that without building objects, which keeps the slow path cheap as well.
All functions are pure: bytes in, bytes or values out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TYPE_A = 1
TYPE_CNAME = 5
TYPE_AAAA = 28
TYPE_OPT = 41
CLASS_IN = 1

RCODE_NOERROR = 0
RCODE_FORMERR = 1
RCODE_SERVFAIL = 2
RCODE_NOTIMP = 4
RCODE_BADVERS = 16  # extended: upper 8 bits go into the OPT TTL

OPCODE_QUERY = 0
OPCODE_NOTIFY = 4
# The opcodes miekg/dns's server hands to upstream's handler (the rest it answers NOTIMP itself).
HANDLED_OPCODES = (OPCODE_QUERY, OPCODE_NOTIFY)

# Flag bits of the 16-bit header flags word.
FLAG_QR = 0x8000
FLAG_AA = 0x0400
FLAG_TC = 0x0200
FLAG_RD = 0x0100
FLAG_CD = 0x0010

MIN_UDP_SIZE = 512  # RFC 1035 limit without EDNS (and the floor with it)
MAX_MSG_SIZE = 65535  # TCP length prefix limit
# What we advertise in our own OPT records: the DNS flag day 2020 value, safe on any path.
OUR_UDP_SIZE = 1232


class WireError(ValueError):
    """The bytes are not a well-formed DNS message."""


def encode_name(name: str) -> bytes:
    """Lower-cased wire form of a dotted name ("a.b." or "a.b"); "." is the root.

    Raises ValueError for names DNS cannot carry (empty or >63-byte labels, >255 bytes).
    """
    text = name.lower()
    if text.endswith("."):
        text = text[:-1]
    if not text:
        return b"\x00"
    labels = text.encode("utf-8").split(b".")
    out = b"".join([bytes((len(label),)) + label for label in labels]) + b"\x00"
    if len(out) > 255 or b"" in labels or max(map(len, labels)) > 63:
        raise ValueError(f"invalid DNS name {name!r} (empty or >63-byte label, or >255 bytes)")
    return out


# Presentation format as miekg/dns writes and reads it, since upstream matches names as
# those strings: these bytes are written backslash-escaped, and bytes outside printable
# ASCII as a three-digit \DDD.
_ESCAPED = frozenset(b". '@;()\"\\")
# A name needing no escapes: labels of 1-63 printable ASCII bytes other than those.
_BARE_NAME = re.compile(r"(?:[^\x00-\x20\x7f-\U0010ffff\"'().;@\\]{1,63}\.)+")
_LENGTH = [bytes((n,)) for n in range(64)]


def name_to_text(name: bytes) -> str:
    """Presentation form (trailing dot, escapes as miekg/dns) of an uncompressed wire name."""
    labels = []
    off = 0
    while name[off]:
        n = name[off]
        out = []
        for b in name[off + 1 : off + 1 + n]:
            if b in _ESCAPED:
                out.append("\\" + chr(b))
            elif b < 0x20 or b > 0x7E:
                out.append(f"\\{b:03d}")
            else:
                out.append(chr(b))
        labels.append("".join(out))
        off += 1 + n
    return ".".join(labels) + "." if labels else "."


def name_from_text(text: str) -> bytes | None:
    """Wire form of `text` if `text` is exactly how some name is presented, else None.

    Upstream keys its tables by presentation strings and looks a query up by
    its own presentation, so a table name matches only if it is that canonical
    form: fully qualified, escaped where miekg escapes and nowhere else, with
    legal label and name lengths. Anything else can never match a query.
    """
    if text == ".":
        return b"\x00"
    if "\\" in text:
        return _escaped_name_from_text(text)
    if len(text) > 254 or not _BARE_NAME.fullmatch(text):
        return None
    labels = text.encode("ascii").split(b".")  # the last one is the empty root label
    return b"".join([_LENGTH[len(label)] + label for label in labels])


def _escaped_name_from_text(text: str) -> bytes | None:
    labels: list[bytes] = []
    label = bytearray()
    i, end = 0, len(text)
    while i < end:
        ch = text[i]
        if ch == "\\":
            digits = text[i + 1 : i + 4]
            if len(digits) == 3 and all("0" <= d <= "9" for d in digits) and int(digits) < 256:
                label.append(int(digits))
                i += 4
                continue
            if i + 1 == end or ord(text[i + 1]) > 0x7E:
                return None
            label.append(ord(text[i + 1]))
            i += 2
        elif ch == ".":
            if not label:
                return None
            labels.append(bytes(label))
            label = bytearray()
            i += 1
        elif ord(ch) > 0x7E:
            return None
        else:
            label.append(ord(ch))
            i += 1
    if label:
        return None  # not fully qualified
    packed = _pack_labels(labels)
    return packed if packed is not None and name_to_text(packed) == text else None


def _pack_labels(labels: list[bytes]) -> bytes | None:
    if not labels or any(not 0 < len(label) < 64 for label in labels):
        return None
    out = b"".join([bytes((len(label),)) + label for label in labels]) + b"\x00"
    return out if len(out) <= 255 else None


def skip_name(buf: bytes, off: int, pointers: bool = True) -> int:
    """Offset just past the (possibly compressed) name at `off`; raise WireError if malformed.

    Pointers are only checked to point backwards (which also rules out loops); the
    proxy never needs the name a pointer leads to. With `pointers=False` (a
    question name, which the proxy matches and echoes as plain labels) any
    pointer is refused.
    """
    start = off
    end = len(buf)
    while True:
        if off >= end:
            raise WireError("name runs past the end of the message")
        n = buf[off]
        if n == 0:
            off += 1
            break
        kind = n & 0xC0
        if kind == 0xC0:
            if not pointers:
                raise WireError("compressed question name")
            if off + 2 > end:
                raise WireError("truncated compression pointer")
            target = ((n & 0x3F) << 8) | buf[off + 1]
            if target >= start:
                raise WireError("compression pointer does not point backwards")
            off += 2
            break
        if kind:
            raise WireError("unsupported label type")
        off += 1 + n
    if off - start > 255:
        raise WireError("name longer than 255 bytes")
    return off


@dataclass(frozen=True, slots=True)
class Edns:
    """The client's OPT record: what it can receive and whether it wants DNSSEC records."""

    udp_size: int
    version: int
    do: bool


@dataclass(frozen=True, slots=True)
class Query:
    """A validated query message, reduced to what the proxy acts on."""

    flags: int
    opcode: int
    qdcount: int
    question: bytes  # qname (as sent) + qtype + qclass, or b"" when qdcount == 0
    qname: bytes  # lower-cased wire qname
    qtype: int
    qclass: int
    edns: Edns | None

    @property
    def udp_limit(self) -> int:
        """Largest UDP response this client accepts (RFC 6891 6.2.5: never below 512)."""
        if self.edns is None:
            return MIN_UDP_SIZE
        return max(MIN_UDP_SIZE, self.edns.udp_size)


def _u16(buf: bytes, off: int) -> int:
    return (buf[off] << 8) | buf[off + 1]


def _walk_rr(buf: bytes, off: int) -> tuple[int, int, int, int]:
    """Validate one resource record; return (name_end, type, rdata_start, end)."""
    name_end = skip_name(buf, off)
    if name_end + 10 > len(buf):
        raise WireError("truncated record header")
    rtype = _u16(buf, name_end)
    rdlen = _u16(buf, name_end + 8)
    end = name_end + 10 + rdlen
    if end > len(buf):
        raise WireError("record data runs past the end of the message")
    return name_end, rtype, name_end + 10, end


def _check_options(buf: bytes, off: int, end: int) -> None:
    while off < end:
        if off + 4 > end:
            raise WireError("truncated EDNS option")
        off += 4 + _u16(buf, off + 2)
    if off != end:
        raise WireError("EDNS option runs past its record")


def parse_query(data: bytes) -> Query:
    """Validate a whole query message and return its question and EDNS data.

    Mirrors what a Go server built on miekg/dns accepts: exactly one question, at
    most one answer and one authority record, at most two additional records, a
    single OPT record owned by the root; nothing after the last record.
    """
    if len(data) < 12:
        raise WireError("shorter than a DNS header")
    flags = _u16(data, 2)
    qd, an, ns, ar = _u16(data, 4), _u16(data, 6), _u16(data, 8), _u16(data, 10)
    if an > 1 or ns > 1 or ar > 2 or qd > 1:
        raise WireError("unexpected section counts for a query")
    off = 12
    question = b""
    qname = b""
    qtype = qclass = 0
    if qd:
        name_end = skip_name(data, 12, pointers=False)
        if name_end + 4 > len(data):
            raise WireError("truncated question")
        qname = data[12:name_end].lower()
        qtype = _u16(data, name_end)
        qclass = _u16(data, name_end + 2)
        off = name_end + 4
        question = data[12:off]
    edns: Edns | None = None
    for index in range(an + ns + ar):
        name_end, rtype, rdata, end = _walk_rr(data, off)
        if rtype == TYPE_OPT:
            if index < an + ns or edns is not None or name_end != off + 1 or data[off] != 0:
                raise WireError("misplaced, duplicated or non-root OPT record")
            _check_options(data, rdata, end)
            edns = Edns(udp_size=_u16(data, name_end + 2), version=data[name_end + 5],
                        do=bool(data[name_end + 6] & 0x80))
        off = end
    if off != len(data):
        raise WireError("trailing bytes after the last record")
    return Query(flags=flags, opcode=(flags >> 11) & 0xF, qdcount=qd, question=question,
                 qname=qname, qtype=qtype, qclass=qclass, edns=edns)


def opt_record(do: bool, ext_rcode: int = 0) -> bytes:
    """Our OPT record: root owner, our UDP size, version 0, DO copied (RFC 3225), no options."""
    return (b"\x00\x00\x29" + OUR_UDP_SIZE.to_bytes(2, "big") + bytes((ext_rcode, 0, 0x80 if do else 0, 0))
            + b"\x00\x00")


def reply_flags(query_flags: int, rcode: int, authoritative: bool = False) -> int:
    """Response flags the way a miekg/dns `SetReply` builds them: QR, opcode, RD and CD copied."""
    flags = FLAG_QR | (query_flags & 0x7800) | (rcode & 0xF)
    if (query_flags >> 11) & 0xF == OPCODE_QUERY:
        flags |= query_flags & (FLAG_RD | FLAG_CD)
    if authoritative:
        flags |= FLAG_AA
    return flags


def error_reply(data: bytes, query: Query, rcode: int) -> bytes:
    """An answerless reply echoing the question (and an OPT record if the query had one)."""
    opt = b""
    if query.edns is not None:
        opt = opt_record(query.edns.do, rcode >> 4)
    return b"".join((
        data[:2],
        reply_flags(query.flags, rcode).to_bytes(2, "big"),
        (1 if query.question else 0).to_bytes(2, "big"),
        b"\x00\x00\x00\x00",
        (1 if opt else 0).to_bytes(2, "big"),
        query.question,
        opt,
    ))


def is_header_only_query(data: bytes) -> bool:
    """A bare 12-byte QUERY (or NOTIFY) claiming one question, which miekg/dns hands on with no question.

    Its server accepts the header (one question, at most one answer, one
    authority, two additional records) and its parser stops at the end of the
    message without an error, so upstream's handler sees an empty question
    section and answers SERVFAIL.
    """
    return (len(data) == 12 and not data[2] & 0x80 and (data[2] >> 3) & 0xF in HANDLED_OPCODES
            and _u16(data, 4) == 1 and _u16(data, 6) <= 1 and _u16(data, 8) <= 1 and _u16(data, 10) <= 2)


FLAG_Z = 0x0040


def accept_rejection(data: bytes) -> bytes | None:
    """What miekg/dns's server answers, before any handler runs, a header its default accept function rejects
    (None: the header is accepted). Another opcode than QUERY or NOTIFY gets NOTIMP; a QUERY or NOTIFY whose
    counts are not one question, at most one answer, one authority and two additional records gets FORMERR.
    The reply is the query's own header turned around (QR set, AA and Z cleared, RD, AD, CD and the id kept;
    the opcode kept for NOTIMP, QUERY for FORMERR) with no sections: the server never parsed them."""
    flags = _u16(data, 2)
    opcode = (flags >> 11) & 0xF
    if opcode not in HANDLED_OPCODES:
        rcode, keep = RCODE_NOTIMP, 0x7800
    elif _u16(data, 4) != 1 or _u16(data, 6) > 1 or _u16(data, 8) > 1 or _u16(data, 10) > 2:
        rcode, keep = RCODE_FORMERR, 0
    else:
        return None
    flags = (flags | FLAG_QR) & ~(FLAG_AA | FLAG_Z | 0x7800 | 0xF) | (flags & keep) | rcode
    return data[:2] + flags.to_bytes(2, "big") + b"\x00" * 8


def header_reply(data: bytes, rcode: int) -> bytes:
    """A reply of just a header (no sections), flags as miekg's SetReply sets them."""
    return data[:2] + reply_flags(_u16(data, 2), rcode).to_bytes(2, "big") + b"\x00" * 8


def formerr(data: bytes) -> bytes | None:
    """Header-only FORMERR for a packet we cannot parse; None when it must be dropped.

    Never answer a packet that is shorter than a header or is itself a response:
    replying to responses lets two servers bounce errors at each other forever.
    """
    if len(data) < 12 or data[2] & 0x80:
        return None
    return header_reply(data, RCODE_FORMERR)


def fit(resp: bytes, limit: int) -> bytes:
    """Cut a response to at most `limit` bytes at a record boundary, setting TC if records were cut.

    Keeps the header, the question and the longest run of records that fits,
    then re-appends the OPT record (clients need it to learn our size). Records
    are kept as a prefix, so compression pointers in them stay valid. A response
    we cannot walk is reduced to its header and question with TC set.
    """
    if len(resp) <= limit:
        return resp
    try:
        return _fit(resp, limit)
    except WireError:
        return _header_only(resp)


def _header_only(resp: bytes) -> bytes:
    flags = _u16(resp, 2) | FLAG_TC
    try:
        qd = _u16(resp, 4)
        off = 12
        if qd == 1:
            off = skip_name(resp, 12) + 4
            if off > len(resp):
                raise WireError("truncated question")
        elif qd:
            raise WireError("multiple questions")
    except WireError:
        qd, off = 0, 12
    return resp[:2] + flags.to_bytes(2, "big") + qd.to_bytes(2, "big") + b"\x00" * 6 + resp[12:off]


def _fit(resp: bytes, limit: int) -> bytes:
    if len(resp) < 12:
        raise WireError("shorter than a DNS header")
    qd = _u16(resp, 4)
    counts = (_u16(resp, 6), _u16(resp, 8), _u16(resp, 10))
    off = 12
    for _ in range(qd):
        off = skip_name(resp, off) + 4
        if off > len(resp):
            raise WireError("truncated question")
    body_start = off
    records: list[tuple[int, int]] = []  # (section, end offset) of each record before any OPT
    opt = b""
    stop_keeping = False
    for section, count in enumerate(counts):
        for _ in range(count):
            _name_end, rtype, _rdata, end = _walk_rr(resp, off)
            if rtype == TYPE_OPT and section == 2:
                opt = resp[off:end]
                stop_keeping = True  # later records would shift: keep only what precedes the OPT
            elif not stop_keeping:
                records.append((section, end))
            off = end
    budget = limit - len(opt)
    kept = [0, 0, 0]
    cut = body_start
    for section, end in records:
        if end > budget:
            break
        kept[section] += 1
        cut = end
    flags = _u16(resp, 2)
    if kept[0] < counts[0] or kept[1] < counts[1]:
        flags |= FLAG_TC
    if cut > budget:  # not even the question fits: header only
        return _header_only(resp)
    ar = kept[2] + (1 if opt else 0)
    header = (resp[:2] + flags.to_bytes(2, "big") + qd.to_bytes(2, "big") + kept[0].to_bytes(2, "big")
              + kept[1].to_bytes(2, "big") + ar.to_bytes(2, "big"))
    return header + resp[12:cut] + opt

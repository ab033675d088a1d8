"""A strict reader for the YAML subset kubeconfig writers emit, falling back to PyYAML for anything else.

install-cni writes the plugin's kubeconfig as Go's `sigs.k8s.io/yaml` does:
block mappings, block sequences of mappings, plain or quoted scalars, `{}`
and `[]`. Reading that by hand costs well under a millisecond, while
importing PyYAML costs ~20 ms of every pod's ADD. Any line outside the
subset (anchors, tags, block scalars, flow collections with content,
multi-line scalars, tabs) makes `loads` hand the whole text to PyYAML's C
loader instead, so nothing is misread: the subset reader either understands
a document completely or not at all. JSON documents go to `json`.
"""

from __future__ import annotations

import json


class _Unsupported(Exception):
    """The text leaves the subset: use the full YAML parser."""


_PLAIN_SPECIAL = frozenset("&*!|>%@`{}[],#")


def _scalar(text: str) -> object:
    """A one-line scalar: quoted, `{}`/`[]`, or plain (kept as a string unless it is null/bool/int)."""
    if not text:
        return None
    if text in ("{}", "[]"):
        return {} if text == "{}" else []
    if text[0] == '"':
        if not text.endswith('"') or len(text) < 2:
            raise _Unsupported
        try:
            value = json.loads(text)
        except ValueError:
            raise _Unsupported from None
        if not isinstance(value, str):
            raise _Unsupported
        return value
    if text[0] == "'":
        if len(text) < 2 or not text.endswith("'") or "'" in text[1:-1].replace("''", ""):
            raise _Unsupported
        return text[1:-1].replace("''", "'")
    if text[0] in _PLAIN_SPECIAL or (text[0] in "-?:" and (len(text) == 1 or text[1] == " ")) or " #" in text \
            or ": " in text or text.endswith(":"):
        raise _Unsupported
    if text in ("null", "~", "Null", "NULL"):
        return None
    if text in ("true", "True", "TRUE"):
        return True
    if text in ("false", "False", "FALSE"):
        return False
    if text.isascii() and (text.isdigit() or (text[0] in "+-" and text[1:].isdigit())):
        return int(text)
    if any(c in text for c in "eE.xob") and _looks_numeric(text):
        raise _Unsupported  # floats, hex, octal: rare here, let PyYAML decide
    return text


def _looks_numeric(text: str) -> bool:
    body = text.lstrip("+-")
    return bool(body) and (body[0].isdigit() or body[0] == ".")


def _lines(text: str) -> list[tuple[int, str]]:
    out = []
    for raw in text.split("\n"):
        line = raw.rstrip("\r").rstrip(" ")
        if not line.strip() or line.lstrip(" ").startswith("#"):
            continue
        if "\t" in line[: len(line) - len(line.lstrip())] or line in ("---", "...") or line.startswith("%"):
            raise _Unsupported
        out.append((len(line) - len(line.lstrip(" ")), line.lstrip(" ")))
    return out


def _split_key(body: str) -> tuple[str, str]:
    if body.endswith(":"):
        key, rest = body[:-1], ""
    elif ": " in body:
        key, rest = body.split(": ", 1)
    else:
        raise _Unsupported
    if not key or key[0] in "\"'?&*!|>{[-" or key != key.strip():
        raise _Unsupported
    return key, rest.strip()


class _Reader:
    def __init__(self, lines: list[tuple[int, str]]) -> None:
        self.lines = lines
        self.pos = 0

    def node(self, indent: int) -> object:
        """The block node whose lines start at `indent`."""
        if self.pos >= len(self.lines):
            return None
        col, body = self.lines[self.pos]
        if col < indent:
            return None
        if body == "-" or body.startswith("- "):
            return self.sequence(col)
        return self.mapping(col)

    def mapping(self, indent: int, first: str | None = None) -> dict[str, object]:
        out: dict[str, object] = {}
        while True:
            if first is not None:
                body, first = first, None
            else:
                if self.pos >= len(self.lines):
                    return out
                col, body = self.lines[self.pos]
                if col < indent:
                    return out
                if col > indent or body.startswith("- ") or body == "-":
                    raise _Unsupported
                self.pos += 1
            key, rest = _split_key(body)
            if key in out:
                raise _Unsupported
            if rest:
                out[key] = _scalar(rest)
                continue
            if self.pos < len(self.lines):
                col, nxt = self.lines[self.pos]
                # go-yaml writes a sequence under a key at the key's own indentation.
                if col > indent or (col == indent and (nxt.startswith("- ") or nxt == "-")):
                    out[key] = self.node(col)
                    continue
            out[key] = None

    def sequence(self, indent: int) -> list[object]:
        out: list[object] = []
        while self.pos < len(self.lines):
            col, body = self.lines[self.pos]
            if col != indent or not (body.startswith("- ") or body == "-"):
                if col > indent:
                    raise _Unsupported
                return out
            self.pos += 1
            item = body[2:].strip()
            if not item:
                out.append(self.node(indent + 1))
            elif item.startswith("- ") or item == "-":
                raise _Unsupported
            elif item.endswith(":") or (": " in item and not item.startswith(("'", '"'))):
                out.append(self.mapping(indent + 2, first=item))
            else:
                out.append(_scalar(item))
        return out


def loads_subset(text: str) -> object:
    """The document, when it stays inside the subset; _Unsupported otherwise."""
    reader = _Reader(_lines(text))
    value = reader.node(0)
    if reader.pos != len(reader.lines):
        raise _Unsupported
    return value


def loads(text: str) -> object:
    """A YAML (or JSON) document: the fast subset reader, else PyYAML's C safe loader."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass
    try:
        return loads_subset(text)
    except _Unsupported:
        pass
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(text, Loader=loader)

"""The functions custom bootstrap templates may call: Go's builtins, Istio's `toJSON`, common Sprig ones.

Each takes plain Python values (as the template engine passes them) and returns
one; errors are raised as TemplateError/ValueError and reported with the line.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from istio_agent.envoy.bootstrap.gofmt import TemplateError, go_json, go_str, js_escape, truthy


def _and(*args: Any) -> Any:
    if not args:
        raise TemplateError("and: missing arguments")
    for arg in args:
        if not truthy(arg):
            return arg
    return args[-1]


def _or(*args: Any) -> Any:
    if not args:
        raise TemplateError("or: missing arguments")
    for arg in args:
        if truthy(arg):
            return arg
    return args[-1]


def _comparable(a: Any, b: Any) -> tuple[Any, Any]:
    if isinstance(a, bool) != isinstance(b, bool) and a is not None and b is not None:
        raise TemplateError(f"incompatible types for comparison: {go_str(a)} and {go_str(b)}")
    return a, b


def _eq(first: Any, *others: Any) -> bool:
    if not others:
        raise TemplateError("eq: missing argument for comparison")
    return any(first == other for other in (_comparable(first, o)[1] for o in others))


def _ordered(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def compare(a: Any, b: Any) -> bool:
        a, b = _comparable(a, b)
        try:
            return op(a, b)
        except TypeError:
            raise TemplateError(f"incompatible types for comparison: {go_str(a)} and {go_str(b)}") from None

    return compare


def _index(value: Any, *keys: Any) -> Any:
    for key in keys:
        if isinstance(value, Mapping):
            value = value.get(key)
        elif isinstance(value, list | tuple | str):
            value = value[int(key)]
        elif value is None:
            raise TemplateError("index of untyped nil")
        else:
            raise TemplateError(f"can't index item of type {type(value).__name__}")
    return value


def _sprint(*args: Any) -> str:
    """fmt.Sprint: a space between operands when neither side is a string."""
    out = ""
    for i, arg in enumerate(args):
        if i and not isinstance(arg, str) and not isinstance(args[i - 1], str):
            out += " "
        out += go_str(arg)
    return out


_VERB = re.compile(r"%([-+# 0]*)(\d*)(?:\.(\d+))?([vsdqtfxXgeT%])")


def _printf(fmt: str, *args: Any) -> str:
    """fmt.Sprintf for the verbs templates use (%s %v %d %q %t %f %x %g %e %%)."""
    values = list(args)

    def repl(match: re.Match[str]) -> str:
        flags, width, precision, verb = match.groups()
        if verb == "%":
            return "%"
        if not values:
            return f"%!{verb}(MISSING)"
        value = values.pop(0)
        if verb in "vs":
            text = go_str(value)
        elif verb == "d":
            text = str(int(value))
        elif verb == "q":
            text = json.dumps(go_str(value), ensure_ascii=False)
        elif verb == "t":
            text = go_str(bool(value))
        elif verb == "T":
            text = type(value).__name__
        else:
            spec = f"{'.' + precision if precision else ('.6' if verb in 'fe' else '')}{verb}"
            text = format(value, spec)
        return text.rjust(int(width)) if width and "-" not in flags else text.ljust(int(width or 0))

    return _VERB.sub(repl, fmt)


def _to_json(value: Any) -> str:
    """Istio's `toJSON`: `{}` for nil."""
    return "{}" if value is None else go_json(value)


def _default(default: Any, value: Any = None) -> Any:
    return value if truthy(value) else default


def _indent(spaces: int, text: Any) -> str:
    pad = " " * int(spaces)
    return pad + go_str(text).replace("\n", "\n" + pad)


def _dict(*pairs: Any) -> dict[str, Any]:
    return {go_str(pairs[i]): (pairs[i + 1] if i + 1 < len(pairs) else "") for i in range(0, len(pairs), 2)}


def _int(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        try:
            return int(float(value)) if value.strip() else 0
        except ValueError:
            return 0
    return int(value)


FUNCS: dict[str, Callable[..., Any]] = {
    # Go text/template builtins
    "and": _and,
    "or": _or,
    "not": lambda v: not truthy(v),
    "eq": _eq,
    "ne": lambda a, b: not _eq(a, b),
    "lt": _ordered(lambda a, b: a < b),
    "le": _ordered(lambda a, b: a <= b),
    "gt": _ordered(lambda a, b: a > b),
    "ge": _ordered(lambda a, b: a >= b),
    "len": lambda v: len(v),
    "index": _index,
    "print": _sprint,
    "println": lambda *a: " ".join(go_str(v) for v in a) + "\n",
    "printf": _printf,
    "js": js_escape,
    "urlquery": lambda *a: urllib.parse.quote_plus(_sprint(*a)),
    "html": lambda *a: (_sprint(*a).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                        .replace('"', "&#34;").replace("'", "&#39;")),
    # Istio's own
    "toJSON": _to_json,
    # Sprig (the generic subset templates use)
    "toJson": go_json,
    "toPrettyJson": lambda v: json.dumps(v, indent=2, sort_keys=True, ensure_ascii=False),
    "fromJson": lambda s: json.loads(go_str(s)),
    "toString": go_str,
    "default": _default,
    "empty": lambda v: not truthy(v),
    "coalesce": lambda *a: next((v for v in a if truthy(v)), None),
    "ternary": lambda yes, no, cond: yes if truthy(cond) else no,
    "quote": lambda *a: " ".join(json.dumps(go_str(v), ensure_ascii=False) for v in a if v is not None),
    "squote": lambda *a: " ".join(f"'{go_str(v)}'" for v in a if v is not None),
    "trim": lambda s: go_str(s).strip(),
    "trimPrefix": lambda prefix, s: go_str(s).removeprefix(prefix),
    "trimSuffix": lambda suffix, s: go_str(s).removesuffix(suffix),
    "lower": lambda s: go_str(s).lower(),
    "upper": lambda s: go_str(s).upper(),
    "replace": lambda old, new, s: go_str(s).replace(old, new),
    "contains": lambda sub, s: sub in go_str(s),
    "hasPrefix": lambda prefix, s: go_str(s).startswith(prefix),
    "hasSuffix": lambda suffix, s: go_str(s).endswith(suffix),
    "splitList": lambda sep, s: go_str(s).split(sep),
    "join": lambda sep, items: sep.join(go_str(v) for v in (items or [])),
    "list": lambda *a: list(a),
    "dict": _dict,
    "hasKey": lambda m, k: isinstance(m, Mapping) and k in m,
    "keys": lambda *maps: sorted(k for m in maps for k in m),
    "int": _int,
    "int64": _int,
    "atoi": _int,
    "float64": lambda v: float(v or 0),
    "b64enc": lambda s: base64.b64encode(go_str(s).encode()).decode(),
    "b64dec": lambda s: base64.b64decode(go_str(s)).decode(),
    "indent": _indent,
    "nindent": lambda n, s: "\n" + _indent(n, s),
    "repeat": lambda n, s: go_str(s) * int(n),
}

"""A Go `text/template` subset, for custom bootstrap templates.

Istio's custom bootstrap templates (`customConfigFile`, `--templateFile`,
`ISTIO_BOOTSTRAP`) are Go templates over a map of named parameters. This module
renders the part of the language those templates use: `{{ .field.Sub }}`,
variables (`$x := ...`, `$`), pipelines with `|`, parenthesised calls, literals,
`if`/`else if`/`else`, `range` (with `$i, $v :=` and `else`), `with`, trim
markers `{{-`/`-}}`, comments, Go's builtins (`and or not eq ne lt le gt ge len
index print printf js`) and the commonly used Sprig/Istio helpers (`toJSON`,
`default`, `quote`, ...). Values print as Go prints them (`<no value>` for a
missing key, `true`, `[a b]`). Pure: text and data in, text out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from istio_agent.envoy.bootstrap.gofmt import (
    NO_VALUE,
    TemplateError,
    go_duration,
    go_json,
    go_str,
    js_escape,
    truthy,
)

__all__ = ["NO_VALUE", "TemplateError", "go_duration", "go_json", "go_str", "js_escape", "render_template", "truthy"]


# --------------------------------------------------------------------------------- lexing
_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(
    r"""\s*(?:
      (?P<str>"(?:[^"\\]|\\.)*")
    | (?P<raw>`[^`]*`)
    | (?P<char>'(?:[^'\\]|\\.)+')
    | (?P<decl>:=)
    | (?P<assign>=)
    | (?P<num>[-+]?(?:0[xX][0-9a-fA-F]+|\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+|\d+(?:[eE][-+]?\d+)?))
    | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
    | (?P<field>(?:\.[A-Za-z0-9_]+)+|\.)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
    | (?P<punct>[()|,])
    )""",
    re.X,
)


@dataclass(frozen=True)
class Token:
    kind: str
    text: str


def _tokens(source: str, line: int) -> list[Token]:
    out: list[Token] = []
    pos = 0
    while pos < len(source):
        if source[pos:].strip() == "":
            break
        match = _TOKEN.match(source, pos)
        if match is None or match.end() == pos:
            raise TemplateError(f"line {line}: unexpected {source[pos:].strip()[:20]!r} in action")
        kind = match.lastgroup or ""
        out.append(Token(kind, match.group(kind)))
        pos = match.end()
    return out


# --------------------------------------------------------------------------------- nodes
@dataclass
class Command:
    args: list[Any]  # operands: Token or nested Pipeline


@dataclass
class Pipeline:
    line: int
    commands: list[Command]
    decl: list[str] = field(default_factory=list)
    assign: bool = False  # `=` rather than `:=`


@dataclass
class Text:
    text: str


@dataclass
class Action:
    pipe: Pipeline


@dataclass
class Branch:
    kind: str  # if / range / with
    pipe: Pipeline
    body: list[Any]
    orelse: list[Any]


class _Parser:
    def __init__(self, text: str) -> None:
        self.items: list[tuple[str, Any, int]] = []
        pos = 0
        pending_trim = False
        for match in _ACTION.finditer(text):
            chunk = text[pos:match.start()]
            if pending_trim:
                chunk = chunk.lstrip()
            if match.group(1):
                chunk = chunk.rstrip()
            if chunk:
                self.items.append(("text", chunk, 0))
            line = text.count("\n", 0, match.start()) + 1
            body = match.group(2).strip()
            if not (body.startswith("/*") and body.endswith("*/")):
                self.items.append(("action", body, line))
            pending_trim = bool(match.group(3))
            pos = match.end()
        tail = text[pos:]
        if pending_trim:
            tail = tail.lstrip()
        if tail:
            self.items.append(("text", tail, 0))
        self.index = 0

    def parse(self) -> list[Any]:
        nodes, end = self._list()
        if end is not None:
            raise TemplateError(f"line {end[1]}: unexpected {{{{{end[0]}}}}}")
        return nodes

    def _list(self) -> tuple[list[Any], tuple[str, int] | None]:
        nodes: list[Any] = []
        while self.index < len(self.items):
            kind, value, line = self.items[self.index]
            self.index += 1
            if kind == "text":
                nodes.append(Text(value))
                continue
            word = value.split(None, 1)[0] if value else ""
            if word in ("end", "else"):
                return nodes, (value, line)
            if word in ("if", "range", "with"):
                nodes.append(self._branch(word, value[len(word):], line))
            elif word in ("define", "template", "block", "break", "continue"):
                raise TemplateError(f"line {line}: {{{{{word}}}}} is not supported in bootstrap templates")
            else:
                nodes.append(Action(_pipeline(value, line)))
        return nodes, None

    def _branch(self, kind: str, rest: str, line: int) -> Branch:
        pipe = _pipeline(rest, line)
        body, end = self._list()
        if end is None:
            raise TemplateError(f"line {line}: {{{{{kind}}}}} without {{{{end}}}}")
        orelse: list[Any] = []
        if end[0] != "end":
            rest_else = end[0][len("else"):].strip()
            if rest_else.startswith(("if ", "with ")):
                word = rest_else.split(None, 1)[0]
                orelse = [self._branch(word, rest_else[len(word):], end[1])]
            else:
                orelse, end2 = self._list()
                if end2 is None or end2[0] != "end":
                    raise TemplateError(f"line {line}: {{{{{kind}}}}} without {{{{end}}}}")
        return Branch(kind, pipe, body, orelse)


def _pipeline(source: str, line: int) -> Pipeline:
    tokens = _tokens(source, line)
    decl: list[str] = []
    assign = False
    # `$x :=`, `$i, $v :=` or `$x =` at the front declares/assigns variables.
    i = 0
    names: list[str] = []
    while i < len(tokens) and tokens[i].kind == "var" and "." not in tokens[i].text:
        names.append(tokens[i].text)
        if i + 1 < len(tokens) and tokens[i + 1].kind == "punct" and tokens[i + 1].text == ",":
            i += 2
            continue
        if i + 1 < len(tokens) and tokens[i + 1].kind in ("decl", "assign"):
            decl, assign = names, tokens[i + 1].kind == "assign"
            tokens = tokens[i + 2:]
        break
    commands, rest = _commands(tokens, line)
    if rest:
        raise TemplateError(f"line {line}: unexpected {rest[0].text!r}")
    if not commands:
        raise TemplateError(f"line {line}: missing value in action")
    return Pipeline(line, commands, decl, assign)


def _commands(tokens: list[Token], line: int) -> tuple[list[Command], list[Token]]:
    commands: list[Command] = []
    args: list[Any] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.kind == "punct" and token.text == "|":
            if not args:
                raise TemplateError(f"line {line}: empty command before '|'")
            commands.append(Command(args))
            args = []
            i += 1
        elif token.kind == "punct" and token.text == "(":
            depth, j = 1, i + 1
            while j < len(tokens) and depth:
                if tokens[j].kind == "punct" and tokens[j].text in "()":
                    depth += 1 if tokens[j].text == "(" else -1
                j += 1
            if depth:
                raise TemplateError(f"line {line}: unclosed '('")
            inner, rest = _commands(tokens[i + 1:j - 1], line)
            if rest or not inner:
                raise TemplateError(f"line {line}: bad parenthesised pipeline")
            node: Any = Pipeline(line, inner)
            # `(pipeline).Field`
            if j < len(tokens) and tokens[j].kind == "field" and tokens[j].text != ".":
                node = ("chain", node, tokens[j].text)
                j += 1
            args.append(node)
            i = j
        elif token.kind == "punct":
            return commands + ([Command(args)] if args else []), tokens[i:]
        else:
            args.append(token)
            i += 1
    if args:
        commands.append(Command(args))
    return commands, []


# ------------------------------------------------------------------------------- execution
def _lookup(value: Any, path: str, line: int) -> Any:
    for name in [p for p in path.split(".") if p]:
        if value is None:
            raise TemplateError(f"line {line}: nil pointer evaluating .{name}")
        value = value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)
    return value


def _literal(token: Token, line: int) -> Any:
    if token.kind == "str":
        return json.loads(token.text)
    if token.kind == "raw":
        return token.text[1:-1]
    if token.kind == "char":
        return ord(json.loads('"' + token.text[1:-1] + '"'))
    if token.kind == "num":
        text = token.text
        if re.fullmatch(r"[-+]?0[xX][0-9a-fA-F]+", text):
            return int(text, 16)
        return float(text) if any(c in text for c in ".eE") and not text.lower().startswith("0x") else int(text)
    raise TemplateError(f"line {line}: unexpected {token.text!r}")


class _Exec:
    def __init__(self, funcs: Mapping[str, Callable[..., Any]], root: Any) -> None:
        self.funcs = funcs
        self.vars: list[dict[str, Any]] = [{"$": root}]
        self.out: list[str] = []

    def var(self, name: str, line: int) -> Any:
        for scope in reversed(self.vars):
            if name in scope:
                return scope[name]
        raise TemplateError(f"line {line}: undefined variable {name}")

    def set_var(self, name: str, value: Any, declare: bool, line: int) -> None:
        if declare:
            self.vars[-1][name] = value
            return
        for scope in reversed(self.vars):
            if name in scope:
                scope[name] = value
                return
        raise TemplateError(f"line {line}: undefined variable {name}")

    def operand(self, arg: Any, dot: Any, line: int) -> Any:
        if isinstance(arg, Pipeline):
            return self.pipeline(arg, dot)
        if isinstance(arg, tuple):
            return _lookup(self.pipeline(arg[1], dot), arg[2], line)
        token: Token = arg
        if token.kind == "field":
            return dot if token.text == "." else _lookup(dot, token.text, line)
        if token.kind == "var":
            name, _, path = token.text.partition(".")
            return _lookup(self.var(name, line), path, line)
        if token.kind == "ident":
            if token.text in ("true", "false"):
                return token.text == "true"
            if token.text == "nil":
                return None
            return self.call(token.text, [], line)
        return _literal(token, line)

    def call(self, name: str, args: list[Any], line: int) -> Any:
        func = self.funcs.get(name)
        if func is None:
            raise TemplateError(f"line {line}: function {name!r} not defined")
        try:
            return func(*args)
        except TemplateError:
            raise
        except (TypeError, ValueError, KeyError, IndexError) as exc:
            raise TemplateError(f"line {line}: error calling {name}: {exc}") from None

    def command(self, command: Command, dot: Any, piped: list[Any], line: int) -> Any:
        first = command.args[0]
        if isinstance(first, Token) and first.kind == "ident" and first.text not in ("true", "false", "nil"):
            # and/or evaluate lazily in Go; here every argument is a plain value already.
            args = [self.operand(a, dot, line) for a in command.args[1:]] + piped
            return self.call(first.text, args, line)
        if len(command.args) > 1 or piped:
            raise TemplateError(f"line {line}: can't give arguments to a non-function")
        return self.operand(first, dot, line)

    def pipeline(self, pipe: Pipeline, dot: Any) -> Any:
        value: Any = None
        for index, command in enumerate(pipe.commands):
            value = self.command(command, dot, [value] if index else [], pipe.line)
        for name in pipe.decl:
            self.set_var(name, value, not pipe.assign, pipe.line)
        return value

    def run(self, nodes: Sequence[Any], dot: Any) -> None:
        for node in nodes:
            if isinstance(node, Text):
                self.out.append(node.text)
            elif isinstance(node, Action):
                value = self.pipeline(node.pipe, dot)
                if not node.pipe.decl:
                    self.out.append(go_str(value))
            else:
                self.branch(node, dot)

    def branch(self, node: Branch, dot: Any) -> None:
        self.vars.append({})
        try:
            if node.kind == "range":
                self.range(node, dot)
                return
            value = self.pipeline(Pipeline(node.pipe.line, node.pipe.commands), dot)
            for name in node.pipe.decl:
                self.set_var(name, value, True, node.pipe.line)
            if truthy(value):
                self.run(node.body, value if node.kind == "with" else dot)
            else:
                self.run(node.orelse, dot)
        finally:
            self.vars.pop()

    def range(self, node: Branch, dot: Any) -> None:
        value = self.pipeline(Pipeline(node.pipe.line, node.pipe.commands), dot)
        if isinstance(value, Mapping):
            items = [(k, value[k]) for k in sorted(value, key=str)]
        elif isinstance(value, list | tuple):
            items = list(enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            items = [(i, i) for i in range(value)]
        elif value is None:
            items = []
        else:
            raise TemplateError(f"line {node.pipe.line}: range can't iterate over {go_str(value)}")
        if not items:
            self.run(node.orelse, dot)
            return
        names = node.pipe.decl
        for key, item in items:
            if len(names) == 1:
                self.vars[-1][names[0]] = item
            elif len(names) == 2:
                self.vars[-1][names[0]] = key
                self.vars[-1][names[1]] = item
            self.run(node.body, item)


def render_template(text: str, data: Any, funcs: Mapping[str, Callable[..., Any]] | None = None) -> str:
    """Render Go template `text` over `data` with the builtin and Sprig-like functions."""
    from istio_agent.envoy.bootstrap.template_funcs import FUNCS

    nodes = _Parser(text).parse()
    executor = _Exec({**FUNCS, **(funcs or {})}, data)
    executor.run(nodes, data)
    return "".join(executor.out)

"""Reading what TLC prints: TLA+ values, states, and the state graph of ``-dump dot,actionlabels``.

Values become plain, hashable Python values so that a model state projected into the same shape
compares equal to TLC's:

=====================  =========================================
TLA+                   Python
=====================  =========================================
``42``, ``-1``         ``int``
``"s"``                ``str``
``TRUE`` / ``FALSE``   ``bool``
``<<a, b>>``           ``tuple``
``{a, b}``             ``frozenset``
``[f |-> a, g |-> b]`` ``Record`` (field order does not matter)
``(1 :> a @@ 2 :> b)`` ``Function``
=====================  =========================================
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Function", "Record", "StateGraph", "parse_dot", "parse_state", "parse_value", "record"]


@dataclass(frozen=True)
class Record:
    """A TLA+ record: fields sorted by name."""

    fields: tuple[tuple[str, Any], ...]

    def __getitem__(self, name: str) -> Any:
        for key, value in self.fields:
            if key == name:
                return value
        raise KeyError(name)


@dataclass(frozen=True)
class Function:
    """A TLA+ function that TLC prints with ``:>`` and ``@@``."""

    pairs: frozenset[tuple[Any, Any]]


def record(**fields: Any) -> Record:
    """Build a ``Record`` from keyword arguments."""
    return Record(tuple(sorted(fields.items())))


_TOKEN = re.compile(r"""
    \s*(?:
      (?P<number>-?\d+)
    | (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<punct><<|>>|\|->|:>|@@|[\[\]{}(),])
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    )""", re.VERBOSE)


def _tokens(text: str) -> Iterator[tuple[str, str]]:
    position = 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise ValueError(f"cannot read a TLA+ value at {text[position:position + 40]!r}")
        position = match.end()
        kind = match.lastgroup
        assert kind is not None
        yield kind, match.group(kind)


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = list(_tokens(text))
        self.index = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise ValueError("unexpected end of TLA+ value")
        if expected is not None and token[1] != expected:
            raise ValueError(f"expected {expected!r}, found {token[1]!r}")
        self.index += 1
        return token

    def items(self, closing: str) -> list[Any]:
        values: list[Any] = []
        if self.peek() == ("punct", closing):
            self.take()
            return values
        while True:
            values.append(self.value())
            if self.take()[1] == closing:
                return values

    def value(self) -> Any:
        kind, text = self.take()
        if kind == "number":
            return int(text)
        if kind == "string":
            return bytes(text[1:-1], "utf-8").decode("unicode_escape")
        if kind == "name":
            if text in ("TRUE", "FALSE"):
                return text == "TRUE"
            return ("model-value", text)
        if text == "<<":
            return tuple(self.items(">>"))
        if text == "{":
            return frozenset(self.items("}"))
        if text == "[":
            fields: dict[str, Any] = {}
            while True:
                _, name = self.take()
                self.take("|->")
                fields[name] = self.value()
                if self.take()[1] == "]":
                    return Record(tuple(sorted(fields.items())))
        if text == "(":
            pairs = set()
            while True:
                key = self.value()
                self.take(":>")
                pairs.add((key, self.value()))
                if self.take()[1] == ")":
                    return Function(frozenset(pairs))
        raise ValueError(f"unexpected {text!r} in a TLA+ value")


def parse_value(text: str) -> Any:
    """One TLA+ value as TLC prints it."""
    parser = _Parser(text)
    result = parser.value()
    if parser.peek() is not None:
        raise ValueError(f"trailing text after a TLA+ value: {parser.peek()}")
    return result


_CONJUNCT = re.compile(r"^/\\ (\w+) = ", re.MULTILINE)


def parse_state(text: str, values: dict[str, Any] | None = None) -> dict[str, Any]:
    r"""A state printed as ``/\ var = value`` conjuncts (values may span lines).  ``values``, if given,
    caches parsed values by their text: the states of one graph repeat most of their variables' values."""
    matches = list(_CONJUNCT.finditer(text))
    state: dict[str, Any] = {}
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(text)
        printed = text[match.end():end]
        if values is None:
            state[match.group(1)] = parse_value(printed)
            continue
        value = values.get(printed, _MISSING)
        if value is _MISSING:
            value = values[printed] = parse_value(printed)
        state[match.group(1)] = value
    return state


_MISSING = object()


@dataclass
class StateGraph:
    """The graph TLC dumped: states by fingerprint and one edge per generated transition."""

    states: dict[str, Mapping[str, Any]]
    initial: set[str]
    edges: list[tuple[str, str, str]]


_NODE = re.compile(r'^(-?\d+) \[label="((?:[^"\\]|\\.)*)"(,style = filled)?\]', re.MULTILINE)
_EDGE = re.compile(r'^(-?\d+) -> (-?\d+) \[label="(\w+)"', re.MULTILINE)


def _unescape_dot(label: str) -> str:
    return re.sub(r'\\(.)', lambda m: "\n" if m.group(1) == "n" else m.group(1), label)


def parse_dot(path: Path) -> StateGraph:
    """Read ``tlc -dump dot,actionlabels`` output.  Stuttering self-loops (unlabelled) are skipped."""
    text = path.read_text()
    states: dict[str, Mapping[str, Any]] = {}
    initial: set[str] = set()
    values: dict[str, Any] = {}  # (parsing each distinct value text once made this 10x faster)
    for match in _NODE.finditer(text):
        states[match.group(1)] = parse_state(_unescape_dot(match.group(2)), values)
        if match.group(3):
            initial.add(match.group(1))
    edges = [(m.group(1), m.group(2), m.group(3)) for m in _EDGE.finditer(text)]
    return StateGraph(states, initial, edges)

"""The terms of a compiled requirement (a node's name, feature, typed attribute, the allocation's
context, a capacity, an amount) and the boolean expressions built of them, with SSS node-name ranges."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Union

from pilot.model.sss.errors import SssError
from pilot.model.sss.job import Property
from pilot.scheduler.attributes import (
    AttributeType,
    Condition,
    Relop,
    compare,
    evaluate,
    string_matches,
)
from pilot.scheduler.cluster import Cluster, MatchNode

#: Most node names one <Node> range may expand to.
MAX_RANGE_NAMES: Final = 100_000


# -- terms ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeSelector:
    """A Node property: exact names (List, Range, plain) or a regular expression (Pattern)."""

    names: frozenset[str] | None = None
    pattern: str | None = None

    def selects(self, node: MatchNode) -> bool:
        if self.names is not None:
            return node.name in self.names or (bool(node.hostname) and node.hostname in self.names)
        assert self.pattern is not None
        rx = _regex(self.pattern)
        return rx.fullmatch(node.name) is not None or (bool(node.hostname) and rx.fullmatch(node.hostname) is not None)


@dataclass(frozen=True, slots=True)
class NodeTerm:
    selector: NodeSelector
    negate: bool = False
    label: str = ""

    def test(self, node: MatchNode, cluster: Cluster) -> bool:
        return self.selector.selects(node) != self.negate

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True, slots=True)
class FeatureTerm:
    features: tuple[str, ...] = ()  # all of them
    pattern: str | None = None  # or: any feature matching this regex
    negate: bool = False
    label: str = ""

    def test(self, node: MatchNode, cluster: Cluster) -> bool:
        if self.pattern is not None:
            rx = _regex(self.pattern)
            ok = any(rx.fullmatch(f) for f in node.features)
        else:
            ok = all(f in node.features for f in self.features)
        return ok != self.negate

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True, slots=True)
class AttributeTerm:
    condition: Condition
    label: str = ""

    def test(self, node: MatchNode, cluster: Cluster) -> bool:
        g = cluster.global_values.effective(cluster.registry)
        h = node.values.effective(cluster.registry)
        return evaluate(cluster.registry, self.condition, g, h) is None

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True, slots=True)
class ContextTerm:
    """An allocation-wide SSS property (Queue, User, ...): the same verdict for every node."""

    name: str
    value: str
    negate: bool = False
    pattern: bool = False
    label: str = ""

    def test(self, node: MatchNode, cluster: Cluster) -> bool:
        have = cluster.context.get(self.name)
        if have is None:
            return False
        ok = string_matches(_CSTR, self.value, have, pattern=self.pattern)
        return ok != self.negate

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True, slots=True)
class CapacityTerm:
    """A consumable the node must be *configured* with (``context="Configured"``): not reserved."""

    key: str
    op: Relop
    amount: float
    label: str = ""

    def test(self, node: MatchNode, cluster: Cluster) -> bool:
        have = node.configured.get(self.key)
        if have is None:
            have = cluster.global_capacity.get(self.key)
        return have is not None and _cmp(self.op, have, self.amount)

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True, slots=True)
class AmountTerm:
    key: str
    op: Relop
    value: float
    label: str = ""

    def holds(self, assignment: Mapping[str, float | None]) -> bool:
        v = assignment.get(self.key)
        return v is not None and _cmp(self.op, v, self.value)

    def __str__(self) -> str:
        return self.label


NodeLeaf = Union[NodeTerm, FeatureTerm, AttributeTerm, ContextTerm, CapacityTerm]  # noqa: UP007
Leaf = Union[NodeLeaf, AmountTerm]  # noqa: UP007


@dataclass(frozen=True, slots=True)
class And:
    items: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Or:
    items: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Not:
    item: Expr


Expr = Union[And, Or, Not, NodeTerm, FeatureTerm, AttributeTerm, ContextTerm, CapacityTerm, AmountTerm]  # noqa: UP007
_CSTR: Final = AttributeType.STRING


def _cmp(op: Relop, a: float, b: float) -> bool:
    return compare(op, a, b)


def _regex(pattern: str) -> re.Pattern[str]:
    return _compile_regex(pattern)


_REGEX_CACHE: dict[str, re.Pattern[str]] = {}


def _compile_regex(pattern: str) -> re.Pattern[str]:
    rx = _REGEX_CACHE.get(pattern)
    if rx is None:
        rx = re.compile(pattern)
        if len(_REGEX_CACHE) > 4096:
            _REGEX_CACHE.clear()
        _REGEX_CACHE[pattern] = rx
    return rx


def leaves(e: Expr) -> Iterable[Leaf]:
    if isinstance(e, And | Or):
        for i in e.items:
            yield from leaves(i)
    elif isinstance(e, Not):
        yield from leaves(e.item)
    else:
        yield e


def holds_on_node(e: Expr, node: MatchNode, cluster: Cluster) -> bool:
    if isinstance(e, And):
        return all(holds_on_node(i, node, cluster) for i in e.items)
    if isinstance(e, Or):
        return any(holds_on_node(i, node, cluster) for i in e.items)
    if isinstance(e, Not):
        return not holds_on_node(e.item, node, cluster)
    assert not isinstance(e, AmountTerm)
    return e.test(node, cluster)


def holds_on_amounts(e: Expr, assignment: Mapping[str, float | None]) -> bool:
    if isinstance(e, And):
        return all(holds_on_amounts(i, assignment) for i in e.items)
    if isinstance(e, Or):
        return any(holds_on_amounts(i, assignment) for i in e.items)
    if isinstance(e, Not):
        return not holds_on_amounts(e.item, assignment)
    assert isinstance(e, AmountTerm)
    return e.holds(assignment)


def describe(e: Expr) -> str:
    if isinstance(e, And):
        return " And ".join(_paren(i) for i in e.items)
    if isinstance(e, Or):
        return " Or ".join(_paren(i) for i in e.items)
    if isinstance(e, Not):
        return "Not " + _paren(e.item)
    return str(e)


def _paren(e: Expr) -> str:
    return f"({describe(e)})" if isinstance(e, And | Or) else describe(e)


# -- node names ----------------------------------------------------------------------------------------

_RANGE_RE: Final = re.compile(r"\[([^\[\]]*)\]")


def expand_range(text: str, *, where: str = "<Node>") -> list[str]:
    """``node[5-23,77]`` -> node5 ... node23, node77. Several bracket groups multiply
    (``r[1-2]n[1-3]``); a leading zero pads (``n[01-10]``); commas outside brackets separate entries."""
    out: list[str] = []
    for entry in _split_outside_brackets(text):
        names = [""]
        pos = 0
        for m in _RANGE_RE.finditer(entry):
            prefix = entry[pos : m.start()]
            values = _range_values(m.group(1), where)
            names = [n + prefix + v for n in names for v in values]
            if len(names) > MAX_RANGE_NAMES:
                raise SssError(f"{text!r} names more than {MAX_RANGE_NAMES} nodes", element=where)
            pos = m.end()
        rest = entry[pos:]
        if "[" in rest or "]" in rest:
            raise SssError(f"{text!r} has an unbalanced bracket; write prefix[5-23,77]", element=where)
        out += [n + rest for n in names]
    if not out or any(not n for n in out):
        raise SssError(f"{text!r} names no node; write prefix[5-23,77]", element=where)
    return out


def _split_outside_brackets(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def _range_values(body: str, where: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        item = item.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not m:
            raise SssError(f"[{body}] holds {item!r}: write numbers and ranges like 5-23,77", element=where)
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise SssError(f"range {item} runs backwards; write {hi}-{lo}", element=where)
        if hi - lo > MAX_RANGE_NAMES:
            raise SssError(f"range {item} names more than {MAX_RANGE_NAMES} nodes", element=where)
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        out += [str(i).zfill(width) for i in range(lo, hi + 1)]
    return out


def node_selector(p: Property, where: str | None = None) -> NodeSelector:
    agg = p.get("aggregation")
    text = p.value.strip()
    if agg == "Pattern" or p.get("op") == "Match":
        check_regex(text, p, where)
        return NodeSelector(pattern=text)
    if agg == "Range":
        return NodeSelector(names=frozenset(expand_range(text, where=where or p.where)))
    if agg == "List":
        delim = p.get("delimiter") or ","
        return NodeSelector(names=frozenset(n.strip() for n in text.split(delim) if n.strip()))
    return NodeSelector(names=frozenset({text}))


def check_regex(text: str, p: Property, where: str | None = None) -> None:
    if len(text) > 1024:
        raise SssError("pattern is longer than 1024 characters", element=where or p.where)
    try:
        _compile_regex(text)
    except re.error as exc:
        raise SssError(f"{text!r} is not a valid regular expression ({exc})", element=where or p.where) from None

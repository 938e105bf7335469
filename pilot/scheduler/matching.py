"""Which nodes a task group may run on: SSS Requested properties compiled against typed attributes,
with the SGE job-category cache.

A task group's requirements come from its uncategorized properties (``<Feature>``, ``<Node>``,
``<Memory>`` ...) and its ``<Requested>`` ones, which carry ``op``, ``conj``, ``group`` and
``preference`` (SSS job spec 8.1). They split in two kinds:

- *node* requirements, true or false of one node: Node (List, Pattern, Range), Feature,
  Architecture, OperatingSystem, typed attributes (``<Extension type="Attribute" name=...>``), and
  allocation-wide ones (Machine, Queue, User, ...) checked against the pilot's global values;
- *amounts*: Processors, NodeCount, TaskCount, Duration and the per-task consumables Memory, Disk,
  Swap, Network and Resource. Alternatives (``conj="Or"``, ranges, preferences) among amounts are
  resolved into an ordered list of concrete :class:`Amounts` ("variants"), tried in turn.

``conj`` and ``group`` build a boolean expression (And and Nand bind tighter than Or and Nor, as in
most languages; Nand is "and not", Nor "or not"); each top-level conjunct must be about nodes or
about amounts, not both. Terms with a ``preference`` are taken out of the expression: positive ones
of one property name are alternatives of which one must hold, negative ones are wishes; both rank
nodes (and order variants) by the weights, as a ratio to the sum of the weights of that name. Nodes
of equal weight are ranked by ``NodeRequirement.best``, attributes a front end prefers high or low
(JRDL: the fastest clock, then the most free processors, then the most free memory).

The :class:`Matcher` caches, per category (identical compiled requirement and per-task need), which
nodes match and which do not, keyed on each node's version, so thousands of identical tasks are
matched once (SGE complex-attribute spec, section 5, "Result caching").
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Final

from pilot.model.sss.errors import SssError
from pilot.model.sss.job import BYTE_CONSUMABLES, EffectiveTaskGroup, Properties, Property, amount
from pilot.scheduler.attributes import (
    ComplexAttributeError,
    Condition,
    Relop,
)
from pilot.scheduler.cluster import Cluster, MatchNode
from pilot.scheduler.terms import (
    AmountTerm,
    And,
    AttributeTerm,
    CapacityTerm,
    ContextTerm,
    Expr,
    FeatureTerm,
    Leaf,
    NodeSelector,
    NodeTerm,
    Not,
    Or,
    check_regex,
    describe,
    expand_range,
    holds_on_amounts,
    holds_on_node,
    leaves,
    node_selector,
)

#: Amount names resolved per task group ("Resource:<name>[:<type>]" for Resources).
SCOPE_AMOUNTS: Final = ("Processors", "NodeCount", "TaskCount", "Duration")
PER_TASK_AMOUNTS: Final = ("Memory", "Disk", "Swap", "Network")
#: SSS properties checked against the allocation's global values, not per node.
GLOBAL_NAMES: Final = frozenset(
    {
        "Machine",
        "Queue",
        "Partition",
        "QualityOfService",
        "Reservation",
        "ResourceManagerType",
        "User",
        "Group",
        "GlobalUser",
        "Project",
        "Account",
    }
)
_SSS_OPS: Final = {
    "EQ": Relop.EQ,
    "NE": Relop.NE,
    "LT": Relop.LT,
    "GT": Relop.GT,
    "LE": Relop.LE,
    "GE": Relop.GE,
}
MAX_VARIANTS: Final = 16
MAX_CATEGORIES: Final = 10_000


# -- compiling requirements ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Preference:
    """One preferred alternative and its weight (positive: one of the set must hold)."""

    term: Leaf
    weight: int


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    """The node side of a task group's request: hashable, so it keys the category cache."""

    expr: Expr | None = None  # hard requirement on a node (None: any node)
    preferences: tuple[tuple[str, tuple[Preference, ...]], ...] = ()  # per property name
    #: Attributes the request names (typed attributes and consumables): a node offering a FORCED
    #: attribute takes only requests that name it.
    asked: frozenset[str] = frozenset()
    #: Typed attributes that rank the matching nodes after the preferences, in turn: (name, higher
    #: first). A node that reports no value of one ranks last on it (JRDL: clock, free processors, memory).
    best: tuple[tuple[str, bool], ...] = ()

    def rank(self, node: MatchNode, cluster: Cluster) -> tuple[float, ...]:
        """The node's sort key (lower first): preference weight met, then each of ``best``."""
        key = [-self.score(node, cluster)]
        if self.best:
            values = node.values.effective(cluster.registry)
            for name, higher in self.best:
                v = values.get(name)
                if isinstance(v, bool) or not isinstance(v, int | float):
                    key.append(math.inf)
                else:
                    key.append(-v if higher else v)
        return tuple(key)

    def score(self, node: MatchNode, cluster: Cluster) -> float:
        """The preference weight a node meets, as a ratio per property name, summed."""
        total = 0.0
        for _, prefs in self.preferences:
            if not prefs or isinstance(prefs[0].term, AmountTerm):
                continue
            denom = sum(abs(p.weight) for p in prefs)
            met = sum(abs(p.weight) for p in prefs if holds_on_node(p.term, node, cluster))
            total += met / denom if denom else 0.0
        return total

    def __str__(self) -> str:
        return "any node" if self.expr is None else describe(self.expr)


@dataclass(frozen=True, slots=True)
class Amounts:
    """One concrete choice of the amounts a task group asks (a variant)."""

    values: tuple[tuple[str, float], ...]

    def get(self, key: str) -> float | None:
        for k, v in self.values:
            if k == key:
                return v
        return None

    def per_task(self) -> dict[str, float]:
        return {k: v for k, v in self.values if k not in SCOPE_AMOUNTS}


@dataclass(frozen=True, slots=True)
class Requirements:
    node: NodeRequirement
    variants: tuple[Amounts, ...]  # in the order to try


@dataclass(slots=True)
class _Chain:
    """Requested properties as written: (conj, group, term, property) in order."""

    items: list[tuple[str, int, Expr, Property]] = field(default_factory=list)


def compile_requirements(
    properties: Properties, cluster: Cluster, *, where: str = "TaskGroup", scope: bool = True
) -> Requirements:
    """The node requirement and amount variants of one (effective) set of properties.

    ``scope`` False leaves out Processors/NodeCount/TaskCount (the job level of a multi-group job).
    Raises :class:`SssError` naming the element for anything that cannot be compiled.
    """
    hard: list[Expr] = []
    prefs: dict[str, list[Preference]] = {}
    # Uncategorized properties are plain requirements (EQ), each a conjunct.
    for p in properties.items:
        hard += _terms(p, cluster, where, requested=False, scope=scope)
    chain = _Chain()
    for p in properties.requested or ():
        terms = list(_terms(p, cluster, where, requested=True, scope=scope))
        if not terms and not int(p.get("group") or 0):
            continue
        pref = p.get("preference")
        if pref is not None:
            if int(p.get("group") or 0):
                raise SssError(
                    "a preference cannot open or close a group; put preferences outside groups",
                    element=_w(where, p),
                )
            weight = int(pref)
            if weight == 0:
                raise SssError("preference=0 has no weight; use a positive or negative weight", element=_w(where, p))
            for t in terms:
                key = t.key if isinstance(t, AmountTerm) else _prop_key(p)
                prefs.setdefault(key, []).append(Preference(t, weight))
            continue
        # A property that does not constrain placement still opens or closes its groups: it is True.
        term: Expr = terms[0] if len(terms) == 1 else And(tuple(terms))
        chain.items.append((p.get("conj") or "And", int(p.get("group") or 0), term, p))
    if chain.items:
        hard.append(_parse_chain(chain, where))
    node_parts: list[Expr] = []
    amount_parts: list[Expr] = []
    for conjunct in _conjuncts(hard):
        kinds = {isinstance(leaf, AmountTerm) for leaf in leaves(conjunct)}
        if len(kinds) > 1:
            raise SssError(
                f"the requirement {describe(conjunct)} mixes amounts (Processors, Memory, ...) with node "
                "properties (Node, Feature, ...) under Or or Not; state them as separate requirements",
                element=where,
            )
        (amount_parts if True in kinds else node_parts).append(conjunct)
    preferences: list[tuple[str, tuple[Preference, ...]]] = []
    for name, plist in sorted(prefs.items()):
        signs = {p.weight > 0 for p in plist}
        if len(signs) > 1:
            raise SssError(
                f"<{name}> preferences mix positive and negative weights; use one sign per property",
                element=where,
            )
        preferences.append((name, tuple(plist)))
        if plist[0].weight > 0 and not isinstance(plist[0].term, AmountTerm):
            alts = tuple(p.term for p in plist)
            node_parts.append(alts[0] if len(alts) == 1 else Or(alts))
    expr: Expr | None = None
    if node_parts:
        expr = node_parts[0] if len(node_parts) == 1 else And(tuple(node_parts))
    node_req = NodeRequirement(expr, tuple(preferences))
    variants = _variants(amount_parts, preferences, where)
    return Requirements(node_req, variants)


def _w(where: str, p: Property) -> str:
    return f"{where}/{p.where}"


def _conjuncts(items: list[Expr]) -> list[Expr]:
    out: list[Expr] = []
    for e in items:
        if isinstance(e, And):
            out += _conjuncts(list(e.items))
        else:
            out.append(e)
    return out


def _parse_chain(chain: _Chain, where: str) -> Expr:
    """``conj`` and ``group`` into an expression: groups are parentheses, And/Nand before Or/Nor."""
    tokens: list[object] = []
    depth = 0
    for i, (conj, group, term, p) in enumerate(chain.items):
        if i:
            tokens.append(conj)
        opens, closes = max(group, 0), max(-group, 0)
        tokens += ["("] * opens
        tokens.append(term)
        tokens += [")"] * closes
        depth += opens
        depth -= closes
        if depth < 0:
            raise SssError(
                f'group="{group}" closes a group that was never opened; open it with a positive group on an '
                "earlier property (the spec: positive opens, negative closes)",
                element=_w(where, p),
                line=p.line,
            )
    if depth:
        last = chain.items[-1][3]
        raise SssError(
            f"{depth} group(s) opened in <Requested> are never closed; close them with a negative group= "
            "on the last property of the group",
            element=_w(where, last),
            line=last.line,
        )
    pos = 0

    def expr() -> Expr:
        nonlocal pos
        items = [and_expr()]
        while pos < len(tokens) and tokens[pos] in ("Or", "Nor"):
            neg = tokens[pos] == "Nor"
            pos += 1
            rhs = and_expr()
            items.append(Not(rhs) if neg else rhs)
        return items[0] if len(items) == 1 else Or(tuple(items))

    def and_expr() -> Expr:
        nonlocal pos
        items = [unary()]
        while pos < len(tokens) and tokens[pos] in ("And", "Nand"):
            neg = tokens[pos] == "Nand"
            pos += 1
            rhs = unary()
            items.append(Not(rhs) if neg else rhs)
        return items[0] if len(items) == 1 else And(tuple(items))

    def unary() -> Expr:
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            e = expr()
            pos += 1  # ")"
            return e
        return tok  # type: ignore[return-value]

    return expr()


def _op(p: Property, requested: bool) -> str:
    return (p.get("op") or "EQ") if requested else "EQ"


def _terms(p: Property, cluster: Cluster, where: str, *, requested: bool, scope: bool) -> list[Leaf]:
    """The leaf terms one property stands for (none when it does not constrain placement)."""
    op = _op(p, requested)
    w = _w(where, p)
    label = _label(p, op)
    name = p.name
    try:
        if name in ("Processors", "NodeCount", "TaskCount", "Duration"):
            if name != "Duration" and not scope:
                return []
            if op == "Match":
                raise SssError(
                    'op="Match" needs a pattern property; an amount takes EQ, NE, LT, GT, LE or GE', element=w
                )
            if name == "Processors" and (p.get("context") == "Configured"):
                return [CapacityTerm("Processors", _SSS_OPS[op] if op != "EQ" else Relop.GE, amount(p), label)]
            return [AmountTerm(name, _SSS_OPS[op], float(p.value), label)]
        if name in PER_TASK_AMOUNTS or name == "Resource":
            key = _amount_key(p)
            if op == "Match":
                raise SssError(
                    'op="Match" needs a pattern property; an amount takes EQ, NE, LT, GT, LE or GE', element=w
                )
            value = amount(p)
            if p.get("context") == "Configured":
                return [CapacityTerm(key, _SSS_OPS[op] if op != "EQ" else Relop.GE, value, label)]
            if op in ("LT", "LE", "NE"):
                raise SssError(
                    f'op="{op}" on a consumable cannot be reserved: a task holds what it asks; use EQ or GE',
                    element=w,
                )
            return [AmountTerm(key, _SSS_OPS[op], value, label)]
        if name == "Node":
            if p.get("count") is not None and scope:
                count = int(p.get("count") or "0")
                out: list[Leaf] = [AmountTerm("NodeCount", Relop.EQ, float(count), f"Node count={count}")]
            else:
                out = []
            if op not in ("EQ", "NE", "Match"):
                raise SssError(f'op="{op}" cannot compare node names; use EQ, NE or Match', element=w)
            return [NodeTerm(node_selector(p, w), op == "NE", label), *out]
        if name == "Feature":
            if op not in ("EQ", "NE", "Match"):
                raise SssError(f'op="{op}" cannot compare features; use EQ, NE or Match', element=w)
            text = p.value.strip()
            if p.get("aggregation") == "Pattern" or op == "Match":
                check_regex(text, p, w)
                return [FeatureTerm(pattern=text, negate=op == "NE", label=label)]
            delim = (p.get("delimiter") or ",") if p.get("aggregation") == "List" else None
            feats = tuple(f.strip() for f in (text.split(delim) if delim else [text]) if f.strip())
            return [FeatureTerm(features=feats, negate=op == "NE", label=label)]
        if name in ("Architecture", "OperatingSystem"):
            attr = "arch" if name == "Architecture" else "opsys"
            return [_attribute(cluster, attr, op, p.value.strip(), label, w)]
        if name == "Extension" and p.get("type") == "Attribute":
            attr_name = p.get("name") or ""
            return [
                _attribute(cluster, attr_name, op if requested and p.get("op") else None, p.value.strip(), label, w)
            ]
        if name in GLOBAL_NAMES and requested:
            if name not in cluster.context:
                raise SssError(
                    f"a Requested <{name}> cannot be checked: this pilot has no {name} value; remove it "
                    f"(or set [global] {name} in the pilot config)",
                    element=w,
                )
            if op not in ("EQ", "NE", "Match"):
                raise SssError(f'op="{op}" cannot compare {name}; use EQ, NE or Match', element=w)
            return [ContextTerm(name, p.value.strip(), op == "NE", op == "Match", label)]
    except (ValueError, ComplexAttributeError) as exc:
        if isinstance(exc, SssError):
            raise
        raise SssError(str(exc), element=w) from None
    return []


_OP_SYMBOL: Final = {"EQ": "=", "NE": "!=", "LT": "<", "GT": ">", "LE": "<=", "GE": ">=", "Match": "~"}


def _label(p: Property, op: str) -> str:
    """How a requirement is shown in errors and explanations: ``Feature=Jumbo-Frame``."""
    name = p.name
    if name == "Resource":
        name = _show_key(_amount_key(p))
    elif name == "Extension":
        name = p.get("name") or name
    value = p.value.strip()
    if p.get("units"):
        value += f" {p.get('units')}"
    if p.get("aggregation"):
        value += f" ({p.get('aggregation')})"
    return f"{name}{_OP_SYMBOL.get(op, '=')}{value}"


def _prop_key(p: Property) -> str:
    """Preferences are weighed among the properties of one name (one Resource, one attribute)."""
    if p.name in PER_TASK_AMOUNTS or p.name == "Resource":
        return _amount_key(p)
    if p.name == "Extension":
        return f"Extension:{p.get('name')}"
    return p.name


def _attribute(cluster: Cluster, name: str, op: str | None, value: str, label: str, where: str) -> AttributeTerm:
    try:
        if op == "Match":
            cond = Condition.sss(cluster.registry, name, None, value, match=True)
        else:
            cond = Condition.sss(cluster.registry, name, None if op is None else _SSS_OPS[op], value)
    except ComplexAttributeError as exc:
        raise SssError(str(exc), element=where) from None
    return AttributeTerm(cond, label)


def _amount_key(p: Property) -> str:
    if p.name != "Resource":
        return p.name
    t = p.get("type")
    return f"Resource:{p.get('name')}" + (f":{t}" if t else "")


def _variants(
    parts: list[Expr], preferences: list[tuple[str, tuple[Preference, ...]]], where: str
) -> tuple[Amounts, ...]:
    """Concrete amount choices satisfying ``parts``, best first: preferred values by weight, then
    smallest (the least that satisfies starts soonest)."""
    amount_prefs = [(k, ps) for k, ps in preferences if ps and isinstance(ps[0].term, AmountTerm)]
    candidates: dict[str, set[float | None]] = {}
    for e in parts:
        for leaf in leaves(e):
            assert isinstance(leaf, AmountTerm)
            candidates.setdefault(leaf.key, set()).update(_candidates(leaf))
    for key, ps in amount_prefs:
        values: set[float | None] = set()
        for pr in ps:
            assert isinstance(pr.term, AmountTerm)
            values.update(_candidates(pr.term))
        if ps[0].weight < 0:
            values.update(candidates.get(key, {None}))
        candidates[key] = values
    if not candidates:
        return (Amounts(()),)
    keys = sorted(candidates)
    combos = 1
    for k in keys:
        combos *= len(candidates[k])
    if combos > 4096:
        raise SssError("the Requested alternatives allow too many combinations; simplify them", element=where)
    good: list[tuple[float, tuple[float, ...], Amounts]] = []
    for combo in itertools.product(*(sorted(candidates[k], key=_none_last) for k in keys)):
        assignment = dict(zip(keys, combo, strict=True))
        if not all(holds_on_amounts(e, assignment) for e in parts):
            continue
        score = 0.0
        ok = True
        for _key, ps in amount_prefs:
            denom = sum(abs(p.weight) for p in ps)
            met = sum(abs(p.weight) for p in ps if isinstance(p.term, AmountTerm) and p.term.holds(assignment))
            if ps[0].weight > 0 and not met:
                ok = False
            score += met / denom
        if not ok:
            continue
        vals = tuple((k, v) for k, v in zip(keys, combo, strict=True) if v is not None)
        good.append((-score, tuple(_none_last(v) for v in combo), Amounts(vals)))
    if not good:
        shown = " And ".join(describe(e) for e in parts) or "the preferences"
        raise SssError(f"no amounts satisfy {shown}; the requirements contradict each other", element=where)
    good.sort(key=lambda g: (g[0], g[1]))
    out: list[Amounts] = []
    for _, _, a in good:
        if a not in out:
            out.append(a)
    if len(out) > MAX_VARIANTS:
        out = out[:MAX_VARIANTS]
    return tuple(out)


def _none_last(v: float | None) -> float:
    return math.inf if v is None else v


def _candidates(t: AmountTerm) -> list[float | None]:
    integral = t.key in ("Processors", "NodeCount", "TaskCount") or t.value.is_integer()
    step_up = t.value + 1 if integral else math.nextafter(t.value, math.inf)
    step_down = t.value - 1 if integral else math.nextafter(t.value, -math.inf)
    if t.op is Relop.GT:
        return [step_up]
    if t.op is Relop.LT:
        return [step_down] if step_down >= 0 else []
    if t.op is Relop.NE:
        return []
    return [t.value]


def compile_task_group(tg: EffectiveTaskGroup, cluster: Cluster) -> Requirements:
    return compile_requirements(tg.properties, cluster, where=tg.where)


# -- the matcher -----------------------------------------------------------------------------------------

Need = tuple[tuple[str, float], ...]  # per-task consumables (static check against configured capacity)


@dataclass(slots=True)
class _Entry:
    epoch: int = -1
    verdicts: dict[str, tuple[tuple[int, int], str | None, tuple[float, ...]]] = field(default_factory=dict)
    ranked: list[MatchNode] = field(default_factory=list)
    global_reason: str | None = None
    hits: int = 0


class Matcher:
    """Static matching with the job-category cache.

    ``candidates(requirement, need)`` is the ranked list of nodes that match ``requirement`` and are
    configured with at least ``need`` per task. The verdict of every (category, node) pair is kept
    with the node's version; when the cluster changes only changed nodes are looked at again, and
    when it has not changed the list is returned as is.
    """

    def __init__(self, cluster: Cluster, *, idle: bool = False) -> None:
        self.cluster = cluster
        #: Whether ``cluster`` is the nodes as measured idle (what can ever fit): its messages say so.
        self.idle = idle
        self._cache: dict[tuple[NodeRequirement, Need], _Entry] = {}
        self.evaluations = 0  # node verdicts computed (for tests and the benchmark)

    def forget(self) -> None:
        self._cache.clear()

    def candidates(self, req: NodeRequirement, need: Need = ()) -> list[MatchNode]:
        entry = self._cache.get((req, need))
        if entry is None:
            if len(self._cache) >= MAX_CATEGORIES:
                self._cache.clear()  # categories come and go with the queue; start afresh
            entry = self._cache[(req, need)] = _Entry()
        if entry.epoch == self.cluster.epoch:
            entry.hits += 1
            return entry.ranked
        self._refresh(entry, req, need)
        return entry.ranked

    def _refresh(self, entry: _Entry, req: NodeRequirement, need: Need) -> None:
        c = self.cluster
        live = c.nodes
        for name in [n for n in entry.verdicts if n not in live]:
            del entry.verdicts[name]
        for node in live.values():
            v = entry.verdicts.get(node.name)
            if v is not None and v[0] == node.version:
                continue
            reason = self.mismatch(req, need, node)
            rank = req.rank(node, c) if reason is None else ()
            entry.verdicts[node.name] = (node.version, reason, rank)
        fitting = [(i, n) for i, n in enumerate(live.values()) if entry.verdicts[n.name][1] is None]
        fitting.sort(key=lambda p: (entry.verdicts[p[1].name][2], p[0]))
        entry.ranked = [n for _, n in fitting]
        entry.epoch = c.epoch

    def mismatch(self, req: NodeRequirement, need: Need, node: MatchNode) -> str | None:
        """Why ``node`` can never take a task of this category, or None. Uncached."""
        self.evaluations += 1
        c = self.cluster
        for key, value in need:
            have = node.configured.get(key)
            if have is None and key in c.global_capacity:
                continue  # a global pool, checked once per job at placement
            if have is None:
                return f"it has no {_show_key(key)}"
            if have < value:
                return f"each task needs {_show_amount(key, value)} but it has {_show_amount(key, have)}"
        for d in c.forced:
            if d.name not in req.asked and c.offers_attribute(d.name, node):
                return f"it offers {d.name}, which a job must request to run there (requestable = FORCED)"
        if req.expr is None:
            return None
        if holds_on_node(req.expr, node, c):
            return None
        for conjunct in _conjuncts([req.expr]):
            if not holds_on_node(conjunct, node, c):
                return self._why(conjunct, node)
        return "the requirement does not hold"  # pragma: no cover

    def _why(self, conjunct: Expr, node: MatchNode) -> str:
        """Why a conjunct fails on a node: for a typed attribute the value seen, and whether it is a
        load value (then the job waits for the load to change, unless even an idle node fails it)."""
        label = describe(conjunct)
        if not isinstance(conjunct, AttributeTerm):
            return f"{label} does not hold"
        c = self.cluster
        name = conjunct.condition.name
        host = node.values.effective(c.registry)
        value = host.get(name, c.global_values.effective(c.registry).get(name))
        if value is None:
            return f"{label} cannot be checked: the node reports no {name}"
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        reason = f"{label} does not hold: its {name} is {shown}"
        d = c.registry.get(name)
        if d is not None and d.load_value and name in host:
            reason += " even idle" if self.idle else " now (a load value: the job waits for the node's load)"
        return reason

    def explain(self, req: NodeRequirement, need: Need = ()) -> list[str]:
        """Why no node (or which nodes) cannot take this category: one line per reason, with the
        nodes it excludes, for ``pilot explain``."""
        c = self.cluster
        if not c.nodes:
            return ["no node has registered yet"]
        by_reason: dict[str, list[str]] = {}
        for node in c.nodes.values():
            r = self.mismatch(req, need, node)
            if r is not None:
                by_reason.setdefault(r, []).append(node.name)
        out = []
        for reason, names in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            out.append(f"{len(names)} of {len(c.nodes)} node(s) excluded because {reason}: {shown}")
        return out

    def stats(self) -> dict[str, int]:
        return {"categories": len(self._cache), "evaluations": self.evaluations}


def _show_key(key: str) -> str:
    if key.startswith("Resource:"):
        return "Resource " + key.split(":", 1)[1]
    return key


def _show_amount(key: str, v: float) -> str:
    if key in BYTE_CONSUMABLES:
        return f"{v / 2**20:g} MB {key}"
    return f"{v:g} {_show_key(key)}"


def uncached_candidates(matcher: Matcher, req: NodeRequirement, need: Need = ()) -> list[MatchNode]:
    """The same answer as :meth:`Matcher.candidates` without the cache: the benchmark's baseline."""
    c = matcher.cluster
    fitting = [(i, n) for i, n in enumerate(c.nodes.values()) if matcher.mismatch(req, need, n) is None]
    fitting.sort(key=lambda p: (req.rank(p[1], c), p[0]))
    return [n for _, n in fitting]


__all__ = [
    "Amounts",
    "AttributeTerm",
    "CapacityTerm",
    "Cluster",
    "ContextTerm",
    "FeatureTerm",
    "MatchNode",
    "Matcher",
    "NodeRequirement",
    "NodeSelector",
    "NodeTerm",
    "Requirements",
    "compile_requirements",
    "expand_range",
]

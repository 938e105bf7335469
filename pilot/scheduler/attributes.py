"""Typed resource attributes in the style of SGE 6 complexes (``../shared/specs/sge6-complex-attributes.txt``).

An attribute has a name, a shortcut, a type, a relational operator, a requestable flag, a consumable
flag and (consumables only) a default. Values live on two levels: *global* (the whole allocation,
e.g. a license pool) and *host* (one node; fixed values from the site config, the facts its agent
registered with and the load values it measures). Matching is strict-hierarchical as the spec says:
an attribute defined on a level must match there; a level that lacks it is skipped; defined nowhere
means the request cannot be met.

Definitions are checked against the spec's restrictions when they are made, so a bad site config
fails at ``pilot up`` with the attribute and the fix named, not at the first matching pass.

Two points where the SGE document leaves a choice, decided here:

- Comparison direction. An SGE request ``-l name=value`` is tested as ``requested RELOP provided``
  (spec example E1: a request of 10 fits ``t01 <= 20``). SSS requested properties carry their own
  ``op`` meaning ``provided OP requested``. :class:`Condition` stores the second form; SGE-style
  requests are flipped on the way in (:meth:`Condition.sge`).
- "Per job" vs "per slot" consumables. The document calls slot-multiplied consumables "per job
  attributes" and asks for a flag to debit a consumable once per job (licenses). Here
  ``ConsumableKind.SLOT`` is debited once per task and ``ConsumableKind.JOB`` once per job.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from typing import Any, Final

Value = str | float | bool


class ComplexAttributeError(ValueError):
    """A definition, value or request that breaks the attribute rules; the message names it and the fix."""


class AttributeType(StrEnum):
    STRING = "string"
    CSTRING = "cstring"
    RESTRING = "restring"
    HOST = "host"
    INT = "int"
    DOUBLE = "double"
    BOOLEAN = "boolean"
    MEMORY = "memory"
    TIME = "time"

    @property
    def numeric(self) -> bool:
        return self in _NUMERIC

    @property
    def textual(self) -> bool:
        return self in _TEXTUAL


_NUMERIC: Final = frozenset({AttributeType.INT, AttributeType.DOUBLE, AttributeType.MEMORY, AttributeType.TIME})
_TEXTUAL: Final = frozenset({AttributeType.STRING, AttributeType.CSTRING, AttributeType.RESTRING, AttributeType.HOST})


class Relop(StrEnum):
    EQ = "=="
    NE = "!="
    LE = "<="
    LT = "<"
    GE = ">="
    GT = ">"

    @property
    def flipped(self) -> Relop:
        """The operator with its operands swapped: ``a <= b`` is ``b >= a``."""
        return _FLIP[self]

    @classmethod
    def parse(cls, text: str) -> Relop:
        t = text.strip()
        if t == "=<":  # the spelling the SGE document itself uses
            t = "<="
        if t == "=>":
            t = ">="
        for r in cls:
            if r.value == t:
                return r
        raise ComplexAttributeError(f"relational operator {text!r} is not known: use one of ==, !=, <=, <, >=, >")


_FLIP: Final = {
    Relop.EQ: Relop.EQ,
    Relop.NE: Relop.NE,
    Relop.LE: Relop.GE,
    Relop.LT: Relop.GT,
    Relop.GE: Relop.LE,
    Relop.GT: Relop.LT,
}

#: Operators each type allows (spec section 2, "Relational operator").
ALLOWED_RELOPS: Final[Mapping[AttributeType, frozenset[Relop]]] = {
    **{t: frozenset({Relop.EQ, Relop.NE}) for t in _TEXTUAL},
    AttributeType.BOOLEAN: frozenset({Relop.EQ}),
    **{t: frozenset(Relop) for t in _NUMERIC},
}


class Requestable(StrEnum):
    YES = "YES"
    NO = "NO"
    FORCED = "FORCED"


class ConsumableKind(StrEnum):
    NO = "NO"
    SLOT = "SLOT"  # debited once per task (slot)
    JOB = "JOB"  # debited once per job


class Level(StrEnum):
    GLOBAL = "global"
    HOST = "host"


# -- values -------------------------------------------------------------------------------------------

_MEM_RE: Final = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtT]?)\s*$")
_MEM_FACTOR: Final = {
    "": 1,
    "k": 1000,
    "K": 1024,
    "m": 1000**2,
    "M": 1024**2,
    "g": 1000**3,
    "G": 1024**3,
    "t": 1000**4,
    "T": 1024**4,
}
_INFINITY: Final = frozenset({"infinity", "inf", "unlimited"})


def parse_memory(text: str) -> float:
    """Bytes of an SGE memory value: a number with an optional multiplier, k/m/g/t = 1000^n and
    K/M/G/T = 1024^n (sge_types(1)); ``INFINITY`` for no limit."""
    if text.strip().lower() in _INFINITY:
        return math.inf
    m = _MEM_RE.match(text)
    if not m:
        raise ComplexAttributeError(
            f"{text!r} is not a memory value: write a number with an optional K, M, G or T (e.g. 4G)"
        )
    return float(m.group(1)) * _MEM_FACTOR[m.group(2)]


def parse_time(text: str) -> float:
    """Seconds of an SGE time value: ``[[hours:]minutes:]seconds`` (empty fields are 0) or ``INFINITY``."""
    t = text.strip()
    if t.lower() in _INFINITY:
        return math.inf
    parts = t.split(":")
    if len(parts) > 3 or not any(parts):
        raise ComplexAttributeError(
            f"{text!r} is not a time value: write seconds or hours:minutes:seconds (e.g. 1:30:00)"
        )
    total = 0.0
    for p in parts:
        p = p.strip()
        if p and not re.fullmatch(r"[0-9]*\.?[0-9]+", p):
            raise ComplexAttributeError(f"{text!r} is not a time value: write seconds or hours:minutes:seconds")
        total = total * 60 + (float(p) if p else 0.0)
    return total


def parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("true", "1", "yes"):
        return True
    if t in ("false", "0", "no"):
        return False
    raise ComplexAttributeError(f"{text!r} is not a boolean: write true or false")


def parse_value(kind: AttributeType, raw: str | float | bool) -> Value:
    """A raw value (from XML text, config TOML or a load report) as the type says."""
    if isinstance(raw, bool):
        if kind is AttributeType.BOOLEAN:
            return raw
        raise ComplexAttributeError(f"{raw!r} is a boolean but the attribute is {kind.value}")
    if isinstance(raw, int | float):
        if kind.numeric:
            if kind is AttributeType.INT and not float(raw).is_integer():
                raise ComplexAttributeError(f"{raw!r} is not an integer")
            return float(raw)
        if kind is AttributeType.BOOLEAN:
            raise ComplexAttributeError(f"{raw!r} is not a boolean: write true or false")
        return str(raw)
    text = str(raw)
    if kind is AttributeType.MEMORY:
        return parse_memory(text)
    if kind is AttributeType.TIME:
        return parse_time(text)
    if kind is AttributeType.BOOLEAN:
        return parse_bool(text)
    if kind is AttributeType.INT:
        t = text.strip()
        if t.lower() in _INFINITY:
            return math.inf
        try:
            return float(int(t, 0))
        except ValueError:
            raise ComplexAttributeError(f"{text!r} is not an integer") from None
    if kind is AttributeType.DOUBLE:
        try:
            return float(text)
        except ValueError:
            raise ComplexAttributeError(f"{text!r} is not a number") from None
    return text.strip() if kind is not AttributeType.STRING else text


# -- string matching ----------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def compile_pattern(pattern: str, *, caseless: bool = False) -> re.Pattern[str]:
    """The SGE RESTRING syntax as a Python regex (spec, "String matching").

    ``*`` any run of characters, ``?`` exactly one character, ``.`` itself, ``\\`` escapes ``\\``,
    ``*`` and ``?``, ``[..]`` a set or range of characters, and ``|`` a logical or that is only
    understood at the top level and cannot be escaped: ``[linux|solaris]`` is the two alternatives
    ``[linux`` and ``solaris]``, each taken literally where a bracket does not close.
    """
    alternatives = [_translate(alt) for alt in pattern.split("|")]
    return re.compile("(?:" + "|".join(alternatives) + r")\Z", re.IGNORECASE if caseless else 0)


def _translate(p: str) -> str:
    out: list[str] = []
    i, n = 0, len(p)
    while i < n:
        c = p[i]
        if c == "\\":
            if i + 1 < n and p[i + 1] in "\\*?":
                out.append(re.escape(p[i + 1]))
                i += 2
            else:
                out.append(re.escape("\\"))
                i += 1
        elif c == "*":
            out.append(".*")
            i += 1
        elif c == "?":
            out.append(".")
            i += 1
        elif c == "[":
            end = p.find("]", i + 2)  # "[]" is not a set: the first ']' after one character closes it
            if end < 0:
                out.append(re.escape(c))
                i += 1
            else:
                out.append("[" + _set_body(p[i + 1 : end]) + "]")
                i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _set_body(body: str) -> str:
    parts: list[str] = []
    for i, ch in enumerate(body):
        if ch == "-" and 0 < i < len(body) - 1:
            parts.append("-")
        else:
            parts.append(re.escape(ch) if ch in "\\]^-[" else ch)
    return "".join(parts)


def string_matches(kind: AttributeType, requested: str, provided: str, *, pattern: bool = False) -> bool:
    """Whether ``provided`` equals ``requested`` under the type's rule: exact for string, caseless for
    cstring and host, the :func:`compile_pattern` syntax for restring (or when ``pattern`` asks)."""
    caseless = kind in (AttributeType.CSTRING, AttributeType.HOST)
    if pattern or kind is AttributeType.RESTRING:
        return compile_pattern(requested, caseless=caseless).match(provided) is not None
    if caseless:
        return requested.casefold() == provided.casefold()
    return requested == provided


# -- definitions --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AttributeDefinition:
    """One complex attribute. Construction validates it against the spec's restrictions."""

    name: str
    shortcut: str
    type: AttributeType
    relop: Relop
    requestable: Requestable = Requestable.YES
    consumable: ConsumableKind = ConsumableKind.NO
    default: Value | None = None
    builtin: bool = False
    load_value: bool = False  # measured on each node and refreshed by heartbeats

    def __post_init__(self) -> None:
        where = f"attribute {self.name!r}"
        if not self.name or not _NAME_RE.match(self.name):
            raise ComplexAttributeError(
                f"{where}: a name is letters, digits, '_', '.', ':' or '-' and starts with a letter"
            )
        if self.shortcut and not _NAME_RE.match(self.shortcut):
            raise ComplexAttributeError(f"{where}: shortcut {self.shortcut!r} is not a valid name")
        if self.consumable is not ConsumableKind.NO:
            if not self.type.numeric:
                raise ComplexAttributeError(
                    f"{where}: only int, double, memory and time attributes can be consumable, not {self.type.value}"
                )
            if self.relop is not Relop.LE:
                raise ComplexAttributeError(
                    f"{where}: a consumable's relational operator must be <=, not {self.relop.value}"
                )
            if self.requestable is Requestable.NO and self.default is None:
                raise ComplexAttributeError(f"{where}: a consumable that cannot be requested needs a default value")
            if self.requestable is Requestable.FORCED and self.default is not None:
                raise ComplexAttributeError(f"{where}: a consumable that must be requested cannot have a default value")
        elif self.default is not None:
            raise ComplexAttributeError(f"{where}: only consumables take a default value; remove default")
        if self.relop not in ALLOWED_RELOPS[self.type]:
            allowed = ", ".join(sorted(r.value for r in ALLOWED_RELOPS[self.type]))
            raise ComplexAttributeError(
                f"{where}: relational operator {self.relop.value} is not allowed for type {self.type.value}; "
                f"use {allowed}"
            )
        if self.default is not None:
            object.__setattr__(self, "default", parse_value(self.type, self.default))

    def value(self, raw: str | float | bool) -> Value:
        """``raw`` parsed as this attribute's type; the error names the attribute."""
        try:
            return parse_value(self.type, raw)
        except ComplexAttributeError as exc:
            raise ComplexAttributeError(f"attribute {self.name!r}: {exc}") from None

    def check_op(self, op: Relop) -> None:
        if op not in ALLOWED_RELOPS[self.type]:
            allowed = ", ".join(sorted(r.value for r in ALLOWED_RELOPS[self.type]))
            raise ComplexAttributeError(
                f"attribute {self.name!r} is {self.type.value}: operator {op.value} is not allowed; use {allowed}"
            )


_NAME_RE: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_.:\-]*$")


def _b(
    name: str,
    shortcut: str,
    kind: AttributeType,
    relop: Relop,
    *,
    consumable: ConsumableKind = ConsumableKind.NO,
    default: Value | None = None,
    load: bool = True,
) -> AttributeDefinition:
    return AttributeDefinition(
        name, shortcut, kind, relop, consumable=consumable, default=default, builtin=True, load_value=load
    )


T = AttributeType
#: Built-in attributes: SGE's host load values, plus ``opsys``, ``disk_free``, ``free_proc`` and ``clock_mhz``
#: this pilot's agents also measure or report, and ``slots`` (the node's processors, one per core a task holds).
BUILTINS: Final[tuple[AttributeDefinition, ...]] = (
    _b("arch", "a", T.RESTRING, Relop.EQ),
    _b("opsys", "os", T.RESTRING, Relop.EQ),
    _b("hostname", "h", T.HOST, Relop.EQ),
    _b("num_proc", "p", T.INT, Relop.EQ),
    _b("load_avg", "la", T.DOUBLE, Relop.GE),
    _b("load_short", "ls", T.DOUBLE, Relop.GE),
    _b("load_medium", "lm", T.DOUBLE, Relop.GE),
    _b("load_long", "ll", T.DOUBLE, Relop.GE),
    _b("np_load_avg", "nla", T.DOUBLE, Relop.GE),
    _b("np_load_short", "nls", T.DOUBLE, Relop.GE),
    _b("np_load_medium", "nlm", T.DOUBLE, Relop.GE),
    _b("np_load_long", "nll", T.DOUBLE, Relop.GE),
    _b("cpu", "cpu", T.DOUBLE, Relop.GE),
    _b("mem_total", "mt", T.MEMORY, Relop.LE),
    _b("mem_free", "mf", T.MEMORY, Relop.LE),
    _b("mem_used", "mu", T.MEMORY, Relop.GE),
    _b("swap_total", "st", T.MEMORY, Relop.LE),
    _b("swap_free", "sf", T.MEMORY, Relop.LE),
    _b("swap_used", "su", T.MEMORY, Relop.GE),
    _b("virtual_total", "vt", T.MEMORY, Relop.LE),
    _b("virtual_free", "vf", T.MEMORY, Relop.LE),
    _b("virtual_used", "vu", T.MEMORY, Relop.GE),
    _b("disk_free", "df", T.MEMORY, Relop.LE),
    _b("free_proc", "fp", T.DOUBLE, Relop.LE),  # processors the load leaves free: num_proc x (1 - np_load_short)
    _b("clock_mhz", "mhz", T.DOUBLE, Relop.LE, load=False),  # the processor clock the agent reported (a fact)
    _b("slots", "s", T.INT, Relop.LE, consumable=ConsumableKind.SLOT, default=1, load=False),
)
del T


class AttributeRegistry:
    """Every attribute this pilot knows, by name and by shortcut: the built-ins plus the site's."""

    def __init__(self, site: Iterable[AttributeDefinition] = ()) -> None:
        self._by_name: dict[str, AttributeDefinition] = {}
        self._by_short: dict[str, AttributeDefinition] = {}
        for d in BUILTINS:
            self._add(d)
        for d in site:
            old = self._by_name.get(d.name)
            if old is not None and old.builtin:
                self._override_builtin(old, d)
            else:
                self._add(d)
        #: Asked for on every node a matching pass looks at: kept, not rebuilt (the set is fixed now).
        self.forced: Final = [d for d in self._by_name.values() if d.requestable is Requestable.FORCED]
        #: Whether a job that names no attribute is still bound by one (a FORCED one keeps it off the
        #: nodes offering it; a default is taken where offered): then every job must be matched.
        self.binds_every_job: Final = bool(self.forced) or any(
            d.default is not None and not d.builtin for d in self._by_name.values()
        )

    def _add(self, d: AttributeDefinition) -> None:
        if d.name in self._by_name:
            raise ComplexAttributeError(f"attribute {d.name!r} is defined twice: names must be unique")
        for key in (d.name, d.shortcut):
            other = self._by_short.get(key) or (self._by_name.get(key) if key != d.name else None)
            if key and other is not None and other.name != d.name:
                raise ComplexAttributeError(
                    f"attribute {d.name!r}: {key!r} is already used by attribute {other.name!r}"
                )
        self._by_name[d.name] = d
        if d.shortcut:
            self._by_short[d.shortcut] = d

    def _override_builtin(self, old: AttributeDefinition, new: AttributeDefinition) -> None:
        """A built-in keeps its type; only a string may become a cstring or restring and back."""
        strings = {AttributeType.STRING, AttributeType.CSTRING, AttributeType.RESTRING}
        if new.type is not old.type and not (old.type in strings and new.type in strings):
            raise ComplexAttributeError(
                f"attribute {old.name!r} is built in with type {old.type.value}; its type cannot be changed"
            )
        d = AttributeDefinition(
            old.name,
            new.shortcut or old.shortcut,
            new.type,
            new.relop,
            new.requestable,
            new.consumable,
            new.default,
            builtin=True,
            load_value=old.load_value,
        )
        self._by_name[old.name] = d
        if old.shortcut:
            self._by_short.pop(old.shortcut, None)
        if d.shortcut:
            self._by_short[d.shortcut] = d

    def get(self, name: str) -> AttributeDefinition | None:
        """The definition called ``name`` or with that shortcut."""
        return self._by_name.get(name) or self._by_short.get(name)

    def __getitem__(self, name: str) -> AttributeDefinition:
        d = self.get(name)
        if d is None:
            raise ComplexAttributeError(
                f"no attribute {name!r} is defined: define it under [attributes] in the pilot config, "
                "or use a built-in one (" + ", ".join(sorted(self._by_name)) + ")"
            )
        return d

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Any:
        return iter(self._by_name.values())

    @property
    def consumables(self) -> list[AttributeDefinition]:
        return [d for d in self._by_name.values() if d.consumable is not ConsumableKind.NO]

    @classmethod
    def from_config(cls, table: Mapping[str, Any], *, source: str = "<config>") -> AttributeRegistry:
        """Site attributes from a config table ``{name: {type=, relop=, shortcut=, requestable=,
        consumable=, default=}}``; every error names the key."""
        defs: list[AttributeDefinition] = []
        allowed = {"type", "relop", "shortcut", "requestable", "consumable", "default"}
        for name, spec in table.items():
            key = f"{source}: attributes.{name}"
            if not isinstance(spec, Mapping):
                raise ComplexAttributeError(f"{key} must be a table with at least type = ...")
            unknown = set(spec) - allowed
            if unknown:
                raise ComplexAttributeError(
                    f"{key}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {sorted(allowed)}"
                )
            try:
                kind = AttributeType(str(spec.get("type", "")).lower())
            except ValueError:
                raise ComplexAttributeError(
                    f"{key}.type must be one of {', '.join(t.value for t in AttributeType)}"
                ) from None
            consumable = spec.get("consumable", False)
            if consumable is True:
                ckind = ConsumableKind.SLOT
            elif consumable is False:
                ckind = ConsumableKind.NO
            else:
                try:
                    ckind = ConsumableKind(str(consumable).upper())
                except ValueError:
                    raise ComplexAttributeError(f"{key}.consumable must be false, true, 'slot' or 'job'") from None
            default_relop = Relop.LE if ckind is not ConsumableKind.NO else Relop.EQ
            try:
                relop = Relop.parse(str(spec["relop"])) if "relop" in spec else default_relop
                requestable = Requestable(str(spec.get("requestable", "YES")).upper())
            except (ComplexAttributeError, ValueError) as exc:
                raise ComplexAttributeError(f"{key}: {exc}") from None
            try:
                defs.append(
                    AttributeDefinition(
                        name=str(name),
                        shortcut=str(spec.get("shortcut", "")),
                        type=kind,
                        relop=relop,
                        requestable=requestable,
                        consumable=ckind,
                        default=spec.get("default"),
                    )
                )
            except ComplexAttributeError as exc:
                raise ComplexAttributeError(f"{source}: {exc}") from None
        return cls(defs)


# -- values on levels ---------------------------------------------------------------------------------


@dataclass(slots=True)
class AttributeValues:
    """The attribute values one level offers: fixed ones from the config, static facts the agent
    reported once at registration (arch, opsys, hostname, num_proc, mem_total) and load values each
    heartbeat measures anew. Facts are kept apart from load values: a heartbeat replaces the load
    values whole and must not wipe what only the registration said.

    ``version`` changes whenever a value does, so match caches keyed on it stay exact.
    """

    fixed: dict[str, Value] = field(default_factory=dict)
    load: dict[str, Value] = field(default_factory=dict)
    facts: dict[str, Value] = field(default_factory=dict)
    version: int = 0
    _effective: dict[str, Value] | None = None

    def set_fixed(self, registry: AttributeRegistry, values: Mapping[str, str | float | bool], *, level: str) -> None:
        out: dict[str, Value] = {}
        for name, raw in values.items():
            d = registry[name]
            if d.consumable is not ConsumableKind.NO:
                raise ComplexAttributeError(
                    f"{level}: {d.name!r} is a consumable; give its capacity under consumables, not as a fixed value"
                )
            out[d.name] = d.value(raw)
        self.fixed = out
        self._changed()

    def report_load(self, registry: AttributeRegistry, values: Mapping[str, str | float | bool]) -> None:
        """Load values from a heartbeat. Unknown names are skipped (an agent may measure more)."""
        self.report_parsed_load(parse_load(registry, values))

    def report_parsed_load(self, load: dict[str, Value], *, differs: bool = False) -> bool:
        """Load values parsed already (:func:`parse_load`), maybe shared (never changed): True if they changed.
        ``differs``: the caller knows they differ from those held (a combined heartbeat's nodes)."""
        if not differs and (load is self.load or load == self.load):
            return False
        self.load = load
        self._changed()
        return True

    def report_facts(self, registry: AttributeRegistry, values: Mapping[str, str | float | bool]) -> None:
        """The node's static facts from its registration; they hold until it registers again."""
        out = parse_load(registry, values)
        if out != self.facts:
            self.facts = out
            self._changed()

    def _changed(self) -> None:
        self.version += 1
        self._effective = None

    def effective(self, registry: AttributeRegistry) -> dict[str, Value]:
        """Fixed values override load values on the same level, but only towards more restrictive
        (spec section 3: a mem_free of 1G configured against 4G measured gives 1G; 0.9G measured gives 0.9G)."""
        if self._effective is None:
            eff = {**self.load, **self.facts}
            for name, v in self.fixed.items():
                old = eff.get(name)
                d = registry.get(name)
                if old is None or d is None or isinstance(v, bool | str) or isinstance(old, bool | str):
                    eff[name] = v
                elif d.relop in (Relop.LE, Relop.LT):
                    eff[name] = min(v, old)
                elif d.relop in (Relop.GE, Relop.GT):
                    eff[name] = max(v, old)
                else:
                    eff[name] = v
            self._effective = eff
        return self._effective


def parse_load(registry: AttributeRegistry, values: Mapping[str, str | float | bool]) -> dict[str, Value]:
    """The values of known non-consumable attributes, each parsed by its type, the rest left out: load
    values as :meth:`AttributeValues.report_load` keeps them."""
    out: dict[str, Value] = {}
    for name, raw in values.items():
        d = registry.get(name)
        if d is None or d.consumable is not ConsumableKind.NO:
            continue
        try:
            out[d.name] = d.value(raw)
        except ComplexAttributeError:
            continue
    return out


def check_override(
    d: AttributeDefinition, upper: Value, lower: Value, *, where: str, upper_key: str = "globally"
) -> None:
    """A node's value over a global one (SGE section 3): ``==`` / ``!=`` cannot be overridden on a
    lower level; ``<``, ``<=``, ``>``, ``>=`` only towards more restrictive. Raises naming ``where``
    (the node's key) and ``upper_key`` (the global one)."""
    if d.relop in (Relop.EQ, Relop.NE):
        raise ComplexAttributeError(
            f"{where}: {d.name!r} ({d.relop.value}) is set {upper_key} and cannot be overridden on a node; "
            "set it on one level only"
        )
    if isinstance(upper, bool | str) or isinstance(lower, bool | str):
        return
    looser = lower > upper if d.relop in (Relop.LE, Relop.LT) else lower < upper
    if looser:
        raise ComplexAttributeError(
            f"{where}: {d.name!r} = {lower:g} is less restrictive than {upper:g} set {upper_key} "
            f"(relop {d.relop.value}); a node may only tighten a global value"
        )


# -- conditions ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Condition:
    """``provided OP requested`` on one attribute; ``pattern`` asks string matching with wildcards."""

    name: str
    op: Relop
    requested: Value
    pattern: bool = False

    @classmethod
    def sge(cls, registry: AttributeRegistry, name: str, raw: str | float | bool) -> Condition:
        """An SGE-style request ``name=value``: compared with the attribute's own relop,
        ``requested RELOP provided``."""
        d = registry[name]
        if d.requestable is Requestable.NO:
            raise ComplexAttributeError(f"attribute {d.name!r} cannot be requested (requestable is NO)")
        return cls(d.name, d.relop.flipped, d.value(raw))

    @classmethod
    def sss(
        cls, registry: AttributeRegistry, name: str, op: Relop | None, raw: str, *, match: bool = False
    ) -> Condition:
        """An SSS requested property: ``provided OP requested``; with no op the attribute's relop."""
        d = registry[name]
        if d.requestable is Requestable.NO:
            raise ComplexAttributeError(f"attribute {d.name!r} cannot be requested (requestable is NO)")
        if match:
            if not d.type.textual:
                raise ComplexAttributeError(f'attribute {d.name!r} is {d.type.value}: op="Match" needs a string type')
            return cls(d.name, Relop.EQ, raw, pattern=True)
        if op is None:
            return cls(d.name, d.relop.flipped, d.value(raw))
        d.check_op(op)
        return cls(d.name, op, d.value(raw))

    def holds(self, registry: AttributeRegistry, provided: Value) -> bool:
        d = registry[self.name]
        req = self.requested
        if d.type.textual:
            same = string_matches(d.type, str(req), str(provided), pattern=self.pattern)
            return same if self.op is Relop.EQ else not same
        return compare(self.op, provided, req)

    def __str__(self) -> str:
        v = self.requested
        shown = f"{v:g}" if isinstance(v, float) else str(v)
        return f"{self.name}{self.op.value}{shown}"


def compare(op: Relop, a: Value, b: Value) -> bool:
    """``a OP b`` for numbers and booleans."""
    return _CMP[op](a, b)


_CMP: Final[Mapping[Relop, Callable[[Any, Any], bool]]] = {
    Relop.EQ: lambda a, b: bool(a == b),
    Relop.NE: lambda a, b: bool(a != b),
    Relop.LE: lambda a, b: bool(a <= b),
    Relop.LT: lambda a, b: bool(a < b),
    Relop.GE: lambda a, b: bool(a >= b),
    Relop.GT: lambda a, b: bool(a > b),
}


def evaluate(
    registry: AttributeRegistry, cond: Condition, global_values: Mapping[str, Value], host_values: Mapping[str, Value]
) -> str | None:
    """None when ``cond`` holds on the hierarchy global -> host, else why not (spec section 5: a level
    that defines the attribute must match, a level that does not is skipped, none at all fails)."""
    seen = False
    for level, values in ((Level.GLOBAL, global_values), (Level.HOST, host_values)):
        if cond.name in values:
            seen = True
            provided = values[cond.name]
            if not cond.holds(registry, provided):
                shown = f"{provided:g}" if isinstance(provided, float) else str(provided)
                return f"{cond} does not hold: the {level.value} value is {shown}"
    if not seen:
        return f"{cond} cannot be checked: no value for {cond.name!r} is known"
    return None


# -- consumables --------------------------------------------------------------------------------------


@dataclass(slots=True)
class ConsumableLedger:
    """Capacity and free amount of each consumable on one level (the allocation or one node)."""

    capacity: dict[str, float] = field(default_factory=dict)
    free: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, capacity: Mapping[str, float]) -> ConsumableLedger:
        return cls(dict(capacity), dict(capacity))

    def fits(self, amounts: Mapping[str, float], times: int = 1) -> bool:
        return all(self.free.get(k, 0.0) >= a * times for k, a in amounts.items())

    def room(self, amounts: Mapping[str, float]) -> float:
        """How many times ``amounts`` fit in what is free (inf when nothing is asked)."""
        n = math.inf
        for k, a in amounts.items():
            if a > 0:
                n = min(n, self.free.get(k, 0.0) // a)
        return n

    def take(self, amounts: Mapping[str, float], times: int = 1) -> None:
        """Debit ``amounts``; one this level has no capacity of is skipped (a resumed task's default)."""
        for k, a in amounts.items():
            if k in self.capacity:
                self.free[k] = self.free.get(k, 0.0) - a * times

    def give_back(self, amounts: Mapping[str, float], times: int = 1) -> None:
        for k, a in amounts.items():
            if k in self.capacity:
                self.free[k] = min(self.capacity[k], self.free.get(k, 0.0) + a * times)

    def copy(self) -> ConsumableLedger:
        return ConsumableLedger(dict(self.capacity), dict(self.free))


def consumable_amounts(
    registry: AttributeRegistry, requested: Mapping[str, float], *, offered: Iterable[str]
) -> tuple[dict[str, float], dict[str, float]]:
    """Split requested consumables into (per task, per job) amounts, adding the defaults of the
    consumables offered somewhere that the request leaves out, and checking forced ones."""
    offered_set = set(offered)
    per_slot: dict[str, float] = {}
    per_job: dict[str, float] = {}
    for name, amount in requested.items():
        d = registry.get(name)
        kind = d.consumable if d is not None else ConsumableKind.SLOT
        if d is not None and d.consumable is ConsumableKind.NO:
            raise ComplexAttributeError(f"attribute {d.name!r} is not a consumable: it cannot be reserved")
        key = d.name if d is not None else name
        (per_job if kind is ConsumableKind.JOB else per_slot)[key] = amount
    for d in registry.consumables:
        if d.name in per_slot or d.name in per_job:
            continue
        if d.requestable is Requestable.FORCED:
            raise ComplexAttributeError(f"attribute {d.name!r} must be requested: add a request for it")
        if d.default is not None and d.name in offered_set and d.name != "slots":
            assert isinstance(d.default, float)
            (per_job if d.consumable is ConsumableKind.JOB else per_slot)[d.name] = d.default
    return per_slot, per_job

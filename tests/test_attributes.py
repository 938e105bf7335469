"""SGE-style complex attributes: types, values, relational operators and their type restrictions,
string matching, consumables, the global/host hierarchy and override rules."""

from __future__ import annotations

import fnmatch
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.scheduler.attributes import (
    AttributeDefinition,
    AttributeRegistry,
    AttributeType,
    AttributeValues,
    ComplexAttributeError,
    Condition,
    ConsumableKind,
    ConsumableLedger,
    Relop,
    Requestable,
    check_override,
    compile_pattern,
    consumable_amounts,
    evaluate,
    parse_memory,
    parse_time,
    parse_value,
    string_matches,
)

T = AttributeType


# -- values ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("512", 512), ("1k", 1000), ("1K", 1024), ("2m", 2e6), ("2M", 2 * 2**20), ("1.5G", 1.5 * 2**30), ("1g", 1e9)],
)
def test_memory_values(text: str, value: float) -> None:
    assert parse_memory(text) == value


@pytest.mark.parametrize(("text", "value"), [("90", 90), ("1:30", 90), ("1:00:00", 3600), ("::5", 5), ("2:", 120)])
def test_time_values(text: str, value: float) -> None:
    assert parse_time(text) == value


@pytest.mark.parametrize(
    ("kind", "text"), [(T.MEMORY, "lots"), (T.TIME, "1:2:3:4"), (T.INT, "1.5"), (T.BOOLEAN, "yep")]
)
def test_bad_values_say_what_to_write(kind: AttributeType, text: str) -> None:
    with pytest.raises(ComplexAttributeError):
        parse_value(kind, text)


def test_infinity() -> None:
    assert parse_memory("INFINITY") == math.inf and parse_time("infinity") == math.inf


# -- definitions: the spec's restrictions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"type": T.STRING, "relop": Relop.LE}, "not allowed for type string"),
        ({"type": T.BOOLEAN, "relop": Relop.NE}, "not allowed for type boolean"),
        ({"type": T.HOST, "relop": Relop.GT}, "not allowed for type host"),
        ({"type": T.STRING, "relop": Relop.EQ, "consumable": ConsumableKind.SLOT}, "only int, double, memory"),
        ({"type": T.INT, "relop": Relop.GE, "consumable": ConsumableKind.SLOT}, "must be <="),
        (
            {"type": T.INT, "relop": Relop.LE, "consumable": ConsumableKind.SLOT, "requestable": Requestable.NO},
            "needs a default",
        ),
        (
            {
                "type": T.INT,
                "relop": Relop.LE,
                "consumable": ConsumableKind.JOB,
                "requestable": Requestable.FORCED,
                "default": 1,
            },
            "cannot have a default",
        ),
        ({"type": T.INT, "relop": Relop.EQ, "default": 3}, "only consumables take a default"),
    ],
)
def test_definitions_follow_the_spec_restrictions(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ComplexAttributeError, match=fragment):
        AttributeDefinition("x", "", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", [T.INT, T.DOUBLE, T.MEMORY, T.TIME])
def test_numeric_types_allow_every_operator(kind: AttributeType) -> None:
    for op in Relop:
        AttributeDefinition("x", "", kind, op)


def test_registry_names_and_shortcuts_are_unique_and_builtins_keep_their_type() -> None:
    reg = AttributeRegistry([AttributeDefinition("scratch", "scr", T.MEMORY, Relop.LE, consumable=ConsumableKind.SLOT)])
    assert reg["scr"].name == "scratch" and reg["mf"].name == "mem_free"
    with pytest.raises(ComplexAttributeError, match="already used"):
        AttributeRegistry([AttributeDefinition("other", "mf", T.INT, Relop.EQ)])
    with pytest.raises(ComplexAttributeError, match="cannot be changed"):
        AttributeRegistry([AttributeDefinition("mem_free", "", T.INT, Relop.LE)])
    changed = AttributeRegistry([AttributeDefinition("arch", "", T.CSTRING, Relop.EQ)])
    assert changed["arch"].type is T.CSTRING and changed["a"].builtin
    with pytest.raises(ComplexAttributeError, match="no attribute 'nope'"):
        reg["nope"]


def test_registry_from_config_names_the_key() -> None:
    reg = AttributeRegistry.from_config(
        {
            "license_matlab": {"type": "int", "consumable": "job", "default": 0},
            "tmp_quota": {"type": "memory", "consumable": True, "shortcut": "tq"},
            "rack": {"type": "string"},
            "speed": {"type": "double", "relop": ">="},
        },
        source="site.toml",
    )
    assert reg["license_matlab"].consumable is ConsumableKind.JOB and reg["license_matlab"].default == 0.0
    assert reg["tq"].consumable is ConsumableKind.SLOT and reg["tq"].relop is Relop.LE
    assert reg["speed"].relop is Relop.GE
    with pytest.raises(ComplexAttributeError, match=r"site.toml: attributes.rack.type"):
        AttributeRegistry.from_config({"rack": {"type": "text"}}, source="site.toml")
    with pytest.raises(ComplexAttributeError, match="unknown key"):
        AttributeRegistry.from_config({"rack": {"type": "string", "colour": 1}})
    with pytest.raises(ComplexAttributeError, match="<="):
        AttributeRegistry.from_config({"lic": {"type": "int", "consumable": "job", "relop": "=="}})


# -- string matching ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "text", "ok"),
    [
        ("linux|solaris", "solaris", True),
        ("lx-*", "lx-amd64", True),
        ("lx-???64", "lx-amd64", True),
        ("lx-?", "lx-", False),  # ? is exactly one character
        ("a.c", "abc", False),  # . is a dot
        ("a.c", "a.c", True),
        (r"a\*", "a*", True),
        (r"a\*", "ab", False),
        ("node[1-3]", "node2", True),
        ("node[1-3]", "node4", False),
        ("[linux|solaris]", "[linux", True),  # | splits even inside brackets (the spec's example)
        ("[linux|solaris]", "solaris]", True),
        ("[linux|solaris]", "linux", False),
        ("sol*|lin*", "linux", True),
    ],
)
def test_restring_matching(pattern: str, text: str, ok: bool) -> None:
    assert string_matches(T.RESTRING, pattern, text) is ok


def test_string_kinds() -> None:
    assert string_matches(T.STRING, "Linux", "Linux") and not string_matches(T.STRING, "Linux", "linux")
    assert string_matches(T.CSTRING, "Linux", "LINUX") and string_matches(T.HOST, "Node1", "node1")
    assert not string_matches(T.STRING, "lin*", "linux") and string_matches(T.STRING, "lin*", "linux", pattern=True)


_plain = st.text(alphabet="abc.-_", max_size=6)


@settings(max_examples=200, deadline=None)
@given(pattern=st.text(alphabet="abc*?.", max_size=6), text=_plain)
def test_wildcards_agree_with_fnmatch_where_the_syntaxes_coincide(pattern: str, text: str) -> None:
    assert (compile_pattern(pattern).match(text) is not None) == fnmatch.fnmatchcase(text, pattern)


@settings(max_examples=100, deadline=None)
@given(alts=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), min_size=1, max_size=4), text=_plain)
def test_top_level_or_is_any_alternative(alts: list[str], text: str) -> None:
    assert (compile_pattern("|".join(alts)).match(text) is not None) == (text in alts)


# -- conditions and the hierarchy ------------------------------------------------------------------------------


def test_sge_requests_use_the_attribute_relop_request_first() -> None:
    reg = AttributeRegistry()
    # mem_free is <=: a request of 2G fits a host offering 4G (the spec's E1 pattern)
    cond = Condition.sge(reg, "mem_free", "2G")
    assert cond.holds(reg, 4 * 2**30) and not cond.holds(reg, 1 * 2**30)
    # load_avg is >=: a request of 2 selects hosts whose load is at most 2
    load = Condition.sge(reg, "la", "2")
    assert load.holds(reg, 1.5) and not load.holds(reg, 3.0)


def test_sss_requests_carry_their_own_op_with_type_restrictions() -> None:
    reg = AttributeRegistry()
    assert Condition.sss(reg, "num_proc", Relop.GE, "8").holds(reg, 16.0)
    with pytest.raises(ComplexAttributeError, match="not allowed"):
        Condition.sss(reg, "arch", Relop.GT, "x86")
    with pytest.raises(ComplexAttributeError, match="needs a string type"):
        Condition.sss(reg, "num_proc", None, "8*", match=True)
    cond = Condition.sss(reg, "hostname", None, "NODE*", match=True)
    assert cond.holds(reg, "node7")


def test_hierarchy_global_then_host() -> None:
    reg = AttributeRegistry([AttributeDefinition("site", "", T.STRING, Relop.EQ)])
    cond = Condition.sss(reg, "site", Relop.EQ, "pnnl")
    assert evaluate(reg, cond, {"site": "pnnl"}, {}) is None  # defined globally only
    assert evaluate(reg, cond, {}, {"site": "pnnl"}) is None  # on the host only
    reason = evaluate(reg, cond, {"site": "lbl"}, {"site": "pnnl"})
    assert reason is not None and "global" in reason  # a mismatch on a higher level ends it
    missing = evaluate(reg, cond, {}, {})
    assert missing is not None and "no value" in missing


def test_fixed_values_override_load_values_only_towards_more_restrictive() -> None:
    reg = AttributeRegistry()
    v = AttributeValues()
    v.set_fixed(reg, {"mem_free": "1G"}, level="node n1")
    v.report_load(reg, {"mem_free": 4 * 2**30, "load_avg": 0.5, "unknown_probe": 3})
    assert v.effective(reg)["mem_free"] == 2**30  # the spec: 1 GB configured / 4 GB reported -> 1 GB
    before = v.version
    v.report_load(reg, {"mem_free": 0.9 * 2**30, "load_avg": 0.5})
    assert v.version > before and v.effective(reg)["mem_free"] == 0.9 * 2**30  # 1 GB / 0.9 GB -> 0.9 GB
    same = v.version
    v.report_load(reg, {"mem_free": 0.9 * 2**30, "load_avg": 0.5})
    assert v.version == same  # unchanged values do not invalidate caches
    with pytest.raises(ComplexAttributeError, match="consumable"):
        v.set_fixed(reg, {"slots": 4}, level="node n1")


def test_override_rules_between_levels() -> None:
    reg = AttributeRegistry([AttributeDefinition("site", "", T.STRING, Relop.EQ)])
    with pytest.raises(ComplexAttributeError, match="cannot be overridden on a node"):
        check_override(reg["site"], "a", "b", where="node n1")
    check_override(reg["mem_free"], 4.0, 2.0, where="node n1")  # tighter: fine
    with pytest.raises(ComplexAttributeError, match="less restrictive"):
        check_override(reg["mem_free"], 2.0, 4.0, where="node n1")


# -- consumables -------------------------------------------------------------------------------------------------


def test_consumable_amounts_split_per_slot_and_per_job_with_defaults() -> None:
    reg = AttributeRegistry(
        [
            AttributeDefinition("lic", "", T.INT, Relop.LE, consumable=ConsumableKind.JOB, default=1),
            AttributeDefinition("scratch", "", T.MEMORY, Relop.LE, consumable=ConsumableKind.SLOT, default="1G"),
            AttributeDefinition(
                "token", "", T.INT, Relop.LE, consumable=ConsumableKind.SLOT, requestable=Requestable.FORCED
            ),
        ]
    )
    with pytest.raises(ComplexAttributeError, match="must be requested"):
        consumable_amounts(reg, {}, offered=["lic", "scratch"])
    per_slot, per_job = consumable_amounts(reg, {"token": 2}, offered=["lic", "scratch", "token"])
    assert per_slot == {"token": 2, "scratch": 2**30} and per_job == {"lic": 1.0}
    with pytest.raises(ComplexAttributeError, match="not a consumable"):
        consumable_amounts(reg, {"arch": 1}, offered=[])


def test_ledger() -> None:
    led = ConsumableLedger.of({"lic": 3, "scratch": 10})
    assert led.room({"lic": 1}) == 3 and led.room({}) == math.inf
    led.take({"lic": 1}, times=2)
    assert led.fits({"lic": 1}) and not led.fits({"lic": 1}, times=2)
    led.give_back({"lic": 1}, times=5)
    assert led.free["lic"] == 3  # never above capacity

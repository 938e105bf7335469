"""Matching: Requested properties with op/conj/group/preference against typed node attributes, node
names (List, Pattern, Range) and features; amount variants; the job-category cache; explain."""

from __future__ import annotations

import pytest

from pilot.model.node import NodeConfigured
from pilot.model.sss import Properties, Property, SssError
from pilot.scheduler.attributes import AttributeDefinition, AttributeRegistry, AttributeType, Relop
from pilot.scheduler.cluster import Cluster, MatchNode
from pilot.scheduler.matching import Matcher, NodeRequirement, compile_requirements, uncached_candidates
from pilot.scheduler.terms import expand_range

P = Property.of
GiB = 2**30


def cluster(n: int = 4, **fixed: dict[str, str]) -> Cluster:
    reg = AttributeRegistry([AttributeDefinition("rack", "", AttributeType.STRING, Relop.EQ)])
    c = Cluster(registry=reg, context={"Queue": "batch", "User": "keith"})
    for i in range(1, n + 1):
        nc = NodeConfigured(
            name=f"node{i}",
            hostname=f"node{i}.example",
            processors=list(range(4 * i)),
            memory=i * 4 * GiB,
            gpus=list(range(i - 1)),
            os="Linux",
            architecture="x86_64" if i % 2 else "aarch64",
            features=["ib"] + (["bigmem"] if i >= 3 else []),
        )
        c.add(MatchNode.from_configured(nc, reg, fixed=fixed.get(nc.name, {"rack": "r1" if i <= 2 else "r2"})))
    return c


def names(nodes: list[MatchNode]) -> list[str]:
    return [n.name for n in nodes]


def match(c: Cluster, *items: Property, requested: list[Property] | None = None) -> list[str]:
    req = compile_requirements(Properties.of(*items, requested=requested), c)
    return names(Matcher(c).candidates(req.node))


# -- node properties --------------------------------------------------------------------------------------------


def test_node_aggregations() -> None:
    c = cluster()
    assert match(c, P("Node", "node2")) == ["node2"]
    assert match(c, P("Node", "node1,node3", aggregation="List")) == ["node1", "node3"]
    assert match(c, P("Node", "node1;node4", aggregation="List", delimiter=";")) == ["node1", "node4"]
    assert match(c, P("Node", "node[2-3]", aggregation="Range")) == ["node2", "node3"]
    assert match(c, P("Node", "node[13]", aggregation="Pattern")) == ["node1", "node3"]
    assert match(c, P("Node", "node4.example")) == ["node4"]  # host names match too
    assert match(c, requested=[P("Node", "node1", op="NE")]) == ["node2", "node3", "node4"]


def test_range_expansion() -> None:
    assert expand_range("node[5-7,77]") == ["node5", "node6", "node7", "node77"]
    assert expand_range("n[08-10]x") == ["n08x", "n09x", "n10x"]
    assert expand_range("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert expand_range("a[1-2],b7") == ["a1", "a2", "b7"]
    for bad in ("node[5-3]", "node[x]", "node[1-2", "[]"):
        with pytest.raises(SssError):
            expand_range(bad)


def test_zero_padding() -> None:
    assert expand_range("n[08-10]") == ["n08", "n09", "n10"]


def test_features() -> None:
    c = cluster()
    assert match(c, P("Feature", "bigmem")) == ["node3", "node4"]
    assert match(c, P("Feature", "ib,bigmem", aggregation="List")) == ["node3", "node4"]
    assert match(c, P("Feature", "big.*", aggregation="Pattern")) == ["node3", "node4"]
    assert match(c, requested=[P("Feature", "bigmem", op="NE")]) == ["node1", "node2"]
    assert match(c, P("Feature", "gpu")) == []


def test_architecture_os_and_typed_attributes() -> None:
    c = cluster()
    assert match(c, P("Architecture", "x86_64")) == ["node1", "node3"]
    assert match(c, P("Architecture", "x86*|aarch*")) == ["node1", "node2", "node3", "node4"]  # arch is a restring
    assert match(c, requested=[P("OperatingSystem", "Linux")]) == ["node1", "node2", "node3", "node4"]
    assert match(c, requested=[P("Extension", "r2", name="rack", type="Attribute")]) == ["node3", "node4"]
    # num_proc is int: the spec's relational operators apply
    assert match(c, requested=[P("Extension", "8", name="num_proc", type="Attribute", op="GT")]) == ["node3", "node4"]
    # mem_total (<=, SGE style when no op): hosts offering at least the request
    assert match(c, requested=[P("Extension", "10G", name="mt", type="Attribute")]) == ["node3", "node4"]
    with pytest.raises(SssError, match="not allowed"):
        match(c, requested=[P("Extension", "r1", name="rack", type="Attribute", op="GT")])
    with pytest.raises(SssError, match="no attribute 'colour'"):
        match(c, requested=[P("Extension", "red", name="colour", type="Attribute")])


def test_allocation_wide_properties() -> None:
    c = cluster()
    assert match(c, requested=[P("Queue", "batch")]) == names(list(c.nodes.values()))
    assert match(c, requested=[P("Queue", "debug")]) == []
    assert match(c, requested=[P("User", "kei*", op="Match")]) != []
    with pytest.raises(SssError, match="no Machine value"):
        match(c, requested=[P("Machine", "Colony")])


def test_configured_context_is_a_static_requirement() -> None:
    c = cluster()
    assert match(c, requested=[P("Memory", 10, units="GB", context="Configured")]) == ["node3", "node4"]


# -- conj and group ----------------------------------------------------------------------------------------------


def test_conj_and_group_build_the_expression() -> None:
    c = cluster()
    # the spec's third example, on nodes: (rack=r1 And Feature=ib) Or (rack=r2 And Feature=bigmem)
    req = [
        P("Extension", "r1", name="rack", type="Attribute", group=1),
        P("Architecture", "aarch64", group=-1),
        P("Extension", "r2", name="rack", type="Attribute", conj="Or", group=1),
        P("Architecture", "x86_64", group=-1),
    ]
    assert match(c, requested=req) == ["node2", "node3"]
    # And binds tighter than Or
    flat = [P("Node", "node1"), P("Node", "node2", conj="Or"), P("Feature", "bigmem")]
    assert match(c, requested=flat) == ["node1"]
    # Nand is "and not", Nor "or not"
    assert match(c, requested=[P("Feature", "ib"), P("Feature", "bigmem", conj="Nand")]) == ["node1", "node2"]
    assert match(c, requested=[P("Node", "node1"), P("Feature", "ib", conj="Nor")]) == ["node1"]


def test_unbalanced_groups_are_refused_naming_the_element() -> None:
    c = cluster()
    with pytest.raises(SssError, match="never opened"):
        match(c, requested=[P("Processors", 12, group=-1), P("Processors", 16, conj="Or", group=1)])
    with pytest.raises(SssError, match="never closed"):
        match(c, requested=[P("Feature", "ib", group=1)])


def test_amounts_and_node_properties_may_not_be_alternatives() -> None:
    with pytest.raises(SssError, match="mixes amounts"):
        match(cluster(), requested=[P("Feature", "ib"), P("Memory", 1, conj="Or")])


# -- amounts ------------------------------------------------------------------------------------------------------


def variants(c: Cluster, *items: Property, requested: list[Property] | None = None) -> list[dict[str, float]]:
    req = compile_requirements(Properties.of(*items, requested=requested), c)
    return [dict(v.values) for v in req.variants]


def test_amount_alternatives_become_variants() -> None:
    c = cluster()
    assert variants(c, requested=[P("Processors", 12, group=1), P("Processors", 16, conj="Or", group=-1)]) == [
        {"Processors": 12},
        {"Processors": 16},
    ]
    assert variants(c, requested=[P("Processors", 8, op="GE"), P("Processors", 16, op="LE")]) == [
        {"Processors": 8},
        {"Processors": 16},
    ]
    assert variants(c, requested=[P("Processors", 4, op="GT")]) == [{"Processors": 5}]
    assert variants(c, P("Memory", 2, units="GB")) == [{"Memory": 2 * GiB}]
    assert variants(c, P("Resource", 1, name="License", type="ESSL2")) == [{"Resource:License:ESSL2": 1}]
    with pytest.raises(SssError, match="contradict"):
        variants(c, P("Processors", 4), requested=[P("Processors", 8, op="GE")])
    with pytest.raises(SssError, match="cannot be reserved"):
        variants(c, requested=[P("Memory", 8, op="LE")])


def test_positive_preferences_must_hold_and_rank() -> None:
    c = cluster()
    # the spec's fourth example: Memory 1024 preferred (2) over 512 (1)
    v = variants(c, requested=[P("Memory", 1024, preference=2), P("Memory", 512, preference=1)])
    assert v == [{"Memory": 1024 * 2**20}, {"Memory": 512 * 2**20}]
    # on nodes: at least one alternative; nodes meeting the heavier one first
    assert match(c, requested=[P("Node", "node1", preference=1), P("Node", "node3", preference=3)]) == [
        "node3",
        "node1",
    ]


def test_negative_preferences_only_rank() -> None:
    c = cluster()
    got = match(c, requested=[P("Feature", "bigmem", preference=-1)])
    assert got == ["node3", "node4", "node1", "node2"]
    with pytest.raises(SssError, match="one sign"):
        match(c, requested=[P("Feature", "bigmem", preference=-1), P("Feature", "ib", preference=2)])


# -- the category cache --------------------------------------------------------------------------------------------


def test_identical_requests_are_matched_once() -> None:
    c = cluster(50)
    m = Matcher(c)
    req = compile_requirements(Properties.of(P("Feature", "bigmem")), c).node
    first = m.candidates(req)
    evaluations = m.evaluations
    assert evaluations == 50
    for _ in range(1000):
        assert m.candidates(req) is first
    assert m.evaluations == evaluations  # 1000 identical tasks, no new node verdicts
    assert names(first) == names(uncached_candidates(m, req))


def test_only_changed_nodes_are_checked_again() -> None:
    c = cluster(20)
    m = Matcher(c)
    req = compile_requirements(Properties.of(requested=[P("Extension", "1", name="load_avg", type="Attribute")]), c)
    assert len(m.candidates(req.node)) == 0  # no load reported yet: cannot be checked
    for node in list(c.nodes.values())[:5]:
        node.values.report_load(c.registry, {"load_avg": 0.5})
    c.touch()
    before = m.evaluations
    assert len(m.candidates(req.node)) == 5
    assert m.evaluations - before == 5  # only the five nodes whose values changed
    c.remove("node1")
    assert "node1" not in names(m.candidates(req.node))


def test_need_is_part_of_the_category() -> None:
    c = cluster()
    m = Matcher(c)
    assert names(m.candidates(NodeRequirement(), (("Processors", 10.0),))) == ["node3", "node4"]
    assert names(m.candidates(NodeRequirement(), (("Resource:GPU", 2.0),))) == ["node3", "node4"]
    assert names(m.candidates(NodeRequirement(), (("Memory", 13.0 * GiB),))) == ["node4"]


def test_explain_names_the_requirement_and_the_nodes() -> None:
    c = cluster()
    m = Matcher(c)
    req = compile_requirements(Properties.of(P("Feature", "Jumbo-Frame")), c).node
    lines = m.explain(req, (("Processors", 2.0),))
    assert len(lines) == 1 and "4 of 4 node(s)" in lines[0] and "Feature=Jumbo-Frame does not hold" in lines[0]
    big = m.explain(NodeRequirement(), (("Processors", 100.0),))
    assert "each task needs 100 Processors but it has" in big[0]
    assert Matcher(Cluster()).explain(NodeRequirement()) == ["no node has registered yet"]


def test_static_facts_survive_load_reports() -> None:
    """Registration facts (arch, opsys, hostname, num_proc, mem_total) are not load values: a heartbeat's
    load report, which replaces the load values whole, leaves them."""
    c = cluster()
    for node in c.nodes.values():
        node.values.report_load(c.registry, {"load_avg": 0.5, "mem_free": "1G"})
        c.touch(node)
    assert match(c, P("Architecture", "x86_64")) == ["node1", "node3"]
    assert match(c, requested=[P("OperatingSystem", "Lin*", op="Match")]) == ["node1", "node2", "node3", "node4"]
    assert match(c, requested=[P("Extension", "node2.example", type="Attribute", name="hostname")]) == ["node2"]
    assert match(c, requested=[P("Extension", "12", type="Attribute", name="num_proc", op="GE")]) == ["node3", "node4"]
    assert match(c, requested=[P("Extension", "10G", type="Attribute", name="mem_total", op="GT")]) == [
        "node3",
        "node4",
    ]

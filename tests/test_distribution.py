"""Task distribution and placement: the rules (Pack, Spread, RoundRobin, TasksPerNode,
ProcessorsPerTask, Geometry), NodeCount, exclusive nodes, consumables per task and per job,
contradictions refused by name, variants, release, and the per-pass category cursor."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.formats import read_job
from pilot.model.job_description import JobDescription, ResourceRequest
from pilot.model.node import NodeConfigured
from pilot.model.sss import Job, JobGroup, Properties, Property, SssError, Task, TaskGroup, effective_jobs
from pilot.model.sss.psij import to_sss
from pilot.scheduler import NodeSlots, place
from pilot.scheduler.attributes import (
    AttributeDefinition,
    AttributeRegistry,
    AttributeType,
    ConsumableKind,
    ConsumableLedger,
    Relop,
    Requestable,
)
from pilot.scheduler.cluster import Cluster, MatchNode
from pilot.scheduler.distribution import (
    JobPlacement,
    JobRequest,
    Resources,
    Rule,
    SchedulingPass,
    TaskGroupRequest,
    parse_geometry,
    release,
    resolve_job,
    shares,
    why_not,
)
from pilot.scheduler.matching import Matcher

P = Property.of
GiB = 2**30
DATA = Path(__file__).parent / "data"


class World:
    """A cluster of virtual nodes: what the matcher sees and what placement takes from."""

    def __init__(
        self,
        cores: list[int],
        *,
        features: dict[int, list[str]] | None = None,
        registry: AttributeRegistry | None = None,
        global_capacity: dict[str, float] | None = None,
        host_capacity: dict[str, float] | None = None,
        memory: int = 16 * GiB,
    ) -> None:
        self.cluster = Cluster(registry=registry or AttributeRegistry())
        self.res = Resources({})
        for i, n in enumerate(cores):
            nc = NodeConfigured(
                name=f"n{i + 1}",
                hostname=f"n{i + 1}",
                processors=list(range(n)),
                memory=memory,
                gpus=[0, 1],
                features=(features or {}).get(i + 1, []),
            )
            self.cluster.add(MatchNode.from_configured(nc, self.cluster.registry, consumables=host_capacity))
            self.res.slots[nc.name] = NodeSlots.from_configured(nc)
            if host_capacity:
                self.res.ledgers[nc.name] = ConsumableLedger.of(host_capacity)
        for k, v in (global_capacity or {}).items():
            self.cluster.global_capacity[k] = v
            self.res.global_ledger.capacity[k] = v
            self.res.global_ledger.free[k] = v
        self.matcher = Matcher(self.cluster)

    def request(self, obj: Job | JobGroup, index: int = 0) -> JobRequest:
        return resolve_job(effective_jobs(obj)[index], self.cluster)

    def place(self, obj: Job | JobGroup | JobRequest, job_id: str = "j1") -> JobPlacement | None:
        req = obj if isinstance(obj, JobRequest) else self.request(obj)
        return SchedulingPass(self.matcher, self.res).place(job_id, req)

    def placed(self, obj: Job | JobGroup | JobRequest, job_id: str = "j1") -> JobPlacement:
        p = self.place(obj, job_id)
        assert p is not None, "expected the job to be placed"
        return p


def job(*group_items: Property, job_items: tuple[Property, ...] = (), requested: list[Property] | None = None) -> Job:
    return Job(
        Properties.of(P("Executable", "x"), *job_items), [TaskGroup(Properties.of(*group_items, requested=requested))]
    )


def layout(placement: JobPlacement | None) -> dict[str, list[int]]:
    assert placement is not None
    out: dict[str, list[int]] = {}
    for t in placement.tasks:
        out.setdefault(t.node, []).append(t.task)
    return out


# -- the rules ---------------------------------------------------------------------------------------------------


def test_pack_fills_one_node_before_the_next() -> None:
    w = World([4, 4, 4])
    p = w.place(job(P("TaskCount", 6), P("TaskDistribution", "Pack", type="Rule")))
    assert layout(p) == {"n1": [0, 1, 2, 3], "n2": [4, 5]}


def test_spread_uses_as_many_nodes_as_possible() -> None:
    w = World([4, 4, 4])
    p = w.place(job(P("TaskCount", 6), P("TaskDistribution", "Spread", type="Rule")))
    assert layout(p) == {"n1": [0, 1], "n2": [2, 3], "n3": [4, 5]}


def test_round_robin_deals_one_task_per_node_in_turn() -> None:
    w = World([4, 4, 4])
    p = w.place(job(P("TaskCount", 7), P("TaskDistribution", "RoundRobin", type="Rule")))
    assert layout(p) == {"n1": [0, 3, 6], "n2": [1, 4], "n3": [2, 5]}


def test_pack_versus_spread_on_the_same_cluster() -> None:
    packed = World([8, 8, 8, 8]).placed(job(P("TaskCount", 8), P("TaskDistribution", "Pack", type="Rule")))
    spread = World([8, 8, 8, 8]).placed(job(P("TaskCount", 8), P("TaskDistribution", "Spread", type="Rule")))
    assert Counter(t.node for t in packed.tasks) == {"n1": 8}
    assert Counter(t.node for t in spread.tasks) == {"n1": 2, "n2": 2, "n3": 2, "n4": 2}


def test_tasks_per_node() -> None:
    w = World([4, 4, 4])
    p = w.place(job(P("TaskCount", 5), P("TaskDistribution", 2, type="TasksPerNode")))
    assert layout(p) == {"n1": [0, 1], "n2": [2, 3], "n3": [4]}


def test_processors_per_task_and_cores_are_exclusive() -> None:
    w = World([8, 8])
    p = w.placed(job(P("TaskCount", 3), P("TaskDistribution", 3, type="ProcessorsPerTask")))
    assert [t.cores for t in p.tasks] == [[0, 1, 2], [3, 4, 5], [0, 1, 2]]
    assert [t.node for t in p.tasks] == ["n1", "n1", "n2"]
    # Processors as a total: 8 processors over 4 tasks is 2 each
    q = World([8]).placed(job(P("TaskCount", 4), P("Processors", 8)))
    assert [len(t.cores) for t in q.tasks] == [2, 2, 2, 2]


def test_geometry() -> None:
    w = World([2, 4, 4])
    p = w.place(job(P("TaskDistribution", "{1,4}{2}{3,5,6}", type="Geometry")))
    groups = sorted(sorted(v) for v in layout(p).values())
    assert groups == [[0, 3], [1], [2, 4, 5]]
    three = next(n for n, v in layout(p).items() if sorted(v) == [2, 4, 5])
    assert three != "n1"  # the block of three does not fit the 2-core node
    assert parse_geometry("{0}{1,2}") == ((0,), (1, 2))
    for bad in ("{1,2}{2}", "{1}{3}", "1,2", "{}", "{a}"):
        with pytest.raises(SssError):
            parse_geometry(bad)


def test_node_count_spreads_evenly_over_exactly_that_many_nodes() -> None:
    w = World([8, 8, 8, 8])
    p = w.placed(job(P("TaskCount", 7), P("NodeCount", 3)))
    assert sorted(Counter(t.node for t in p.tasks).values()) == [2, 2, 3]
    q = World([8, 8, 8, 8]).placed(
        job(P("TaskCount", 7), P("NodeCount", 2), P("TaskDistribution", "Pack", type="Rule"))
    )
    assert sorted(Counter(t.node for t in q.tasks).values()) == [1, 6]


def test_shares_is_pure_and_refuses_what_does_not_fit() -> None:
    g = TaskGroupRequest("tg", task_count=5, node_count=2)
    assert shares(g, [("a", 2), ("b", 2)]) is None
    assert shares(g, [("a", 3), ("b", 2)]) == [("a", [0, 1, 2]), ("b", [3, 4])]
    rr = TaskGroupRequest("tg", task_count=4, rule=Rule.ROUND_ROBIN)
    assert shares(rr, [("a", 1), ("b", 8)]) == [("a", [0]), ("b", [1, 2, 3])]


# -- contradictions --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("items", "fragment"),
    [
        ((P("TaskCount", 4), P("Processors", 10)), "Processors=10 cannot be split evenly over TaskCount=4"),
        ((P("TaskCount", 4), P("Processors", 2)), "Processors=2 is fewer than TaskCount=4"),
        (
            (P("TaskCount", 4), P("Processors", 10), P("TaskDistribution", 2, type="ProcessorsPerTask")),
            "Processors=10 contradicts TaskCount=4 x ProcessorsPerTask=2",
        ),
        ((P("TaskCount", 2), P("NodeCount", 3)), "NodeCount=3 but only 2 task(s)"),
        (
            (P("TaskCount", 5), P("NodeCount", 2), P("TaskDistribution", 2, type="TasksPerNode")),
            "TasksPerNode=2 puts TaskCount=5 task(s) on 3 node(s), but NodeCount=2",
        ),
        ((P("TaskCount", 3), P("TaskDistribution", "{1}{2}", type="Geometry")), "places 2 task(s) but TaskCount=3"),
        ((P("NodeCount", 3), P("TaskDistribution", "{1}{2}", type="Geometry")), "uses 2 node(s) but NodeCount=3"),
        ((P("TaskDistribution", 0, type="TasksPerNode"),), "whole number >= 1"),
    ],
)
def test_contradictions_are_refused_naming_both_values(items: tuple[Property, ...], fragment: str) -> None:
    with pytest.raises(SssError) as e:
        World([8]).request(job(*items))
    assert fragment in str(e.value) and "TaskGroup" in str(e.value)


def test_job_and_its_task_groups_must_agree() -> None:
    w = World([8])
    one = Job(Properties.of(P("Executable", "x"), P("Processors", 8)), [TaskGroup(Properties.of(P("Processors", 4)))])
    with pytest.raises(SssError, match="the Job says Processors=8 but its only TaskGroup says Processors=4"):
        w.request(one)
    two = Job(
        Properties.of(P("Executable", "x"), P("Processors", 8)),
        [TaskGroup(Properties.of(P("TaskCount", 1))), TaskGroup(Properties.of(P("TaskCount", 3)))],
    )
    with pytest.raises(SssError, match="Job Processors=8 but its TaskGroups hold 4 processors"):
        w.request(two)
    nodes = Job(Properties.of(P("Executable", "x"), P("NodeCount", 2)), [TaskGroup(), TaskGroup()])
    with pytest.raises(SssError, match="give each TaskGroup its NodeCount"):
        w.request(nodes)
    explicit = Job(
        Properties.of(P("Executable", "x")),
        [TaskGroup(Properties.of(P("TaskCount", 1)), tasks=[Task(), Task()])],
    )
    with pytest.raises(SssError, match="has 2 <Task> elements but TaskCount=1"):
        w.request(explicit)


# -- resources ---------------------------------------------------------------------------------------------------


def test_exclusive_nodes_are_not_shared() -> None:
    w = World([4, 4])
    first = w.placed(job(P("TaskCount", 1), P("Extension", True, name="Exclusive", type="PSIJ")), "a")
    assert layout(first) == {"n1": [0]}
    second = w.place(job(P("TaskCount", 2)), "b")
    assert set(layout(second)) == {"n2"}  # n1 belongs to job a alone
    third = w.place(job(P("TaskCount", 1), P("Extension", True, name="Exclusive", type="PSIJ")), "c")
    assert third is None  # n2 holds job b's tasks
    release(first, w.res, job_id="a")
    assert w.res.slots["n1"].exclusive_job is None


def test_global_license_per_job_and_host_consumables_per_task() -> None:
    reg = AttributeRegistry(
        [
            AttributeDefinition("License:ESSL2", "", AttributeType.INT, Relop.LE, consumable=ConsumableKind.JOB),
            AttributeDefinition("scratch", "", AttributeType.MEMORY, Relop.LE, consumable=ConsumableKind.SLOT),
        ]
    )
    w = World(
        [8, 8],
        registry=reg,
        global_capacity={"Resource:License:ESSL2": 2},
        host_capacity={"Resource:scratch": 3},
    )
    licensed = job(P("TaskCount", 4), P("Resource", 1, name="License", type="ESSL2"), P("Resource", 1, name="scratch"))
    a = w.placed(licensed, "a")
    assert a is not None and w.res.global_ledger.free["Resource:License:ESSL2"] == 1  # once per job, not per task
    assert sorted(Counter(t.node for t in a.tasks).values()) == [1, 3]  # scratch 3 per node caps tasks at 3
    b = w.place(job(P("TaskCount", 1), P("Resource", 1, name="License", type="ESSL2")), "b")
    assert b is not None and w.res.global_ledger.free["Resource:License:ESSL2"] == 0
    assert w.place(job(P("TaskCount", 1), P("Resource", 1, name="License", type="ESSL2")), "c") is None
    release(a, w.res, job_id="a")
    assert w.res.global_ledger.free["Resource:License:ESSL2"] == 1
    assert all(led.free["Resource:scratch"] == 3 for led in w.res.ledgers.values())


def test_memory_and_gpus_per_task() -> None:
    w = World([8, 8], memory=4 * GiB)
    p = w.placed(job(P("TaskCount", 3), P("Memory", 2, units="GB"), P("Resource", 1, name="GPU")))
    assert Counter(t.node for t in p.tasks) == {"n1": 2, "n2": 1}
    assert all(t.memory == 2 * GiB and len(t.gpus) == 1 for t in p.tasks)


def test_all_task_groups_or_none() -> None:
    w = World([2, 2])
    two = Job(
        Properties.of(P("Executable", "x")),
        [TaskGroup(Properties.of(P("TaskCount", 2))), TaskGroup(Properties.of(P("TaskCount", 3)))],
    )
    assert w.place(two) is None
    assert all(len(s.free_cores) == 2 and s.holders == 0 for s in w.res.slots.values())  # rolled back


def test_variants_are_tried_in_order() -> None:
    w = World([4], memory=1 * GiB)
    req = [P("Memory", 1024, preference=2), P("Memory", 512, preference=1)]
    p = w.place(job(P("TaskCount", 2), requested=req))
    assert p is not None and p.variant == 1 and all(t.memory == 512 * 2**20 for t in p.tasks)


# -- the spec's elaborate example and the master/worker job --------------------------------------------------------


def test_master_worker_from_one_file() -> None:
    text = (DATA / "sss_elaborate.xml").read_text().replace("<NodeCount>4</NodeCount>", "<NodeCount>3</NodeCount>")
    group = read_job(text).value
    assert isinstance(group, JobGroup)
    w = World(
        [8, 8, 8, 8],
        features={4: ["Jumbo-Frame"]},
        global_capacity={"Resource:License:ESSL2": 1},
    )
    for name in ("n1", "n2", "n3", "n4"):  # the Slave group asks Node pattern fr15n.*
        w.cluster.nodes[name].hostname = "fr15" + name
    w.cluster.touch()
    p = w.place(w.request(group, 1))
    assert p is not None
    master, workers = p.by_group(0), p.by_group(1)
    assert [t.node for t in master] == ["n4"]  # the only Jumbo-Frame node
    assert len(workers) == 12  # Processors 12 Or 16: the first that fits
    nodes = [t.node for t in sorted(workers, key=lambda t: t.task)]
    assert len(set(nodes)) == 3 and all(nodes[i] == nodes[i % 3] for i in range(12))  # round robin over 3
    assert w.res.global_ledger.free["Resource:License:ESSL2"] == 0


# -- explain and never-fits -----------------------------------------------------------------------------------------


def test_why_not_names_the_requirement_or_the_shortfall() -> None:
    w = World([4, 4])
    reasons = why_not(w.request(job(P("Feature", "Jumbo-Frame"))), w.matcher, w.res, idle=True)
    assert any("Feature=Jumbo-Frame does not hold" in r for r in reasons)
    big = why_not(w.request(job(P("TaskCount", 9))), w.matcher, w.res, idle=True)
    assert any("room for 8 such task(s) when idle" in r for r in big)
    assert why_not(w.request(job(P("TaskCount", 8))), w.matcher, w.res, idle=True) == []
    w.place(job(P("TaskCount", 8)), "a")
    busy = why_not(w.request(job(P("TaskCount", 1))), w.matcher, w.res)
    assert any("room for 0 such task(s) now" in r for r in busy)


# -- the category cursor -----------------------------------------------------------------------------------------


def test_a_pass_matches_a_category_once_and_skips_full_nodes_once() -> None:
    w = World([4] * 20)
    req = w.request(job(P("TaskCount", 1)))
    sched = SchedulingPass(w.matcher, w.res)
    placed = [sched.place(str(i), req) for i in range(100)]
    assert sum(p is not None for p in placed) == 80
    assert w.matcher.evaluations == 20  # 100 tasks, 20 node verdicts
    base = World([4] * 20)
    breq = base.request(job(P("TaskCount", 1)))
    baseline = SchedulingPass(base.matcher, base.res, cache=False)
    assert sum(baseline.place(str(i), breq) is not None for i in range(100)) == 80
    assert base.matcher.evaluations == 100 * 20  # without the cache: every task against every node


# -- the PSI/J path gives what the existing placement gives ----------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    cores=st.lists(st.integers(1, 8), min_size=1, max_size=5),
    count=st.integers(1, 12),
    nodes=st.none() | st.integers(1, 4),
    per_process=st.integers(1, 3),
)
def test_sss_placement_agrees_with_psij_placement(
    cores: list[int], count: int, nodes: int | None, per_process: int
) -> None:
    if nodes is not None and nodes > count:
        nodes = count
    rr = ResourceRequest(process_count=count, node_count=nodes, cpu_cores_per_process=per_process)
    legacy = [
        NodeSlots.from_configured(NodeConfigured(f"n{i + 1}", f"n{i + 1}", list(range(c)), 16 * GiB, [0, 1]))
        for i, c in enumerate(cores)
    ]
    old = place(rr, legacy, job_id="j")
    w = World(cores)
    new = w.place(to_sss(JobDescription(executable="x", resources=rr)))
    assert (old is None) == (new is None)
    if old is not None and new is not None:
        assert [(r.node, r.cores) for r in old] == [(t.node, t.cores) for t in new.tasks]


def test_identical_requests_of_differently_named_jobs_are_one_category() -> None:
    w = World([4])
    a = w.request(
        Job(Properties.of(P("Executable", "x"), P("Name", "a")), [TaskGroup(Properties.of(P("TaskCount", 2)))])
    )
    b = w.request(
        Job(Properties.of(P("Executable", "y"), P("Name", "b")), [TaskGroup(Properties.of(P("TaskCount", 2)))])
    )
    assert a.category == b.category and hash(a.category) == hash(b.category) and a.where != b.where


def test_why_not_names_a_per_job_consumable_nobody_offers() -> None:
    reg = AttributeRegistry(
        [AttributeDefinition("lic", "", AttributeType.INT, Relop.LE, consumable=ConsumableKind.JOB)]
    )
    w = World([4], registry=reg)
    reasons = why_not(w.request(job(P("Resource", 1, name="lic"))), w.matcher, w.res, idle=True)
    assert any("no node and no global pool offers lic" in r for r in reasons)


def test_the_spec_examples_resolve_and_place() -> None:
    w = World([8, 8, 8, 8], memory=32 * GiB)
    simple = read_job((DATA / "sss_simple.xml").read_text()).value
    assert isinstance(simple, Job)
    (v,) = w.request(simple).variants
    assert (v[0].task_count, v[0].processors_per_task) == (16, 1)
    moderate = read_job((DATA / "sss_moderate.xml").read_text()).value
    assert isinstance(moderate, Job)
    req = w.request(moderate)
    assert req.duration == 3600
    (m,) = req.variants
    assert (m[0].task_count, m[0].memory_per_task) == (12, 2 * GiB)  # Processors GE 12: the least that satisfies
    group = read_job((DATA / "sss_elaborate.xml").read_text()).value
    assert isinstance(group, JobGroup)
    first = w.placed(w.request(group, 0), "e1")
    assert len({t.node for t in first.tasks}) == 2  # TaskCount 2, TasksPerNode 1


def offer(w: World, node: str, capacity: dict[str, float]) -> None:
    """Give one node of ``w`` consumables of its own (what [nodes."<name>"] consumables does)."""
    m = w.cluster.nodes[node]
    m.configured.update(capacity)
    w.cluster.touch(m)
    w.res.ledgers[node] = ConsumableLedger.of(capacity)


def test_requestable_no_is_refused_and_forced_keeps_other_requests_off() -> None:
    reg = AttributeRegistry(
        [
            AttributeDefinition("token", "", AttributeType.INT, Relop.LE, Requestable.FORCED, ConsumableKind.SLOT),
            AttributeDefinition("seat", "", AttributeType.INT, Relop.LE, Requestable.NO, ConsumableKind.SLOT, 1),
        ]
    )
    w = World([4, 4, 4], registry=reg)
    offer(w, "n1", {"Resource:token": 8})
    offer(w, "n2", {"Resource:seat": 8})
    with pytest.raises(SssError, match=r"seat cannot be requested \(requestable = NO"):
        w.request(job(P("Resource", 1, name="seat")))
    plain = w.placed(job(P("TaskCount", 8)), "plain")
    assert Counter(t.node for t in plain.tasks) == {"n2": 4, "n3": 4}  # n1 offers the FORCED token
    assert w.place(job(P("TaskCount", 1)), "more") is None
    asking = w.placed(job(P("TaskCount", 2), P("Resource", 1, name="token")), "asking")
    assert {t.node for t in asking.tasks} == {"n1"} and w.res.ledgers["n1"].free["Resource:token"] == 6
    w.cluster.global_values.fixed["token"] = 1.0  # offered by the allocation as a whole: nowhere without it
    reasons = why_not(w.request(job()), Matcher(w.cluster), w.res, idle=True)
    assert any("3 of 3 node(s) excluded because it offers token" in r for r in reasons), reasons


def test_a_default_is_taken_where_offered_and_restricts_nothing() -> None:
    """SGE: a level that lacks the attribute is skipped, so a default keeps no task off a node."""
    reg = AttributeRegistry(
        [
            AttributeDefinition("seat", "", AttributeType.INT, Relop.LE, consumable=ConsumableKind.SLOT, default=1),
            AttributeDefinition("pool", "", AttributeType.INT, Relop.LE, consumable=ConsumableKind.JOB, default=2),
        ]
    )
    w = World([4, 4], registry=reg)
    offer(w, "n2", {"Resource:seat": 3, "Resource:pool": 2})
    p = w.placed(job(P("TaskCount", 7)), "a")
    assert Counter(t.node for t in p.tasks) == {"n1": 4, "n2": 3}  # seat 3 caps n2 at 3 tasks
    assert w.res.ledgers["n2"].free == {"Resource:seat": 0.0, "Resource:pool": 2.0}  # pool: first task on n1
    release(p, w.res, job_id="a")
    assert w.res.ledgers["n2"].free == {"Resource:seat": 3.0, "Resource:pool": 2.0}


def test_disk_swap_network_and_typed_resources_are_matched() -> None:
    reg = AttributeRegistry(
        [AttributeDefinition("License", "", AttributeType.INT, Relop.LE, consumable=ConsumableKind.SLOT)]
    )
    w = World([2, 2], registry=reg)
    offer(w, "n2", {"Disk": 100 * GiB, "Swap": 8 * GiB, "Network": 10 * GiB, "Resource:License:ESSL2": 1})
    p = w.placed(
        job(
            P("Disk", 10, units="GB"),
            P("Swap", 1, units="GB"),
            P("Network", 1),
            P("Resource", 1, name="License", type="ESSL2"),
        )
    )
    assert p.tasks[0].node == "n2" and w.res.ledgers["n2"].free["Resource:License:ESSL2"] == 0
    assert w.place(job(P("Resource", 1, name="License", type="ESSL2")), "again") is None
    too_big = w.request(job(P("Disk", 200, units="GB")))
    assert w.place(too_big, "big") is None
    assert any("it has no Disk" in r for r in why_not(too_big, w.matcher, w.res, idle=True))

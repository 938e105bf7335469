"""Unit tests of placement (pilot/scheduler): place, release, never_fits, NodeSlots and JobQueue,
plus the ResourceSpecV1 contradictions that JobDescription.from_wire must catch before placement."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.model.job_description import DescriptionError, JobDescription, ResourceRequest
from pilot.model.node import NodeConfigured
from pilot.scheduler import JobQueue, NodeSlots, RankPlacement, never_fits, place, release

GiB = 1024**3


def node(name: str, cores: int = 4, gpus: int = 0, memory: int = 8 * GiB, *, first_core: int = 0) -> NodeSlots:
    return NodeSlots.from_configured(
        NodeConfigured(
            name=name,
            hostname="h-" + name,
            processors=list(range(first_core, first_core + cores)),
            memory=memory,
            gpus=list(range(gpus)),
        )
    )


def req(**kw: Any) -> ResourceRequest:
    return ResourceRequest(**kw)


def by_node(ranks: list[RankPlacement]) -> dict[str, list[RankPlacement]]:
    out: dict[str, list[RankPlacement]] = {}
    for r in ranks:
        out.setdefault(r.node, []).append(r)
    return out


def snapshot(nodes: list[NodeSlots]) -> list[tuple[Any, ...]]:
    return [(n.free_cores[:], n.free_gpus[:], n.free_memory, n.holders, n.exclusive_job) for n in nodes]


# -- packing -----------------------------------------------------------------------------------------


def test_single_core_jobs_pack_lowest_cores_of_the_first_node_first() -> None:
    nodes = [node("a"), node("b")]
    got = [place(req(), nodes, job_id=str(i)) for i in range(8)]
    assert all(g is not None and len(g) == 1 for g in got)
    placed = [(g[0].node, g[0].cores) for g in got if g]
    assert placed == [("a", [0]), ("a", [1]), ("a", [2]), ("a", [3]), ("b", [0]), ("b", [1]), ("b", [2]), ("b", [3])]
    assert place(req(), nodes, job_id="9") is None
    assert [n.free_cores for n in nodes] == [[], []]
    assert [n.holders for n in nodes] == [4, 4]


def test_released_cores_are_reused_lowest_first() -> None:
    nodes = [node("a")]
    ranks = [place(req(), nodes, job_id=str(i)) for i in range(4)]
    assert nodes[0].free_cores == []
    release(ranks[2] or [], {"a": nodes[0]}, job_id="2")
    release(ranks[1] or [], {"a": nodes[0]}, job_id="1")
    assert nodes[0].free_cores == [1, 2]  # kept sorted
    again = place(req(), nodes, job_id="x")
    assert again is not None and again[0].cores == [1]


def test_multi_core_process_takes_contiguous_lowest_cores() -> None:
    nodes = [node("a", cores=8)]
    first = place(req(cpu_cores_per_process=3), nodes, job_id="1")
    second = place(req(cpu_cores_per_process=3), nodes, job_id="2")
    assert first is not None and second is not None
    assert first[0].cores == [0, 1, 2] and second[0].cores == [3, 4, 5]
    assert place(req(cpu_cores_per_process=3), nodes, job_id="3") is None  # 2 left
    assert nodes[0].free_cores == [6, 7]


def test_packing_spills_ranks_over_nodes_in_order() -> None:
    nodes = [node("a"), node("b"), node("c")]
    ranks = place(req(process_count=6), nodes, job_id="1")
    assert ranks is not None
    assert {k: len(v) for k, v in by_node(ranks).items()} == {"a": 4, "b": 2}
    cores = [(r.node, c) for r in ranks for c in r.cores]
    assert len(cores) == len(set(cores)) == 6


def test_packing_is_all_or_nothing() -> None:
    nodes = [node("a"), node("b")]
    assert place(req(), nodes, job_id="0") is not None
    before = snapshot(nodes)
    assert place(req(process_count=8), nodes, job_id="1") is None  # 7 free
    assert snapshot(nodes) == before


def test_single_rank_job_skips_full_nodes() -> None:
    nodes = [node("a", cores=2), node("b", cores=4)]
    assert place(req(cpu_cores_per_process=2), nodes, job_id="1") is not None
    big = place(req(cpu_cores_per_process=3), nodes, job_id="2")
    assert big is not None and big[0].node == "b" and big[0].cores == [0, 1, 2]


def test_unusable_nodes_are_never_used() -> None:
    a, b = node("a"), node("b")
    a.usable = False
    ranks = place(req(process_count=4), [a, b], job_id="1")
    assert ranks is not None and {r.node for r in ranks} == {"b"}
    assert place(req(), [a, b], job_id="2") is None


# -- node_count / processes_per_node spreads -------------------------------------------------------


def test_node_count_spreads_evenly() -> None:
    nodes = [node("a"), node("b"), node("c")]
    ranks = place(req(process_count=4, node_count=2), nodes, job_id="1")
    assert ranks is not None
    assert {k: len(v) for k, v in by_node(ranks).items()} == {"a": 2, "b": 2}


def test_node_count_uneven_gives_larger_share_to_the_node_with_most_room() -> None:
    nodes = [node("a", cores=2), node("b", cores=4)]
    ranks = place(req(process_count=3, node_count=2), nodes, job_id="1")
    assert ranks is not None
    assert {k: len(v) for k, v in by_node(ranks).items()} == {"a": 1, "b": 2}
    # ranks come back in node order
    assert [r.node for r in ranks] == ["a", "b", "b"]


def test_node_count_needs_that_many_distinct_nodes() -> None:
    nodes = [node("a", cores=8), node("b", cores=8)]
    assert place(req(process_count=3, node_count=3), nodes, job_id="1") is None
    assert snapshot(nodes) == snapshot([node("a", cores=8), node("b", cores=8)])


def test_node_count_uses_only_nodes_with_room_for_the_share() -> None:
    nodes = [node("a"), node("b"), node("c")]
    assert place(req(cpu_cores_per_process=3), nodes, job_id="busy") is not None  # a has 1 core left
    ranks = place(req(process_count=4, node_count=2), nodes, job_id="1")
    assert ranks is not None
    assert {k: len(v) for k, v in by_node(ranks).items()} == {"b": 2, "c": 2}


def test_processes_per_node_fixes_the_spread() -> None:
    nodes = [node("a"), node("b"), node("c")]
    ranks = place(req(process_count=4, processes_per_node=2), nodes, job_id="1")
    assert ranks is not None
    per = {k: len(v) for k, v in by_node(ranks).items()}
    assert sorted(per.values()) == [2, 2] and len(per) == 2
    # one rank per node across all three
    ranks = place(req(process_count=3, processes_per_node=1, node_count=3), nodes, job_id="2")
    assert ranks is not None and sorted(r.node for r in ranks) == ["a", "b", "c"]


def test_processes_per_node_waits_when_no_node_has_room_for_its_share() -> None:
    nodes = [node("a"), node("b")]
    place(req(cpu_cores_per_process=3), nodes, job_id="x")
    place(req(cpu_cores_per_process=3), nodes, job_id="y")
    # 1 core free on each node: 2 ranks fit in total but not 2 on one node
    assert place(req(process_count=2, processes_per_node=2), nodes, job_id="1") is None
    ranks = place(req(process_count=2, processes_per_node=1), nodes, job_id="2")
    assert ranks is not None and sorted(r.node for r in ranks) == ["a", "b"]


# -- exclusive nodes ----------------------------------------------------------------------------------


def test_exclusive_job_owns_its_node_until_released() -> None:
    nodes = [node("a"), node("b")]
    ex = place(req(exclusive_node_use=True), nodes, job_id="ex")
    assert ex is not None and ex[0].node == "a" and ex[0].cores == [0]
    assert nodes[0].exclusive_job == "ex"
    # three cores free on a, but nobody else may use them
    others = [place(req(), nodes, job_id=f"o{i}") for i in range(4)]
    assert all(o is not None and o[0].node == "b" for o in others)
    assert place(req(), nodes, job_id="late") is None
    release(ex, {n.name: n for n in nodes}, job_id="ex")
    assert nodes[0].exclusive_job is None and nodes[0].free_cores == [0, 1, 2, 3]
    late = place(req(), nodes, job_id="late")
    assert late is not None and late[0].node == "a"


def test_exclusive_job_does_not_go_where_anything_runs() -> None:
    nodes = [node("a"), node("b")]
    place(req(), nodes, job_id="small")  # on a
    ex = place(req(exclusive_node_use=True, process_count=2), nodes, job_id="ex")
    assert ex is not None and {r.node for r in ex} == {"b"}
    assert place(req(exclusive_node_use=True), nodes, job_id="ex2") is None


def test_exclusive_multi_node_job_marks_every_node() -> None:
    nodes = [node("a"), node("b"), node("c")]
    ex = place(req(exclusive_node_use=True, process_count=2, node_count=2), nodes, job_id="ex")
    assert ex is not None
    assert [n.exclusive_job for n in nodes] == ["ex", "ex", None]
    release(ex, {n.name: n for n in nodes}, job_id="ex")
    assert [n.exclusive_job for n in nodes] == [None, None, None]


def test_release_of_another_job_does_not_clear_exclusivity() -> None:
    nodes = [node("a")]
    ex = place(req(exclusive_node_use=True), nodes, job_id="ex")
    assert ex is not None
    release([], {"a": nodes[0]}, job_id="other")
    assert nodes[0].exclusive_job == "ex"


# -- GPUs and memory ----------------------------------------------------------------------------------


def test_gpus_are_consumable_and_distinct() -> None:
    nodes = [node("a", cores=8, gpus=2)]
    g1 = place(req(gpu_cores_per_process=1), nodes, job_id="1")
    g2 = place(req(gpu_cores_per_process=1), nodes, job_id="2")
    assert g1 is not None and g2 is not None
    assert (g1[0].gpus, g2[0].gpus) == ([0], [1])
    assert place(req(gpu_cores_per_process=1), nodes, job_id="3") is None
    cpu_only = place(req(), nodes, job_id="4")
    assert cpu_only is not None and cpu_only[0].gpus == []
    release(g2, {"a": nodes[0]}, job_id="2")
    g3 = place(req(gpu_cores_per_process=1), nodes, job_id="3")
    assert g3 is not None and g3[0].gpus == [1]


def test_gpus_limit_ranks_per_node() -> None:
    nodes = [node("a", gpus=2), node("b", gpus=2)]
    ranks = place(req(process_count=3, gpu_cores_per_process=1), nodes, job_id="1")
    assert ranks is not None
    assert [(r.node, r.gpus) for r in ranks] == [("a", [0]), ("a", [1]), ("b", [0])]


def test_memory_is_consumable() -> None:
    nodes = [node("a", cores=8, memory=GiB)]
    half = GiB // 2 + 1
    m1 = place(req(memory_per_process=half), nodes, job_id="1")
    assert m1 is not None and m1[0].memory == half
    assert nodes[0].free_memory == GiB - half
    assert place(req(memory_per_process=half), nodes, job_id="2") is None
    small = place(req(memory_per_process=GiB // 4), nodes, job_id="3")
    assert small is not None
    release(m1, {"a": nodes[0]}, job_id="1")
    assert nodes[0].free_memory == GiB - GiB // 4
    assert place(req(memory_per_process=half), nodes, job_id="2") is not None


def test_memory_limits_ranks_per_node() -> None:
    nodes = [node("a", cores=8, memory=GiB)]
    assert nodes[0].capacity(req(memory_per_process=GiB // 3)) == 3
    assert place(req(process_count=4, memory_per_process=GiB // 3), nodes, job_id="1") is None
    assert place(req(process_count=3, memory_per_process=GiB // 3), nodes, job_id="1") is not None


# -- never_fits -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_kw", "reason"),
    [
        ({"cpu_cores_per_process": 5}, "each process asks for 5 cores but the largest node has 4"),
        ({"gpu_cores_per_process": 3}, "each process asks for 3 GPUs but the most any node has is 2"),
        ({"memory_per_process": 9 * GiB}, f"each process asks for {9 * GiB} bytes of memory but the largest node"),
        ({"process_count": 3, "node_count": 3}, "asks for 3 nodes but the allocation has 2"),
        ({"process_count": 9}, "the whole allocation (2 node(s)) holds at most 8 such processes"),
        ({"process_count": 5, "processes_per_node": 5}, "with 5 per node"),
        ({"process_count": 3, "gpu_cores_per_process": 2}, "holds at most 2 such processes"),
    ],
)
def test_never_fits_names_the_reason(request_kw: dict[str, Any], reason: str) -> None:
    nodes = [node("a", gpus=2), node("b", gpus=2)]
    r = never_fits(req(**request_kw), nodes)
    assert r is not None and reason in r, r


def test_never_fits_looks_at_idle_nodes_not_free_slots() -> None:
    nodes = [node("a"), node("b")]
    place(req(process_count=8), nodes, job_id="all")
    before = snapshot(nodes)
    assert place(req(cpu_cores_per_process=4), nodes, job_id="1") is None  # busy now
    assert never_fits(req(cpu_cores_per_process=4), nodes) is None  # but fits when idle
    assert snapshot(nodes) == before  # and asking changed nothing


def test_never_fits_without_nodes_is_undecided() -> None:
    assert never_fits(req(cpu_cores_per_process=10_000), []) is None


def test_gpu_job_never_fits_a_cpu_only_allocation() -> None:
    r = never_fits(req(gpu_cores_per_process=1), [node("a")])
    assert r is not None and "GPUs" in r and "0" in r


# -- invariants under random use -------------------------------------------------------------------


@dataclass
class _Op:
    kind: str
    request: ResourceRequest
    which: int


_requests = st.builds(
    ResourceRequest,
    process_count=st.integers(1, 5),
    cpu_cores_per_process=st.integers(1, 3),
    gpu_cores_per_process=st.integers(0, 2),
    memory_per_process=st.sampled_from([0, GiB // 4, GiB // 2]),
    exclusive_node_use=st.booleans(),
)
_ops = st.lists(st.builds(_Op, st.sampled_from(["place", "place", "release"]), _requests, st.integers(0, 100)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 3)), min_size=1, max_size=4), _ops)
def test_random_place_release_never_double_books(shape: list[tuple[int, int]], ops: list[_Op]) -> None:
    nodes = [node(f"n{i}", cores=c, gpus=g, memory=GiB) for i, (c, g) in enumerate(shape)]
    by_name = {n.name: n for n in nodes}
    idle = snapshot(nodes)
    held: dict[str, list[RankPlacement]] = {}
    ids = itertools.count()
    for op in ops:
        if op.kind == "place":
            job_id = str(next(ids))
            fits_ever = never_fits(op.request, nodes) is None
            ranks = place(op.request, nodes, job_id=job_id)
            if ranks is not None:
                assert fits_ever
                assert len(ranks) == op.request.process_count
                for r in ranks:
                    assert len(r.cores) == op.request.cpu_cores_per_process
                    assert len(r.gpus) == op.request.gpu_cores_per_process
                    assert r.memory == op.request.memory_per_process
                held[job_id] = ranks
        elif held:
            job_id = sorted(held)[op.which % len(held)]
            release(held.pop(job_id), by_name, job_id=job_id)
        # invariants: nothing held twice, held + free = total, no negative memory
        for n in nodes:
            mine = [r for ranks in held.values() for r in ranks if r.node == n.name]
            cores = [c for r in mine for c in r.cores] + n.free_cores
            gpus = [g for r in mine for g in r.gpus] + n.free_gpus
            assert sorted(cores) == n.cores, "a core is held twice or lost"
            assert sorted(gpus) == n.gpus, "a GPU is held twice or lost"
            assert n.free_memory + sum(r.memory for r in mine) == n.memory
            assert n.free_memory >= 0
            assert n.holders == len(mine)
            owners = {j for j, ranks in held.items() if any(r.node == n.name for r in ranks)}
            if n.exclusive_job is not None:
                assert owners == {n.exclusive_job}
    for job_id, ranks in list(held.items()):
        release(ranks, by_name, job_id=job_id)
    assert snapshot(nodes) == idle


# -- JobQueue -------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Job:
    name: str
    category: str
    alive: bool = True


def _queue() -> JobQueue[_Job]:
    return JobQueue(category=lambda j: j.category, alive=lambda j: j.alive)


def _take(q: JobQueue[_Job], category: str) -> _Job:
    """Take a category's head as the daemon does: the job leaves (its phase changes) and is counted out."""
    job = q.peek(category)
    assert job is not None
    job.alive = False
    q.drop()
    return job


def test_queue_is_fifo_within_a_category_and_heads_are_oldest_first() -> None:
    q = _queue()
    jobs = [_Job("a1", "A"), _Job("b1", "B"), _Job("a2", "A"), _Job("c1", "C"), _Job("b2", "B")]
    for j in jobs:
        q.push(j)
    assert len(q) == 5
    assert [(k, j.name) for k, j in q.heads()] == [("A", "a1"), ("B", "b1"), ("C", "c1")]
    assert _take(q, "A").name == "a1"
    # after a1 left, A's head is a2 (pushed after b1): B is now the oldest head
    assert [(k, j.name) for k, j in q.heads()] == [("B", "b1"), ("A", "a2"), ("C", "c1")]
    assert q.peek("A") is not None and q.peek("A").name == "a2"  # type: ignore[union-attr]
    assert [_take(q, "A").name, _take(q, "B").name, _take(q, "B").name, _take(q, "C").name] == [
        "a2",
        "b1",
        "b2",
        "c1",
    ]
    assert len(q) == 0 and list(q.heads()) == [] and q.peek("A") is None


def test_queue_skips_dead_items_and_counts_drops() -> None:
    q = _queue()
    a1, a2, a3, b1 = _Job("a1", "A"), _Job("a2", "A"), _Job("a3", "A"), _Job("b1", "B")
    for j in (a1, a2, a3, b1):
        q.push(j)
    a1.alive = False  # cancelled while queued: the owner says so and drops it from the count
    q.drop()
    a2.alive = False
    q.drop()
    assert len(q) == 2
    assert [(k, j.name) for k, j in q.heads()] == [("A", "a3"), ("B", "b1")]  # a3 was pushed before b1
    b1.alive = False
    q.drop()
    assert [j.name for _, j in q.heads()] == ["a3"]
    assert q.peek("B") is None
    assert _take(q, "A") is a3 and len(q) == 0


def test_scheduling_pass_with_the_queue_backfills_other_categories() -> None:
    """The daemon's pass: for every category head place as many as fit; a head that does not fit
    blocks only its own category (everything behind it is identical), not smaller jobs."""
    nodes = [node("a", cores=4)]
    started: list[str] = []
    q: JobQueue[tuple[str, ResourceRequest]] = JobQueue(
        category=lambda j: j[1].category, alive=lambda j: j[0] not in started
    )
    big, small = req(cpu_cores_per_process=3), req()
    for name, r in [("big1", big), ("big2", big), ("small1", small), ("small2", small)]:
        q.push((name, r))
    for category, _ in q.heads():
        while (job := q.peek(category)) is not None:
            if place(job[1], nodes, job_id=job[0]) is None:
                break
            started.append(job[0])
            q.drop()
    assert started == ["big1", "small1"]
    assert len(q) == 2 and [j[0] for _, j in q.heads()] == ["big2", "small2"]


# -- ResourceSpecV1 contradictions caught by JobDescription.from_wire --------------------------------


def resources(**kw: Any) -> ResourceRequest:
    return JobDescription.from_wire({"executable": "/bin/true", "resources": kw}).resources


def test_resources_defaults_and_inference() -> None:
    assert resources() == ResourceRequest()
    assert JobDescription.from_wire({"executable": "x"}).resources == ResourceRequest()
    assert resources(node_count=2, processes_per_node=3).process_count == 6
    assert resources(node_count=3).process_count == 3
    assert resources(processes_per_node=4).process_count == 4
    r = resources(process_count=8, node_count=2, cpu_cores_per_process=2, gpu_cores_per_process=1)
    assert (r.process_count, r.node_count, r.cpu_cores_per_process, r.gpu_cores_per_process) == (8, 2, 2, 1)
    assert resources(cpu_cores_per_process=None, memory_per_process=None).cpu_cores_per_process == 1


@pytest.mark.parametrize(
    ("kw", "names"),
    [
        ({"process_count": 5, "node_count": 2, "processes_per_node": 2}, ["process_count=5", "node_count=2"]),
        ({"process_count": 1, "node_count": 2}, ["2 nodes", "1 processes"]),
        ({"process_count": 5, "processes_per_node": 2}, ["process_count=5", "processes_per_node=2"]),
        ({"node_count": 0}, ["node_count", "at least 1"]),
        ({"process_count": -1}, ["process_count", "at least 1"]),
        ({"cpu_cores_per_process": 0}, ["cpu_cores_per_process", "at least 1"]),
        ({"gpu_cores_per_process": -1}, ["gpu_cores_per_process", "negative"]),
        ({"memory_per_process": -5}, ["memory_per_process", "negative"]),
        ({"cpu_cores_per_process": True}, ["cpu_cores_per_process", "integer", "bool"]),
        ({"process_count": 2.0}, ["process_count", "integer", "float"]),
        ({"node_count": "2"}, ["node_count", "integer", "str"]),
        ({"exclusive_node_use": 1}, ["exclusive_node_use", "true or false"]),
        ({"cores": 2}, ["unknown ResourceSpecV1 field", "cores"]),
    ],
)
def test_resource_contradictions_and_bad_types_name_the_field(kw: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(DescriptionError) as info:
        resources(**kw)
    for n in names:
        assert n in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ("not a map", ["must be a map"]),
        ({}, ["executable"]),
        ({"executable": ""}, ["executable is required"]),
        ({"executable": 7}, ["executable", "string", "int"]),
        ({"executable": "x", "resources": [1]}, ["resources must be a map"]),
        ({"executable": "x", "launcher": "aprun"}, ["launcher", "aprun"]),
        ({"executable": "x", "directory": "rel/dir"}, ["directory", "absolute"]),
        ({"executable": "x", "environment": {"1BAD": "v"}}, ["environment", "1BAD"]),
        ({"executable": "x", "environment": {"A": 1}}, ["environment"]),
        ({"executable": "x", "arguments": ["a", 1]}, ["arguments"]),
        ({"executable": "x", "duration": -1}, ["duration", "positive"]),
        ({"executable": "x", "duration": True}, ["duration"]),
        ({"executable": "x", "colour": "red"}, ["unknown job description field", "colour"]),
        ({"executable": "x", "custom_attributes": {1: 2}}, ["custom_attributes"]),
    ],
)
def test_job_description_errors_name_the_field(raw: Any, names: list[str]) -> None:
    with pytest.raises(DescriptionError) as info:
        JobDescription.from_wire(raw)
    for n in names:
        assert n in str(info.value), str(info.value)


def test_job_description_round_trips_through_the_wire_form() -> None:
    d = JobDescription.from_wire(
        {
            "executable": "/bin/echo",
            "arguments": ["${X}"],
            "environment": {"X": "1"},
            "directory": "/tmp",
            "launcher": "multiple",
            "duration": 5,
            "resources": {"process_count": 4, "processes_per_node": 2, "memory_per_process": 1024},
        }
    )
    assert JobDescription.from_wire(d.to_wire()) == d
    assert d.duration == 5.0 and d.resources.node_count is None and d.resources.processes_per_node == 2

"""Tasks placed behind busy cores: ``backlog`` deep, exact hand-over, and the agent never overlaps them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import Pilot
from hypothesis import given, settings
from hypothesis import strategies as st
from pilot_waits import agents_active, wait_for
from test_client_resilience import Restartable, final, gated, strays  # noqa: F401 -- fixture

import client as psij
from pilot.model.job_description import ResourceRequest
from pilot.scheduler.placement import BehindPass, NodeSlots, SlotTracker, can_wait_behind, place, place_behind


def _node(cores: int = 2) -> NodeSlots:
    ids = list(range(cores))
    return NodeSlots(
        name="n0", hostname="h", cores=ids, gpus=[], memory=1 << 30, free_cores=list(ids), free_memory=1 << 30
    )


def test_only_one_process_core_only_requests_wait_behind() -> None:
    assert can_wait_behind(ResourceRequest())
    assert can_wait_behind(ResourceRequest(cpu_cores_per_process=2))
    assert not can_wait_behind(ResourceRequest(process_count=2))
    assert not can_wait_behind(ResourceRequest(gpu_cores_per_process=1))
    assert not can_wait_behind(ResourceRequest(memory_per_process=1))
    assert not can_wait_behind(ResourceRequest(exclusive_node_use=True))


def test_behind_is_one_deep_and_hands_cores_over_exactly() -> None:
    node = _node(2)
    req = ResourceRequest()
    a = place(req, [node], job_id="a")
    b = place(req, [node], job_id="b")
    assert a and b and node.free_cores == []
    assert place(req, [node], job_id="c") is None
    c = place_behind(req, [node])
    d = place_behind(req, [node])
    assert c and d and {c[0].cores[0], d[0].cores[0]} == {0, 1} and c[0].behind
    assert place_behind(req, [node]) is None  # one deep: every busy core has a waiter
    # The holder of c's core exits: the core passes to c, it does not become free.
    holder = a[0] if a[0].cores == c[0].cores else b[0]
    node.give_back(holder)
    assert node.free_cores == [] and c[0].cores[0] not in node.waiting
    node.give_back(c[0])
    assert node.free_cores == c[0].cores


def test_behind_is_backlog_deep_least_queued_cores_first_and_hands_over_in_turn() -> None:
    node = _node(2)
    req = ResourceRequest()
    a = place(req, [node], job_id="a")
    b = place(req, [node], job_id="b")
    assert a and b
    behind = [place_behind(req, [node], depth=3) for _ in range(6)]
    assert all(behind)
    cores = [r[0].cores[0] for r in behind if r]
    assert cores == [0, 1, 0, 1, 0, 1]  # spread over the busy cores, not stacked on one
    assert place_behind(req, [node], depth=3) is None and node.waiting == {0: 3, 1: 3}
    assert node.holders == 8
    # Core 0 passes from holder to waiter to waiter: free only when the last of its four gave it back.
    node.give_back(a[0])
    for r in behind[0:4:2]:
        assert node.free_cores == [] and r
        node.give_back(r[0])
    assert node.free_cores == [] and node.waiting == {1: 3}
    assert behind[4] is not None
    node.give_back(behind[4][0])
    assert node.free_cores == [0] and 0 not in node.waiting
    # A waiter freed from behind core 1 before it started (canceled): the holder keeps its core.
    assert behind[1] is not None
    node.give_back(behind[1][0])
    assert node.free_cores == [0] and node.waiting == {1: 2}


def test_a_rank_behind_needs_enough_busy_cores() -> None:
    node = _node(2)
    one, two = ResourceRequest(), ResourceRequest(cpu_cores_per_process=2)
    a = place(one, [node], job_id="a")
    assert a and node.free_cores == [1]
    assert place_behind(two, [node], depth=4) is None  # core 1 is free: nothing to wait behind for it
    assert place_behind(one, [node], depth=4) is not None


def test_a_waiter_that_ends_first_leaves_the_holder_its_core() -> None:
    node = _node(1)
    req = ResourceRequest()
    a = place(req, [node], job_id="a")
    w = place_behind(req, [node])
    assert a and w
    node.give_back(w[0])  # the waiter was canceled before it could start
    assert node.free_cores == [] and not node.waiting
    node.give_back(a[0])
    assert node.free_cores == [0] and node.holders == 0


@settings(max_examples=200, deadline=None)
@given(
    cores=st.integers(1, 8),
    depth=st.integers(1, 5),
    before=st.lists(st.integers(0, 5), min_size=8, max_size=8),
    wants=st.lists(st.integers(1, 3), min_size=1, max_size=40),
)
def test_a_pass_heap_of_the_least_queued_cores_places_as_the_full_scan_does(
    cores: int, depth: int, before: list[int], wants: list[int]
) -> None:
    # The pass's heap (one-core ranks on a node with no free core) must choose what the scan of every
    # core chooses, rank after rank, mixed with wider ranks that drop the node's heap: least queued
    # first, low ids among equals, never past ``depth``.
    def busy() -> NodeSlots:
        node = _node(cores)
        node.free_cores = []
        node.waiting.update({c: before[c] for c in range(cores) if before[c]})
        return node

    scanned, heaped = busy(), busy()
    behind = BehindPass()
    for c in wants:
        req = ResourceRequest(cpu_cores_per_process=c)
        a = place_behind(req, [scanned], depth=depth)
        b = place_behind(req, [heaped], depth=depth, behind=behind)
        assert (a and a[0].cores) == (b and b[0].cores)
        assert scanned.waiting == heaped.waiting
        assert all(heaped.waiting[x] <= max(depth, before[x]) for x in range(cores))


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("release"), st.integers(0, 1000)),
        st.tuples(
            st.just("pass"),
            st.integers(1, 3),
            st.lists(st.tuples(st.sampled_from(["place", "behind"]), st.integers(1, 3)), min_size=1, max_size=12),
        ),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=6), ops=_OPS)
def test_a_tracked_node_set_places_exactly_as_a_look_at_every_node_does(
    shape: list[int], ops: list[tuple[Any, ...]]
) -> None:
    # The scheduler's node set is tracked (SlotTracker: which nodes may have a free core, or room behind
    # a busy one) so that a full allocation of thousands of nodes costs what changed, not a look at every
    # node per job. The same passes (placements on free cores and behind busy ones, at several depths,
    # with releases between) on a tracked set and on an untracked copy place every rank alike.
    def nodes() -> list[NodeSlots]:
        out = []
        for i, cores in enumerate(shape):
            n = _node(cores)
            n.name = f"n{i}"
            out.append(n)
        return out

    tracked, plain = nodes(), nodes()
    SlotTracker(tracked)
    held: list[tuple[Any, Any]] = []  # (tracked rank, plain rank)
    for op in ops:
        if op[0] == "release":
            if held:
                a, b = held.pop(op[1] % len(held))
                tracked[int(a.node[1:])].give_back(a)
                plain[int(b.node[1:])].give_back(b)
            continue
        _, depth, steps = op
        passes = BehindPass(), BehindPass()
        for kind, c in steps:
            req = ResourceRequest(cpu_cores_per_process=c)
            if kind == "place":
                a, b = place(req, tracked, job_id="j"), place(req, plain, job_id="j")
            else:
                a = place_behind(req, tracked, depth=depth, behind=passes[0])
                b = place_behind(req, plain, depth=depth, behind=passes[1])
            assert (a and [(r.node, r.cores) for r in a]) == (b and [(r.node, r.cores) for r in b])
            if a and b:
                held += list(zip(a, b, strict=True))
        for x, y in zip(tracked, plain, strict=True):
            assert (x.free_cores, x.waiting) == (y.free_cores, y.waiting)
    tracker = tracked[0].tracker
    assert tracker is not None and tracker.free_nodes == sum(1 for n in tracked if n.free_cores)
    assert all(not n.free_cores for n in tracked[: tracker.mark])


def test_tasks_behind_busy_cores_never_overlap_on_a_core(start_pilot: Any, tmp_path: Path) -> None:
    pilot = start_pilot('[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n')
    ex = pilot.executor()
    script = (
        "import json, os, sys, time; t0 = time.time(); time.sleep(0.15); "
        "json.dump({'cpus': sorted(os.sched_getaffinity(0)), 't0': t0, 't1': time.time()}, open(sys.argv[1], 'w'))"
    )
    jobs = []
    for i in range(8):
        job = psij.Job(psij.JobSpec(executable="python3", arguments=["-c", script, str(tmp_path / f"{i}.json")]))
        ex.submit(job)
        jobs.append(job)
    for job in jobs:
        status = job.wait(timeout=60)
        assert status is not None and status.state is psij.JobState.COMPLETED, status
    runs = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(8)]
    assert all(len(r["cpus"]) == 1 for r in runs)
    for i, r in enumerate(runs):
        for s in runs[i + 1 :]:
            if r["t0"] < s["t1"] and s["t0"] < r["t1"]:
                assert r["cpus"] != s["cpus"], (r, s)


def test_backlog_off_still_runs_everything(start_pilot: Any) -> None:
    pilot = start_pilot('[pilot]\nbacklog = 0\n[allocation]\nlrm = "local"\nnodes = 1\n')
    ex = pilot.executor()
    jobs = [psij.Job(psij.JobSpec(executable="/bin/true")) for _ in range(20)]
    for job in jobs:
        ex.submit(job)
    for job in jobs:
        status = job.wait(timeout=60)
        assert status is not None and status.state is psij.JobState.COMPLETED


def test_short_jobs_do_not_stay_behind_a_long_one_while_a_core_is_free(start_pilot: Any) -> None:
    """Jobs queued at an agent behind a core whose task turns out long are taken back and run on a core
    that frees up, instead of waiting for the long task: no head-of-line blocking behind it."""
    pilot = start_pilot('[pilot]\nbacklog = 8\n[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n')
    ex = pilot.executor()
    long = psij.Job(psij.JobSpec(executable="/bin/sleep", arguments=["60"]))
    ex.submit(long)
    long.wait(timeout=30, target_states=[psij.JobState.ACTIVE])
    # The other core runs one short job; the rest wait behind both cores, half of them behind the long one.
    short = [psij.Job(psij.JobSpec(executable="/bin/sleep", arguments=["0.3"])) for _ in range(10)]
    ex.submit_all(short)
    for job in short:
        status = job.wait(timeout=25)
        assert status is not None and status.state is psij.JobState.COMPLETED, (job.native_id, status)
    assert long.status.state is psij.JobState.ACTIVE  # all of them ran while it still runs
    ex.cancel(long)
    assert long.wait(timeout=30) is not None


def _two_long_tasks(
    pilot: Pilot, left: list[psutil.Process], tmp_path: Path, *, nodes: int
) -> tuple[Restartable, psij.JobExecutor, list[Path], list[psij.Job]]:
    """A pilot whose daemon the test may kill, with two tasks running until their gate files exist
    (the first gate's task started first), both ACTIVE."""
    r = Restartable(pilot, left)
    ex = r.executor()
    agents_active(ex, nodes)
    gates = [tmp_path / "first", tmp_path / "second"]
    longs = [psij.Job(gated(g)) for g in gates]
    for job in longs:
        ex.submit(job)
        assert job.wait(timeout=30, target_states=[psij.JobState.ACTIVE]) is not None
    return r, ex, gates, longs


@pytest.mark.timeout(150)
def test_jobs_behind_a_long_task_are_taken_back_by_a_restarted_daemon(
    strays: list[psutil.Process],  # noqa: F811 -- the fixture imported above
    start_pilot: Callable[..., Pilot],
    tmp_path: Path,
) -> None:
    """Jobs placed behind two busy cores, then the daemon is SIGKILLed and started again: the journal
    says which wait behind which core, and once one core is free the restarted daemon takes back those
    still waiting behind the other one's long task."""
    r, ex, gates, longs = _two_long_tasks(
        start_pilot(
            "[pilot]\nbacklog = 8\nheartbeat_interval = 0.5\nagent_timeout = 4\n"
            '[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n'
        ),
        strays,
        tmp_path,
        nodes=1,
    )
    short = [psij.Job(psij.JobSpec(executable="/bin/sleep", arguments=["0.2"])) for _ in range(8)]
    ex.submit_all(short)  # no core is free: all of them wait at the agent, behind one long task or the other
    r.kill_daemon()
    r.up_again()
    gates[0].touch()
    for job in short:
        assert final(job, 60).state is psij.JobState.COMPLETED, job.native_id
    assert longs[1].status.state is psij.JobState.ACTIVE  # they did not wait for it
    gates[1].touch()
    assert final(longs[1], 30).state is psij.JobState.COMPLETED
    assert final(longs[0], 30).state is psij.JobState.COMPLETED


def test_explain_says_a_job_waits_on_its_node_behind_a_busy_core(start_pilot: Any) -> None:
    """A job sent to its node behind a busy core is QUEUED but placed: explain says where it waits and
    for which core, not that it runs (it has not started) nor that it waits for resources."""
    pilot = start_pilot('[pilot]\nbacklog = 2\n[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 1\n')
    ex = pilot.executor()
    long = psij.Job(psij.JobSpec(executable="/bin/sleep", arguments=["60"]))
    ex.submit(long)
    assert long.wait(timeout=30, target_states=[psij.JobState.ACTIVE]) is not None
    assert any("is running (ranks)" in r for r in ex.explain(long))
    behind = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(behind)
    reasons = ex.explain(behind)
    assert behind.status.state is psij.JobState.QUEUED
    assert len(reasons) == 1 and "starts there as soon as core(s) 0 are free" in reasons[0], reasons
    assert "placed behind a running task (pilot.backlog)" in reasons[0]
    ex.cancel(long)
    status = behind.wait(timeout=30)
    assert status is not None and status.state is psij.JobState.COMPLETED
    assert ex.explain(behind) and "is running" not in ex.explain(behind)[0]


def _agent_of(pilot: Pilot, node: str) -> psutil.Process:
    for proc in psutil.Process(pilot.pid).children(recursive=True):
        try:
            if proc.environ().get("PILOT_AGENT_NODE") == node:
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"no agent process for node {node}")


@pytest.mark.timeout(150)
def test_a_daemon_killed_while_it_asks_an_order_back_loses_nothing_and_runs_it_once(
    strays: list[psutil.Process],  # noqa: F811 -- the fixture imported above
    start_pilot: Callable[..., Pilot],
    tmp_path: Path,
) -> None:
    """The daemon sends WITHDRAW for a job waiting behind a long task and dies before the agent's answer
    is journaled (the agent is stopped meanwhile, so the answer cannot come first). The restarted daemon
    learns the outcome from the agent (its answer replayed, or the order still waiting and asked back
    again): the job runs exactly once, on the free core, while the long task still runs."""
    r, ex, gates, longs = _two_long_tasks(
        start_pilot(
            "[pilot]\nbacklog = 4\nheartbeat_interval = 0.5\nagent_timeout = 30\n"
            '[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 1\n'
        ),
        strays,
        tmp_path,
        nodes=2,
    )
    (reason,) = ex.explain(longs[0])
    stuck_node = reason.rsplit(" on ", 1)[1]
    runs = tmp_path / "runs"
    short = [psij.Job(psij.JobSpec("/bin/sh", ["-c", f"echo {i} >> {runs}"])) for i in range(2)]
    ex.submit_all(short)  # one waits behind each long task
    behind = next(j for j in short if f"is on {stuck_node} and starts there" in ex.explain(j)[0])
    agent = _agent_of(r.pilot, stuck_node)
    agent.suspend()
    try:
        gates[1].touch()  # the other node's core frees up: the daemon asks the stuck job back
        wait_for(lambda: "is being taken back" in ex.explain(behind)[0], what="the WITHDRAW to be sent")
        r.kill_daemon()
    finally:
        agent.resume()
    r.up_again()
    for job in short:
        assert final(job, 60).state is psij.JobState.COMPLETED, job.native_id
    assert longs[0].status.state is psij.JobState.ACTIVE  # it did not wait for the long task
    assert sorted(runs.read_text().split()) == ["0", "1"]  # each ran exactly once
    gates[0].touch()
    assert final(longs[0], 30).state is psij.JobState.COMPLETED

"""Null (simulated) launches and virtual nodes hosted by one agent process (``allocation.launch = "null"``,
``nodes_per_agent``): the benchmark mode that measures the scheduler and the wire at many nodes.

A real daemon and a real agent process over real sockets; only the tasks are simulated. Each test
checks that nothing was spawned (the tasks would have written files) and that the simulation keeps the
rules real launches keep: states in order, exact core ownership, walltime, cancel.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from conftest import Pilot
from hypothesis import given, settings
from hypothesis import strategies as st
from pilot_waits import agents_active, callbacks_settled

import client as psij
from agent.simulated import NullEngine
from client import JobState
from pilot.config import ConfigError
from pilot.lrm.local import LocalExecutor
from pilot.model.process_order import ProcessOrder

WAIT = 30.0


def null_config(*, nodes: int, cores: int, per: int, duration: float = 0.0) -> str:
    return f"""
[pilot]
backlog = 1
[allocation]
lrm = "local"
nodes = {nodes}
cores_per_node = {cores}
launch = "null"
null_duration = {duration}
nodes_per_agent = {per}
"""


class Seen:
    """Every status each job's callbacks got, in order."""

    def __init__(self) -> None:
        self.by_job: dict[str, list[psij.JobStatus]] = {}
        self._lock = threading.Lock()

    def __call__(self, job: psij.Job, status: psij.JobStatus) -> None:
        with self._lock:
            self.by_job.setdefault(job.id, []).append(status)

    def settled(self, job: psij.Job) -> list[psij.JobStatus]:
        """The job's statuses once its callbacks have had its final one (see ``callbacks_settled``)."""
        with self._lock:
            got = self.by_job.setdefault(job.id, [])
        callbacks_settled(lambda: [status.state for status in got], f"job {job.id}")
        with self._lock:
            return list(got)


def final(job: psij.Job) -> psij.JobStatus:
    status = job.wait(timeout=WAIT)
    assert status is not None and status.final, f"job {job.native_id} not final: {job.status}"
    return status


def agent_processes(p: Pilot) -> list[psutil.Process]:
    return [c for c in psutil.Process(p.pid).children() if "agent" in " ".join(c.cmdline())]


@pytest.mark.timeout(90)
def test_null_launches_on_virtual_nodes_of_one_agent_process_spawn_nothing(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    p = start_pilot(null_config(nodes=5, cores=2, per=5))
    ex = p.executor()
    status = agents_active(ex, 5)
    assert sorted(n["name"] for n in status["nodes"]) == [f"local-{i}" for i in range(5)]
    assert len(agent_processes(p)) == 1, "five virtual nodes, one agent process"
    seen = Seen()
    ex.set_job_status_callback(seen)
    out = tmp_path / "out"
    out.mkdir()
    jobs = [psij.Job(psij.JobSpec(executable="/usr/bin/touch", arguments=[str(out / f"f{i}")])) for i in range(200)]
    ex.submit_all(jobs)
    for job in jobs:
        assert final(job).state is JobState.COMPLETED
        states = [s.state for s in seen.settled(job)]
        assert states == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED], states
        assert job.status.exit_code == 0
    assert list(out.iterdir()) == [], "a simulated launch must not run anything"
    nodes = {n for job in jobs for n in (job.status.metadata or {}).get("nodes", [])}
    assert nodes == {f"local-{i}" for i in range(5)}, "the work is spread over every virtual node"


@pytest.mark.timeout(90)
def test_simulated_tasks_keep_exact_core_ownership(start_pilot: Callable[..., Pilot]) -> None:
    p = start_pilot(null_config(nodes=2, cores=2, per=2, duration=0.2))
    ex = p.executor()
    agents_active(ex, 2)
    seen = Seen()
    ex.set_job_status_callback(seen)
    jobs = [psij.Job(psij.JobSpec(executable="/bin/true")) for _ in range(16)]
    ex.submit_all(jobs)
    intervals: dict[str, list[tuple[float, float]]] = {}
    for job in jobs:
        status = final(job)
        assert status.state is JobState.COMPLETED
        meta = status.metadata or {}
        (node,) = meta["nodes"]
        active = next(s for s in seen.settled(job) if s.state is JobState.ACTIVE)
        assert active.time is not None and status.time is not None
        assert status.time - active.time >= 0.2 - 1e-3, "it lasted its simulated duration"
        intervals.setdefault(node, []).append((active.time, status.time))
    # 16 one-core tasks of 0.2 s on 2 x 2 cores: never more than 2 at a time on a node.
    for node, spans in intervals.items():
        edges = sorted([(t0, 1) for t0, _ in spans] + [(t1, -1) for _, t1 in spans])
        running = peak = 0
        for _, step in edges:
            running += step
            peak = max(peak, running)
        assert peak <= 2, f"{node} ran {peak} one-core tasks at once on 2 cores"


@pytest.mark.timeout(90)
def test_simulated_tasks_honour_walltime_and_cancel(start_pilot: Callable[..., Pilot]) -> None:
    p = start_pilot(null_config(nodes=1, cores=2, per=1, duration=30.0))
    ex = p.executor()
    agents_active(ex, 1)
    assert len(agent_processes(p)) == 1
    short = psij.Job(
        psij.JobSpec(executable="/bin/true", attributes=psij.JobAttributes(duration=timedelta(seconds=0.5)))
    )
    held = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit_all([short, held])
    status = final(short)
    assert status.state is JobState.FAILED and status.message is not None and "walltime" in status.message, status
    assert held.wait(timeout=WAIT, target_states=[JobState.ACTIVE]) is not None
    held.cancel()
    assert final(held).state is JobState.CANCELED


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("options", "word"),
    [
        ({"launch": "fake"}, "allocation.launch"),
        ({"nodes_per_agent": 4}, "needs allocation.launch = 'null'"),
        ({"null_duration": 1.0}, "needs allocation.launch = 'null'"),
        ({"launch": "null", "null_duration": -1}, "allocation.null_duration"),
        ({"launch": "null", "nodes_per_agent": 0}, "allocation.nodes_per_agent"),
    ],
)
def test_null_launch_options_are_checked(options: dict[str, object], word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        LocalExecutor(options=options, source="t.toml")


@settings(max_examples=150, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True), min_size=1, max_size=30),
    withdrawn=st.sets(st.integers(0, 29), max_size=5),
)
def test_simulated_orders_waiting_for_their_cores_all_run_in_turn_one_per_core(
    shapes: list[list[int]], withdrawn: set[int]
) -> None:
    # In process, the engine alone: a holder on each of 4 cores, orders behind them (some withdrawn
    # before they start), then time passes. Each order not withdrawn starts and exits once, never with
    # another holder of one of its cores, and the orders of one core alone start in the order they came.
    engine = NullEngine(duration=1.0)
    holders = [ProcessOrder(f"h{c}", 0, "rank", "/bin/true", cores=[c]) for c in range(4)]
    orders = [
        ProcessOrder(str(i), 0, "rank", "/bin/true", cores=sorted(cores), after_cores=True)
        for i, cores in enumerate(shapes)
    ]
    engine.submit(holders)
    engine.submit(orders)
    for i in sorted(withdrawn):
        assert engine.withdraw((str(i), 0)) is (i < len(orders))
    engine.poll(time.monotonic() + 1e6)  # (each start is due 1 s after it: all of it ends in this poll)
    by_id = {o.job_id: o for o in holders + orders}
    holding: dict[int, str] = {}
    started: list[str] = []
    for event in engine.drain():
        order = by_id[event.job_id]
        if event.kind == "started":
            assert not any(c in holding for c in order.cores), f"{event.job_id} overlaps {holding}"
            holding.update({c: event.job_id for c in order.cores})
            started.append(event.job_id)
        elif event.kind == "exited":
            for c in order.cores:
                assert holding.pop(c) == event.job_id
        else:
            assert event.kind == "withdrawn" and int(event.job_id) in withdrawn
    expected = {str(i) for i in range(len(orders))} - {str(i) for i in withdrawn}
    assert sorted(started) == sorted(expected | {h.job_id for h in holders}) and not holding
    assert not engine.busy()
    for c in range(4):
        alone = [j for j in started if by_id[j].cores == [c] and j.isdigit()]
        assert alone == sorted(alone, key=int), f"core {c}'s own orders out of turn: {alone}"

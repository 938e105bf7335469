"""Jobs asked back from behind busy cores (Lifecycle.reclaim): the same choice a look at every node
gives, made looking at no more nodes with a free core than the jobs asked back need."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from core_env import CoreEnv, true
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilot.core.lifecycle import RECLAIM_AFTER
from pilot.core.phase import Phase
from pilot.core.reactor import Core
from pilot.model.job_description import ResourceRequest

pytestmark = pytest.mark.timeout(120)


def every_node_reclaim(core: Core, now: float) -> dict[str, list[list[Any]]]:
    """What reclaim asks back, decided with a look at every node (as it did before it looked lazily)."""
    free = {name: len(n.free_cores) for name, n in core.nodes.slots.items() if n.usable and n.free_cores}
    behind = core.book.behind
    out: dict[str, list[list[Any]]] = defaultdict(list)
    if not free or not behind or now - next(iter(behind.values())) < RECLAIM_AFTER:
        return {}
    room = sum(free.values())
    for job_id, since in behind.items():
        if room <= 0 or now - since < RECLAIM_AFTER:
            break
        job = core.book.jobs.get(job_id)
        if job is None or job.phase is not Phase.BEHIND or len(job.run.processes) != 1:
            continue
        slot, plan = next(iter(job.run.processes.items()))
        held = core.allocations.of_node(plan.node)
        need = len(plan.order.cores)
        if held is None or not any(n in held.nodes and c >= need for n, c in free.items()):
            continue
        out[plan.node].append([plan.order.job_id, slot])
        room -= need
    return dict(out)


def busy_with_backlog(env: CoreEnv, sizes: list[int], waits: list[float]) -> list[tuple[str, str]]:
    """Every node registered; rounds of jobs (``sizes``: cores per job) placed, the time advanced by
    ``waits`` between rounds. Returns the first-placed (node, job) pairs, each reported started."""
    for i in range(env.nodes):
        env.register(f"n{i}")
    running: list[tuple[str, str]] = []
    for r, wait in enumerate(waits):
        ids = env.submit(*(true(resources=ResourceRequest(cpu_cores_per_process=c)) for c in sizes[r :: len(waits)]))
        step = env.step()
        for i in range(env.nodes):
            for order in step.orders(f"n{i}"):
                if not order.get("after_cores") and order["job_id"] in ids:
                    running.append((f"n{i}", order["job_id"]))
                    env.started(f"n{i}", order["job_id"])
        env.step()
        env.advance(wait)
    return running


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.integers(1, 5),
    cores=st.integers(1, 4),
    data=st.data(),
    waits=st.lists(st.sampled_from([0.0, 0.02, 0.06]), min_size=1, max_size=3),
    later=st.sampled_from([0.06, 0.2, 0.0, 0.03]),
)
def test_reclaim_asks_back_what_a_look_at_every_node_would(
    nodes: int, cores: int, data: st.DataObject, waits: list[float], later: float
) -> None:
    # Between one and two jobs per core: some cores get a job behind theirs, some none (free once theirs ends).
    total = nodes * cores
    count = data.draw(st.integers(total + 1, total + total // 2 + 1), label="jobs")
    sizes = data.draw(st.lists(st.integers(1, min(2, cores)), min_size=count, max_size=count), label="cores per job")
    env = CoreEnv(nodes=nodes, cores=cores)
    running = busy_with_backlog(env, sizes, waits)
    ends = data.draw(
        st.lists(st.sampled_from([True, True, False]), min_size=len(running), max_size=len(running)), label="ended"
    )
    for (node, job_id), end in zip(running, ends, strict=True):
        if end:  # its core is free now unless a job waits behind it (the agent has not started that yet)
            env.exited(node, job_id)
    env.advance(later)
    core = env.core
    core.scheduler.run()  # the step's own pass first (nothing is queued: it places nothing)
    expected = every_node_reclaim(core, env.clock.mono)
    step = env.step()
    assert {k: v for k, v in step.out.withdraws.items() if v} == expected


def test_one_job_asked_back_looks_at_one_node_of_many_free() -> None:
    """A thousand nodes, every core free but one busy core with two jobs behind it, one of them old
    enough: it is asked back after a look at one node with a free core, not at every node."""
    env = CoreEnv(nodes=1000, cores=1)
    for i in range(env.nodes):
        env.core.on_agent(f"n{i}", _register(env, f"n{i}"))
    env.step()
    ids = env.submit(*(true() for _ in range(1000)))
    step = env.step()
    placed = {o["job_id"]: (n, o) for n in env.core.nodes.slots for o in step.orders(n)}
    assert len(placed) == 1000
    for job_id, (node, _) in placed.items():
        env.started(node, job_id)
    env.step()
    first = ids[0]
    node = placed[first][0]
    (old,) = env.submit(true())
    env.step()
    env.advance(0.1)
    (young,) = env.submit(true())
    env.step()
    assert {env.job(old).phase, env.job(young).phase} == {Phase.BEHIND}
    for job_id, (where, _) in placed.items():
        if job_id != first:
            env.exited(where, job_id)
    looked = 0
    book = env.core.nodes
    every = book.with_free_cores

    def counted() -> Any:
        nonlocal looked
        for item in every():
            looked += 1
            yield item

    book.with_free_cores = counted  # type: ignore[method-assign]
    step = env.step()
    assert step.out.withdraws == {node: [[old, 0]]}
    assert looked == 1, "one node with a free core was enough"
    assert env.job(young).phase is Phase.BEHIND


def _register(env: CoreEnv, name: str) -> Any:
    from pilot.model.node import NodeConfigured
    from pilot.wire.messages import Register

    node = NodeConfigured(name=name, hostname=name, processors=list(range(env.cores)), memory=1 << 30)
    return Register(node, (), (), 0)

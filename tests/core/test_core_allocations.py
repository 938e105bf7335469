"""Allocations as the core sees them: one that ends under its jobs, one whose walltime margin comes,
and queued work that can never start once no allocation is left."""

from __future__ import annotations

import pytest
from core_env import CoreEnv, true

from pilot.core.outbox import CancelAllocation, NodeLost
from pilot.lrm.base import AllocationState
from pilot.model.job_state import JobState

pytestmark = pytest.mark.timeout(10)


def test_allocation_ended_fails_running_and_queued_jobs_with_the_batch_systems_words() -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    running, queued = env.submit(true(), true())
    env.step()
    env.started("n0", running)
    env.step()
    held = env.allocations.held["a1"]
    held.allocation.state = AllocationState.FAILED
    held.allocation.message = "NODE_FAIL"
    env.core.on_allocation_ended(held)
    step = env.step()
    reason = "the allocation (local job 1) ended: NODE_FAIL"
    assert env.told(running)[1:2] == ["FAILED"] and env.told(running)[4] == reason
    assert env.state(queued) is JobState.FAILED and env.told(queued)[4] == reason
    assert step.out.effects == [NodeLost("a1", "n0")]
    assert env.core.book.unfinished() == 0
    (refusal,) = env.core.on_submit(b"c", [true().to_wire()], None)
    assert refusal["transient"] and refusal["error"] == (
        "this pilot's last allocation has ended (local job 1: NODE_FAIL); start a new pilot"
    )


def test_walltime_margin_stops_running_tasks_and_says_why() -> None:
    env = CoreEnv(cores=1, walltime=100.0, pilot={"walltime_margin": 10.0})
    env.register("n0")
    (jid,) = env.submit(true())
    env.step()
    env.started("n0", jid)
    env.advance(85.0)
    env.heartbeat("n0")
    env.core.on_tick()
    assert env.step().kills("n0") == {}
    env.advance(6.0)  # 91 s in: within the last 10 s
    env.heartbeat("n0")
    env.core.on_tick()
    assert env.step().kills("n0") == {"walltime": [[jid, 0]]}
    env.exited("n0", jid, code=-15, signal=15, reason="walltime")
    env.step()
    assert env.told(jid)[4] == (
        "walltime: the allocation ends in under 10 s (pilot.walltime_margin), so the process was stopped on "
        "node n0 before the batch system could kill it"
    )


def test_a_job_too_long_for_the_allocation_left_is_not_started() -> None:
    env = CoreEnv(cores=1, walltime=100.0)
    env.register("n0")
    (jid,) = env.submit(true(duration=500.0))
    step = env.step()
    assert step.orders("n0") == []
    assert env.state(jid) is JobState.FAILED
    assert env.told(jid)[4].startswith("not started: JobAttributes.duration of 500 s cannot finish")


def test_agents_that_never_register_give_the_allocation_up() -> None:
    env = CoreEnv(cores=1, pilot={"agent_start_timeout": 30.0})
    (jid,) = env.submit(true())
    env.step()
    env.advance(31.0)
    env.core.on_tick()
    step = env.step()
    held = env.allocations.held["a1"]
    assert held.over and "1 of 1 agents did not register within 30 s" in held.missing_agents
    assert step.out.effects == [CancelAllocation("a1")]
    assert env.state(jid) is JobState.FAILED

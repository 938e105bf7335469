"""Priorities order the queue (SSS <Priority>, PSI/J ``pilot.priority``: higher first, first come first
served within one), orders waiting behind busy cores at an agent yield to a higher priority, and a job
that has not fitted for ``pilot.reserve_after`` holds the queue so smaller jobs cannot starve it."""

from __future__ import annotations

from typing import Any

import pytest
from core_env import CLIENT, CoreEnv, Step, true

from pilot import views
from pilot.model.job_description import ResourceRequest
from pilot.scheduler.queue import JobQueue

pytestmark = pytest.mark.timeout(10)


def prio(p: int, **kw: Any) -> dict[str, Any]:
    return true(custom_attributes={"pilot.priority": p}, **kw).to_wire()


def submit(env: CoreEnv, *jobs: dict[str, Any]) -> list[str]:
    results = env.core.on_submit(CLIENT, list(jobs), None)
    assert all("id" in r for r in results), results
    return [r["id"] for r in results]


def started_order(env: CoreEnv, node: str = "n0", *, step: Step | None = None) -> list[str]:
    """Run one order at a time on a one-core node (no backlog) and return the order jobs started in
    (from ``step``'s orders, or a new step's)."""
    seen: list[str] = []
    step = step or env.step()
    while orders := step.orders(node):
        (order,) = orders
        seen.append(order["job_id"])
        env.started(node, order["job_id"])
        env.exited(node, order["job_id"])
        step = env.step()
    return seen


def test_the_queue_gives_heads_highest_priority_first_and_oldest_first_within_one() -> None:
    q: JobQueue[tuple[str, int, str]] = JobQueue(category=lambda j: j[2], alive=lambda j: True, priority=lambda j: j[1])
    for item in [("a", 0, "x"), ("b", 5, "x"), ("c", 0, "y"), ("d", 5, "y"), ("e", -1, "x")]:
        q.push(item)
    assert [head[0] for _, head in q.heads()] == ["b", "d", "a", "c", "e"]
    assert not JobQueue(category=lambda j: j, alive=lambda j: True).prioritized
    assert q.prioritized
    q.push_front(("f", 0, "y"))  # taken back from an agent: first in its own priority, not above others
    assert [head[0] for _, head in q.heads()] == ["b", "d", "f", "a", "e"]


def test_high_priority_jobs_start_before_every_low_one_still_queued() -> None:
    env = CoreEnv(cores=1, pilot={"backlog": 0})
    env.register("n0")
    low = submit(env, *[prio(0) for _ in range(10)])
    first = env.step()  # the first low job is placed before the high ones come
    high = submit(env, *[prio(10) for _ in range(3)])
    assert started_order(env, step=first) == [low[0], *high, *low[1:]]


def test_orders_behind_a_busy_core_yield_to_a_higher_priority() -> None:
    env = CoreEnv(cores=1, pilot={"backlog": 4})
    env.register("n0")
    # A queue deep enough that its share of the core is more than the backlog (see pilot.core.schedule._share).
    low = submit(env, *[prio(0) for _ in range(30)])
    step = env.step()
    assert [o["job_id"] for o in step.orders("n0")] == low[:5]  # one on the core, four behind it
    env.started("n0", low[0])
    (high,) = submit(env, prio(3))
    step = env.step()
    # No room behind the busy core for the high job: the low ones that waited there are asked back.
    assert not step.orders("n0")
    assert sorted(w[0] for w in step.out.withdraws["n0"]) == sorted(low[1:5])
    for job_id in low[1:5]:
        env.events("n0", [job_id, 0, "withdrawn", env.clock.wall, {}])
    step = env.step()
    # The high one first, then the low ones in their own order (each under its new placement's id).
    assert [o["job_id"].partition("~")[0] for o in step.orders("n0")] == [high, *low[1:4]]
    assert not step.out.withdraws
    submit(env, prio(5))
    step = env.step()  # no room behind: the ones that waited there and are below it are asked back
    assert sorted(w[0].partition("~")[0] for w in step.out.withdraws["n0"]) == sorted([high, *low[1:4]])


def test_an_invalid_priority_is_refused_naming_the_attribute() -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    for bad in ["high", 1.5, True, 10**12]:
        (result,) = env.core.on_submit(CLIENT, [prio(0) | {"custom_attributes": {"pilot.priority": bad}}], None)
        assert "custom_attributes['pilot.priority'] must be a whole number" in result["error"], result
    doc = "<Job><Executable>/bin/true</Executable><Priority>99999999999</Priority></Job>"
    (result,) = env.core.on_submit(CLIENT, [{"sss": doc}], None)
    assert "<Priority> must be from" in result["error"], result


def test_sss_priority_orders_the_queue_and_explain_says_so() -> None:
    env = CoreEnv(cores=1, pilot={"backlog": 0})
    env.register("n0")
    (first,) = submit(env, prio(0))
    env.step()
    (low,) = submit(env, prio(0))
    (result,) = env.core.on_submit(
        CLIENT, [{"sss": "<Job><Executable>/bin/true</Executable><Priority>7</Priority></Job>"}], None
    )
    (high,) = result["ids"]
    env.step()
    reasons = views.explain(env.core, low)["reasons"]
    assert "1 job(s) of higher priority are queued ahead of it (its priority: 0)" in reasons, reasons
    env.started("n0", first)
    env.exited("n0", first)
    assert started_order(env) == [high, low]


def test_a_large_job_that_waited_reserve_after_holds_the_queue_until_it_starts() -> None:
    """Without the reservation, a stream of one-core jobs keeps one core busy at all times and the
    two-core job never starts; after ``reserve_after`` nothing queued behind it starts until it has."""
    env = CoreEnv(cores=2, pilot={"backlog": 0, "reserve_after": 30.0})
    env.register("n0")
    (a, b) = env.submit(true(), true())
    env.step()
    env.started("n0", a)
    env.started("n0", b)
    (big,) = env.submit(true(resources=ResourceRequest(cpu_cores_per_process=2)))
    running = [a, b]
    for _ in range(10):  # a stream of small jobs: one ends every 5 s, and another waits
        submit(env, true().to_wire())
        env.advance(5.0)
        done = running.pop(0)
        env.exited("n0", done)
        step = env.step()
        orders = step.orders("n0")
        if any(o["job_id"] == big for o in orders):
            break
        for order in orders:
            env.started("n0", order["job_id"])
            running.append(order["job_id"])
    else:
        pytest.fail("the two-core job never started")
    assert env.clock.wall - env.job(big).submitted >= 30.0
    assert env.core.scheduler.reserved is None or env.core.scheduler.reserved.id != big


def test_explain_names_the_job_the_queue_holds_for() -> None:
    env = CoreEnv(cores=2, pilot={"backlog": 0, "reserve_after": 10.0})
    env.register("n0")
    (a,) = submit(env, true().to_wire())
    env.step()
    env.started("n0", a)
    (big,) = env.submit(true(resources=ResourceRequest(cpu_cores_per_process=2)))
    (small,) = submit(env, true().to_wire())
    step = env.step()
    assert [o["job_id"] for o in step.orders("n0")] == [small]  # it fits beside the running one: backfilled
    env.started("n0", small)
    (later,) = submit(env, true().to_wire())
    env.advance(11.0)
    env.exited("n0", small)
    step = env.step()
    assert not step.orders("n0")  # a core is free, but the queue holds for the two-core job
    assert env.core.scheduler.reserved is env.job(big)
    assert any("the queue holds for it" in r for r in views.explain(env.core, big)["reasons"])
    assert any(f"waits behind job {big}" in r for r in views.explain(env.core, later)["reasons"])

"""A staging job's phases in the core, in process: STAGE_IN before any process order, on every node of the
job; STAGE_OUT (on its first node) and CLEANUP (on every node) after the last one; failures, cancel, and
a daemon restarted during staging (from a real journal) that neither stages twice nor runs twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from core_env import CoreEnv, true

from pilot.core.phase import Phase
from pilot.model.job_description import ResourceRequest
from pilot.model.job_state import JobState
from pilot.model.process_order import CLEANUP, STAGE_IN, STAGE_OUT, staging_slot
from pilot.model.staging import ON_ERROR, Staging, Transfer
from pilot.store import Store

pytestmark = pytest.mark.timeout(10)

STAGED = Staging(
    stage_in=(Transfer("http://h/data", "in/data", "copy"),),
    stage_out=(Transfer("out.txt", "/r/ok.txt", "copy"), Transfer("err.txt", "/r/err.txt", "copy", ON_ERROR)),
    cleanup=("in",),
)


def roles(orders: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(o["role"], o["slot"]) for o in orders]


def test_the_phases_go_stage_in_ranks_stage_out_cleanup_and_each_state_is_told() -> None:
    env = CoreEnv()
    env.register("n0")
    (job,) = env.submit(true(staging=STAGED))
    step = env.step()
    assert roles(step.orders("n0")) == [("stage_in", STAGE_IN)]
    assert step.orders("n0")[0]["staging"] == [["http://h/data", "in/data", "copy", False]]
    assert env.job(job).phase is Phase.STAGE_IN and env.state(job) is JobState.STAGE_IN
    env.exited("n0", job, STAGE_IN, staging={"transfers": 1, "cache_hits": 0})
    step = env.step()
    assert roles(step.orders("n0")) == [("rank", 0)]
    env.started("n0", job)
    env.step()
    assert env.state(job) is JobState.ACTIVE
    env.exited("n0", job)
    step = env.step()
    # Completed: the ON_ERROR stage-out is not chosen.
    assert roles(step.orders("n0")) == [("stage_out", STAGE_OUT)]
    assert step.orders("n0")[0]["staging"] == [["out.txt", "/r/ok.txt", "copy", False]]
    assert env.state(job) is JobState.STAGE_OUT
    env.exited("n0", job, STAGE_OUT)
    step = env.step()
    assert roles(step.orders("n0")) == [("cleanup", CLEANUP)]
    assert env.state(job) is JobState.CLEANUP
    env.exited("n0", job, CLEANUP)
    env.step()
    assert env.state(job) is JobState.COMPLETED
    meta = env.told(job)[5]
    assert meta["stage_in_transfers"] == 1 and meta["stage_in_cache_hits"] == 0 and meta["processes"] == 1


def test_a_failed_stage_in_fails_the_job_with_its_message_and_starts_nothing() -> None:
    env = CoreEnv()
    env.register("n0")
    (job,) = env.submit(true(staging=STAGED))
    env.step()
    env.events("n0", [job, STAGE_IN, "failed", env.clock.wall, {"message": "stage-in of 'x' failed: HTTP 404"}])
    step = env.step()
    assert not step.orders("n0")
    told = env.told(job)
    assert JobState(told[1]) is JobState.FAILED and told[4] == "stage-in of 'x' failed: HTTP 404"
    assert env.core.nodes.slots["n0"].free_cores == [0, 1]


def test_a_job_canceled_while_staging_in_is_canceled_once_its_stage_in_is_stopped() -> None:
    env = CoreEnv()
    env.register("n0")
    (job,) = env.submit(true(staging=STAGED))
    env.step()
    env.core.on_cancel(job)
    step = env.step()
    assert step.kills("n0") == {"canceled": [[job, STAGE_IN]]}
    env.exited("n0", job, STAGE_IN)  # it had finished meanwhile: still nothing runs
    step = env.step()
    assert not step.orders("n0") and env.state(job) is JobState.CANCELED


@pytest.mark.parametrize("finished_while_down", [False, True])
def test_a_daemon_restarted_during_stage_in_neither_stages_again_nor_runs_twice(
    tmp_path: Path, finished_while_down: bool
) -> None:
    path = tmp_path / "journal.db"
    env = CoreEnv(store=Store.open(path))
    env.register("n0")
    (job,) = env.submit(true(staging=STAGED))
    env.step()
    again = env.restarted(path)
    assert again.job(job).phase is Phase.STAGE_IN and again.job(job).state is JobState.STAGE_IN
    assert again.core.nodes.slots["n0"].free_cores == [1]  # its slot is held again
    if finished_while_down:  # the agent comes back with the stage-in's end among its unsent events
        step = again.register("n0", events=[[job, STAGE_IN, "exited", again.clock.wall, {"exit_code": 0}]])
    else:  # the agent comes back still fetching: nothing is sent again
        step = again.register("n0", running=[[job, STAGE_IN]])
        assert not step.orders("n0")
        again.exited("n0", job, STAGE_IN)
        step = again.step()
    assert roles(step.orders("n0")) == [("rank", 0)], "the ranks' order goes out exactly once"


def test_a_daemon_restarted_during_stage_out_goes_on_to_the_cleanup_and_the_outcome(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    env = CoreEnv(store=Store.open(path))
    env.register("n0")
    (job,) = env.submit(true(staging=STAGED))
    env.step()
    env.exited("n0", job, STAGE_IN)
    env.step()
    env.exited("n0", job, code=3)  # failed: the ON_ERROR stage-out is chosen too
    step = env.step()
    # A process that failed, whatever it managed: its outcome chooses the stage-outs.
    assert step.orders("n0")[0]["staging"] == [
        ["out.txt", "/r/ok.txt", "copy", False],
        ["err.txt", "/r/err.txt", "copy", False],
    ]
    again = env.restarted(path)
    assert again.job(job).phase is Phase.STAGE_OUT and again.job(job).state is JobState.STAGE_OUT
    step = again.register("n0", events=[[job, STAGE_OUT, "exited", again.clock.wall, {"exit_code": 0}]])
    assert roles(step.orders("n0")) == [("cleanup", CLEANUP)], "the cleanup goes out once; nothing is staged again"
    again.exited("n0", job, CLEANUP)
    again.step()
    told = again.told(job)
    assert JobState(told[1]) is JobState.FAILED and told[3] == 3, told


TWO_BY_TWO = ResourceRequest(process_count=4, node_count=2, processes_per_node=2)


def three_nodes() -> CoreEnv:
    env = CoreEnv(nodes=3)
    for n in ("n0", "n1", "n2"):
        env.register(n)
    return env


def placed_on(step: Any, role: str) -> dict[str, list[tuple[str, int]]]:
    """Per node, the orders of ``role`` it was sent."""
    return {
        n: [(o["role"], o["slot"]) for o in orders if o["role"] == role]
        for n, orders in step.out.orders.items()
        if any(o["role"] == role for o in orders)
    }


def test_a_job_on_two_nodes_stages_in_on_both_before_any_rank_and_cleans_up_on_both() -> None:
    env = three_nodes()
    (job,) = env.submit(true(launcher="multiple", resources=TWO_BY_TWO, staging=STAGED))
    step = env.step()
    staged = placed_on(step, "stage_in")
    assert len(staged) == 2 and not placed_on(step, "rank"), step.out.orders
    (first, second) = sorted(staged, key=lambda n: staged[n][0][1], reverse=True)
    assert staged == {first: [("stage_in", STAGE_IN)], second: [("stage_in", staging_slot(STAGE_IN, 1))]}
    assert all(o["staging"] == [["http://h/data", "in/data", "copy", False]] for o in step.out.orders[second])
    env.exited(first, job, STAGE_IN, staging={"transfers": 1, "cache_hits": 0})
    step = env.step()
    assert not placed_on(step, "rank"), "a rank started before every node had its files"
    env.exited(second, job, staging_slot(STAGE_IN, 1), staging={"transfers": 0, "cache_hits": 1})
    step = env.step()
    ranks = placed_on(step, "rank")
    assert sorted(ranks) == sorted([first, second]) and all(len(r) == 2 for r in ranks.values()), ranks
    for node, orders in ranks.items():
        for _, slot in orders:
            env.started(node, job, slot)
    for node, orders in ranks.items():
        for _, slot in orders:
            env.exited(node, job, slot)
    step = env.step()
    # Stage-out once, from the first node (one target path, one copy).
    assert placed_on(step, "stage_out") == {first: [("stage_out", STAGE_OUT)]}
    env.exited(first, job, STAGE_OUT)
    step = env.step()
    assert placed_on(step, "cleanup") == {
        first: [("cleanup", CLEANUP)],
        second: [("cleanup", staging_slot(CLEANUP, 1))],
    }
    env.exited(second, job, staging_slot(CLEANUP, 1))
    step = env.step()
    assert env.state(job) is JobState.CLEANUP, "the job ended before every node had cleaned up"
    env.exited(first, job, CLEANUP)
    env.step()
    assert env.state(job) is JobState.COMPLETED
    meta = env.told(job)[5]
    assert meta["stage_in_transfers"] == 1 and meta["stage_in_cache_hits"] == 1, meta


def test_a_stage_in_failing_on_one_node_stops_the_others_and_fails_the_job_naming_that_node() -> None:
    env = three_nodes()
    (job,) = env.submit(true(launcher="multiple", resources=TWO_BY_TWO, staging=STAGED))
    step = env.step()
    staged = placed_on(step, "stage_in")
    (first, second) = sorted(staged, key=lambda n: staged[n][0][1], reverse=True)
    message = f"stage-in of 'http://h/data' to 'in/data' on node {second} failed: HTTP 404"
    env.events(second, [job, staging_slot(STAGE_IN, 1), "failed", env.clock.wall, {"message": message}])
    step = env.step()
    assert step.kills(first) == {f"another process of job {job} failed": [[job, STAGE_IN]]}
    env.exited(first, job, STAGE_IN, reason=f"another process of job {job} failed", spawned=False)
    step = env.step()
    assert not placed_on(step, "rank")
    told = env.told(job)
    assert JobState(told[1]) is JobState.FAILED and told[4] == message, told
    assert all(env.core.nodes.slots[n].free_cores == [0, 1] for n in ("n0", "n1", "n2"))


def test_a_move_into_a_job_on_two_nodes_is_copied_to_the_others_first_then_moved_to_the_first() -> None:
    env = three_nodes()
    moved = Staging(stage_in=(Transfer("/src/a", "a", "move"), Transfer("/src/b", "b", "link")))
    (job,) = env.submit(true(launcher="multiple", resources=TWO_BY_TWO, staging=moved))
    step = env.step()
    staged = placed_on(step, "stage_in")
    ((second, slots),) = staged.items()
    assert slots == [("stage_in", staging_slot(STAGE_IN, 1))]
    assert step.out.orders[second][0]["staging"] == [["/src/a", "a", "copy", False], ["/src/b", "b", "link", False]]
    env.exited(second, job, staging_slot(STAGE_IN, 1))
    step = env.step()
    ((first, slots),) = placed_on(step, "stage_in").items()
    assert first != second and slots == [("stage_in", STAGE_IN)] and not placed_on(step, "rank")
    assert step.out.orders[first][0]["staging"] == [["/src/a", "a", "move", False], ["/src/b", "b", "link", False]]
    env.exited(first, job, STAGE_IN)
    step = env.step()
    assert sorted(placed_on(step, "rank")) == sorted([first, second])


def test_a_daemon_restarted_between_the_two_rounds_of_a_move_sends_the_second_once(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    env = CoreEnv(nodes=3, store=Store.open(path))
    for n in ("n0", "n1", "n2"):
        env.register(n)
    moved = Staging(stage_in=(Transfer("/src/a", "a", "move"),))
    (job,) = env.submit(true(launcher="multiple", resources=TWO_BY_TWO, staging=moved))
    ((second, _),) = placed_on(env.step(), "stage_in").items()
    env.exited(second, job, staging_slot(STAGE_IN, 1))
    ((first, _),) = placed_on(env.step(), "stage_in").items()
    again = env.restarted(path)
    for n in ("n0", "n1", "n2"):
        step = again.register(n, running=[[job, STAGE_IN]] if n == first else None)
        assert not step.out.orders.get(n), f"{n} was sent {step.out.orders.get(n)} again"
    again.exited(first, job, STAGE_IN)
    step = again.step()
    assert sorted(placed_on(step, "rank")) == sorted([first, second])

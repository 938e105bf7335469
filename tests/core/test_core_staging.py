"""A staging job's phases in the core, in process: STAGE_IN before any process order, STAGE_OUT and CLEANUP
after the last one, each an order to the job's first node; failures, cancel, and a daemon restarted
during staging (from a real journal) that neither stages twice nor runs twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from core_env import CoreEnv, true

from pilot.core.phase import Phase
from pilot.model.job_state import JobState
from pilot.model.process_order import CLEANUP, STAGE_IN, STAGE_OUT
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

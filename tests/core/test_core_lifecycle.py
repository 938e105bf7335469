"""The core driven in process: a job's life from submit to its final status, cancel in every phase,
restartable jobs after a lost node, withdrawal from behind a busy core, walltime, dependencies."""

from __future__ import annotations

import pytest
from core_env import CLIENT, CoreEnv, true

from pilot.core.phase import MOVES, IllegalMove, Phase
from pilot.model.job_description import ResourceRequest
from pilot.model.job_state import JobState

pytestmark = pytest.mark.timeout(10)


def test_submit_place_run_complete() -> None:
    env = CoreEnv(cores=2)
    env.register("n0")
    (jid,) = env.submit(true())
    step = env.step()
    (order,) = step.orders("n0")
    assert order["job_id"] == jid and order["cores"] == [0] and not order.get("after_cores", False)
    assert env.job(jid).phase is Phase.RANKS
    env.started("n0", jid)
    env.advance(0.5)
    env.exited("n0", jid, code=0, user_cpu_time=0.25, max_rss=1000)
    step = env.step()
    status = env.told(jid)
    assert status[1] == "COMPLETED" and status[3] == 0
    assert status[5]["wall_duration"] == pytest.approx(0.5) and status[5]["user_cpu_time"] == 0.25
    assert jid not in env.core.book.jobs  # left memory once its final status went out
    assert env.core.book.counts[JobState.COMPLETED] == 1 and env.core.book.unfinished() == 0
    assert env.core.nodes.slots["n0"].free_cores == [0, 1]


def test_a_failing_rank_kills_the_others_and_names_the_cause() -> None:
    env = CoreEnv(cores=2)
    env.register("n0")
    (jid,) = env.submit(true(launcher="multiple", resources=ResourceRequest(process_count=2)))
    step = env.step()
    assert [o["slot"] for o in step.orders("n0")] == [0, 1]
    env.started("n0", jid, 0)
    env.started("n0", jid, 1)
    env.exited("n0", jid, 1, code=3)
    step = env.step()
    assert step.kills("n0") == {f"another process of job {jid} failed": [[jid, 0]]}
    env.exited("n0", jid, 0, code=-15, signal=15, reason="killed")
    env.step()
    state, code, message = env.told(jid)[1], env.told(jid)[3], env.told(jid)[4]
    assert (state, code) == ("FAILED", 3) and message == "rank 1 exited with code 3 on node n0"


@pytest.mark.parametrize("phase", ["blocked", "queued", "running"])
def test_cancel_in_each_phase(phase: str) -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    (first,) = env.submit(true())
    env.step()
    if phase == "blocked":
        (jid,) = env.submit(true(custom_attributes={"depends_on": first}))
    else:
        (jid,) = env.submit(true())
    env.step()
    if phase == "running":
        env.started("n0", first)
        env.exited("n0", first)
        env.step()
        env.started("n0", jid)  # it waited at the agent behind the busy core, which started it itself
    expected = {"blocked": Phase.BLOCKED, "queued": Phase.QUEUED, "running": Phase.RANKS}[phase]
    if phase == "queued":
        expected = Phase.BEHIND  # behind the busy core (pilot.backlog): placed, not started
    assert env.job(jid).phase is expected
    assert env.core.on_cancel(jid) == {"id": jid}
    step = env.step()
    if phase == "running":
        assert step.kills("n0") == {"canceled": [[jid, 0]]}
        env.exited("n0", jid, code=-15, signal=15, reason="canceled")
        env.step()
    elif phase == "queued":
        assert step.kills("n0") == {"canceled": [[jid, 0]]}  # the agent holds it unstarted: it drops it
        env.exited("n0", jid, code=None, spawned=False, reason="canceled")
        env.step()
    assert env.state(jid) is JobState.CANCELED
    assert env.core.book.unfinished() == (0 if phase == "running" else 1)


def test_cancel_while_being_withdrawn_ends_canceled_without_running() -> None:
    env = CoreEnv(cores=2)
    env.register("n0")
    long, short, behind = env.submit(true(), true(), true())
    step = env.step()
    assert [(o["job_id"], o["cores"], o.get("after_cores", False)) for o in step.orders("n0")] == [
        (long, [0], False),
        (short, [1], False),
        (behind, [0], True),
    ]
    for j in (long, short):
        env.started("n0", j)
    env.exited("n0", short)  # core 1 is free; the third still waits behind core 0's long task
    env.advance(0.01)
    step = env.step()
    assert not step.out.withdraws and env.job(behind).phase is Phase.BEHIND
    env.advance(0.06)  # past RECLAIM_AFTER
    step = env.step()
    assert step.out.withdraws == {"n0": [[behind, 0]]}
    assert env.job(behind).phase is Phase.WITHDRAWING
    env.core.on_cancel(behind)
    env.events("n0", [behind, 0, "withdrawn", env.clock.wall, {}])
    env.step()
    assert env.state(behind) is JobState.CANCELED and env.told(behind)[4] == "canceled"


def _withdrawing(env: CoreEnv) -> str:
    """Two cores: a long task on core 0, a short one on core 1 that ends, and a third job that waited
    behind core 0 past RECLAIM_AFTER while core 1 is free: it is being asked back. Returns its id."""
    env.register("n0")
    long, short, behind = env.submit(true(), true(), true())
    env.step()
    env.started("n0", long)
    env.started("n0", short)
    env.exited("n0", short)
    env.advance(0.1)
    step = env.step()
    assert step.out.withdraws == {"n0": [[behind, 0]]} and env.job(behind).phase is Phase.WITHDRAWING
    return behind


def test_withdrawn_order_is_placed_again_on_the_free_core() -> None:
    env = CoreEnv(cores=2)
    behind = _withdrawing(env)
    env.events("n0", [behind, 0, "withdrawn", env.clock.wall, {}])
    step = env.step()
    (order,) = step.orders("n0")
    # Placed again: its order has its own process job id, so nothing said of the first one can touch it.
    assert (order["job_id"], order["cores"], order.get("after_cores", False)) == (f"{behind}~1", [1], False)
    assert order["rank_environment"]["PILOT_JOB_ID"] == behind
    assert env.job(behind).phase is Phase.RANKS and env.job(behind).state is JobState.QUEUED


def test_a_late_start_of_a_withdrawing_order_runs_it_where_it_is() -> None:
    env = CoreEnv(cores=2)
    behind = _withdrawing(env)
    env.started("n0", behind)  # the agent started it before the WITHDRAW reached it
    env.step()
    assert env.job(behind).phase is Phase.RANKS and not env.core.book.behind
    env.exited("n0", behind)
    env.step()
    assert env.state(behind) is JobState.COMPLETED


def test_restartable_job_runs_again_after_its_node_is_lost() -> None:
    env = CoreEnv(nodes=2, cores=1)
    env.register("n0")
    env.register("n1")
    (jid,) = env.submit(true(custom_attributes={"pilot.restartable": True}))
    step = env.step()
    (node,) = [n for n in ("n0", "n1") if step.orders(n)]
    env.started(node, jid)
    env.step()
    env.advance(6.0)  # past agent_timeout for the silent node; the other one heartbeats
    other = "n1" if node == "n0" else "n0"
    env.heartbeat(other)
    env.core.on_tick()
    step = env.step()
    (order,) = step.orders(other)
    assert order["job_id"] == f"{jid}~1" and order["rank_environment"]["PILOT_JOB_ID"] == jid
    job = env.job(jid)
    assert job.run.number == 1 and job.state is JobState.ACTIVE and job.run.started is None
    env.exited(node, jid)  # a late event of the lost attempt: ignored
    env.started(other, f"{jid}~1")
    env.exited(other, f"{jid}~1")
    env.step()
    assert env.state(jid) is JobState.COMPLETED


def test_job_on_a_lost_node_fails_with_the_reason() -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    (jid,) = env.submit(true())
    env.step()
    env.started("n0", jid)
    env.advance(5.5)
    env.core.on_tick()
    step = env.step()
    assert env.state(jid) is JobState.FAILED
    assert env.told(jid)[4] == "node n0 lost: its agent sent no heartbeat for 5.5 s"
    assert [type(e).__name__ for e in step.out.effects] == ["NodeLost"]


def test_walltime_message_names_the_duration() -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    (jid,) = env.submit(true(duration=2.0))
    step = env.step()
    assert step.orders("n0")[0]["walltime"] == 2.0
    env.started("n0", jid)
    env.exited("n0", jid, code=-15, signal=15, reason="walltime")
    env.step()
    assert env.told(jid)[4] == (
        "walltime exceeded: the process ran past JobAttributes.duration of 2 s on node n0 and was killed"
    )


def test_pre_and_post_launch_run_around_the_ranks() -> None:
    env = CoreEnv(cores=2)
    env.register("n0")
    (jid,) = env.submit(true(pre_launch="/tmp/pre.sh", post_launch="/tmp/post.sh"))
    step = env.step()
    (pre,) = step.orders("n0")
    assert pre["role"] == "pre" and env.job(jid).phase is Phase.PRE_LAUNCH
    env.started("n0", jid, pre["slot"])
    env.exited("n0", jid, pre["slot"], environment={"A": "1"}, unset=["B"])
    step = env.step()
    (rank,) = step.orders("n0")
    assert rank["role"] == "rank" and rank["pre_environment"] == {"A": "1"} and rank["pre_unset"] == ["B"]
    env.exited("n0", jid, 0)
    step = env.step()
    (post,) = step.orders("n0")
    assert post["role"] == "post" and env.job(jid).phase is Phase.POST_LAUNCH
    env.exited("n0", jid, post["slot"])
    env.step()
    assert env.state(jid) is JobState.COMPLETED


def test_dependency_cascade_fails_dependents_that_can_never_start() -> None:
    env = CoreEnv(cores=2)
    env.register("n0")
    (a,) = env.submit(true())
    (b,) = env.submit(true(custom_attributes={"depends_on": a}))
    (c,) = env.submit(true(custom_attributes={"depends_on": b}))
    (d,) = env.submit(true(custom_attributes={"depends_on": f"OnFailure:{a}"}))
    step = env.step()
    assert [o["job_id"] for o in step.orders("n0")] == [a]
    assert {env.job(j).phase for j in (b, c, d)} == {Phase.BLOCKED}
    env.exited("n0", a, code=1)
    step = env.step()
    assert env.state(b) is JobState.FAILED and env.state(c) is JobState.FAILED
    assert env.told(b)[4].startswith("not started:") and env.told(c)[4].startswith("not started:")
    assert [o["job_id"] for o in step.orders("n0")] == [d]


def test_an_sss_hold_waits_for_its_release() -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    (result,) = env.core.on_submit(
        CLIENT, [{"sss": "<Job><Executable>/bin/true</Executable><Hold>User</Hold></Job>"}], None
    )
    (held,) = result["ids"]
    (plain,) = env.submit(true())
    step = env.step()
    assert [o["job_id"] for o in step.orders("n0")] == [plain]  # the held job is skipped, not in the way
    assert env.job(held).phase is Phase.BLOCKED
    assert env.core.on_release(plain) == {"id": plain, "released": False}
    assert env.core.on_release(held) == {"id": held, "released": True}
    env.exited("n0", plain)
    step = env.step()
    assert [o["job_id"] for o in step.orders("n0")] == [held]
    env.exited("n0", held)
    env.step()
    assert env.state(held) is JobState.COMPLETED
    assert env.core.on_release(held) == {"error": f"job {held!r} is not waiting in this pilot"}


def test_statuses_go_to_every_subscriber() -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    (jid,) = env.submit(true())
    other = b"client-2"
    assert env.core.on_attach(other, jid)["status"][1] == "QUEUED"
    env.step()
    env.started("n0", jid)
    env.step()
    assert env.state(jid, CLIENT) is JobState.ACTIVE and env.state(jid, other) is JobState.ACTIVE


def test_an_illegal_move_is_caught() -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    (jid,) = env.submit(true())
    job = env.job(jid)
    with pytest.raises(IllegalMove, match="QUEUED -> POST_LAUNCH"):
        env.core.book.move(job, Phase.POST_LAUNCH)
    assert job.phase is Phase.QUEUED
    assert (Phase.DONE, Phase.QUEUED) not in MOVES and all(old is not Phase.DONE for old, _ in MOVES)


def test_a_job_that_never_fits_is_refused_at_submit() -> None:
    env = CoreEnv(cores=2)
    env.register("n0")
    (result,) = env.core.on_submit(CLIENT, [true(resources=ResourceRequest(process_count=3)).to_wire()], None)
    assert "never run" in result["error"] and "3" in result["error"]
    assert env.core.book.unfinished() == 0

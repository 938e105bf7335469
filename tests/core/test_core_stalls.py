"""A paused daemon blames no one (issue 19): the shell reports its own pauses (``Core.on_paused``) and the
core never counts silence inside them against an agent; a submit id its client gave up on is refused,
and a job already made under it is canceled (``Core.on_abandon``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from core_env import CLIENT, CoreEnv, true

from pilot.core.admission import ABANDONED
from pilot.core.clock import Clock
from pilot.model.job_state import JobState
from pilot.store import Store

pytestmark = pytest.mark.timeout(10)


def pause(env: CoreEnv, seconds: float) -> None:
    """The daemon does not run for ``seconds``: time passes, and the shell says so before its next tick."""
    since = env.clock.mono
    env.advance(seconds)
    env.core.on_paused(since=since, until=env.clock.mono)


def test_awake_time_leaves_out_the_pauses() -> None:
    clock = Clock(mono=100.0)
    clock.paused(110.0, 120.0)
    clock.paused(119.0, 125.0)  # overlapping the last one: merged
    clock.paused(130.0, 130.0)  # empty: nothing
    clock.set(wall=0.0, mono=140.0)
    assert list(clock.pauses) == [(110.0, 125.0)]
    assert clock.awake(100.0) == 25.0
    assert clock.awake(115.0) == 15.0  # from inside the pause: its rest is left out
    assert clock.awake(126.0) == 14.0


def test_an_agent_silent_only_while_the_daemon_was_paused_is_not_lost_nor_its_jobs() -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    (jid,) = env.submit(true())
    env.step()
    env.started("n0", jid)
    env.step()
    env.advance(1.0)
    pause(env, 30.0)  # six agent_timeouts, all inside the daemon's own pause
    env.advance(1.0)
    env.core.on_tick()
    env.step()
    assert env.core.nodes.agents["n0"].state == "active"
    assert env.job(jid).state is JobState.ACTIVE
    env.heartbeat("n0")  # what waited in the socket while the daemon was stopped
    env.exited("n0", jid)
    env.step()
    assert env.state(jid) is JobState.COMPLETED


def test_silence_while_the_daemon_ran_still_counts_around_a_pause() -> None:
    env = CoreEnv(cores=1)
    env.register("n0")
    (jid,) = env.submit(true())
    env.step()
    env.started("n0", jid)
    env.step()
    env.advance(3.0)
    pause(env, 20.0)
    env.advance(1.5)
    env.core.on_tick()
    assert env.core.nodes.agents["n0"].state == "active"  # 4.5 s awake: within agent_timeout
    env.advance(1.0)
    env.core.on_tick()
    env.step()
    assert env.core.nodes.agents["n0"].state == "lost"  # 5.5 s of silence the daemon was there to hear
    status = env.told(jid)
    assert status[1] == JobState.FAILED.value and "no heartbeat for 5.5 s" in status[4], status


def test_silence_the_daemon_has_not_read_yet_is_not_the_agents_but_is_only_forgiven_so_long() -> None:
    # A busy daemon (its loop ran, so no pause) that is behind in reading the agents' frames: what it has
    # not read may hold the heartbeats (the shell says up to when it has read them all: heard_until).
    env = CoreEnv(nodes=2, cores=1)
    env.register("n0")
    env.register("n1")
    (jid,) = env.submit(true())
    env.step()
    env.started("n0", jid)
    env.step()
    env.core.agents.heard_until = env.clock.mono  # every frame read up to now
    env.advance(8.0)  # n0 then n1 silent 8 s, none of it read: 3 s more than agent_timeout
    env.core.on_tick()
    env.step()
    assert [env.core.nodes.agents[n].state for n in ("n0", "n1")] == ["active", "active"]
    env.heartbeat("n0")  # the frames that waited are read: n0 had spoken, n1 had not
    env.core.agents.heard_until = env.clock.mono
    env.advance(2.0)  # (n1 is looked at again when the rest of its silence may be over)
    env.core.on_tick()
    env.step()
    assert [env.core.nodes.agents[n].state for n in ("n0", "n1")] == ["active", "lost"]
    assert env.job(jid).state is JobState.ACTIVE
    # Still behind from here on, and n0 dead: forgiven one agent_timeout of unread time, no more.
    env.advance(7.0)
    env.core.on_tick()
    assert env.core.nodes.agents["n0"].state == "active"  # 9 s silent, 5 of them unread: 4 s
    env.advance(1.5)
    env.core.on_tick()
    env.step()
    assert env.core.nodes.agents["n0"].state == "lost"
    assert env.state(jid) is JobState.FAILED and "no heartbeat for 5.5 s" in env.told(jid)[4]


def test_agents_that_have_not_come_are_not_reported_missing_for_the_daemon_pause() -> None:
    env = CoreEnv(nodes=2, pilot={"agent_start_timeout": 10.0})
    env.register("n0")
    env.advance(8.0)
    pause(env, 30.0)
    env.core.on_tick()
    assert not env.allocations.held["a1"].missing_agents
    env.advance(3.0)
    env.core.on_tick()
    assert "1 of 2 agents did not register within 10 s" in env.allocations.held["a1"].missing_agents


def test_a_submit_id_given_up_is_refused_and_the_job_it_made_is_canceled() -> None:
    env = CoreEnv(cores=1, pilot={"backlog": 0})  # the second job stays queued
    env.register("n0")
    core = env.core
    wire_jobs = [true().to_wire(), true().to_wire()]
    made, queued = core.on_submit(CLIENT, wire_jobs, ["k-1", "k-2"])
    running = made["id"]
    env.step()
    env.started("n0", running)
    env.step()
    # k-1 made a running job, k-2 a queued one; k-3's submit has not arrived yet.
    results = core.on_abandon(["k-1", "k-2", "k-3"])
    assert results == [
        {"submit_id": "k-1", "ids": [running]},
        {"submit_id": "k-2", "ids": [queued["id"]]},
        {"submit_id": "k-3"},
    ]
    step = env.step()
    assert step.kills("n0") == {"canceled": [[running, 0]]}
    assert env.state(queued["id"]) is JobState.CANCELED and env.told(queued["id"])[4] == ABANDONED
    env.exited("n0", running, code=-15)
    env.step()
    assert env.state(running) is JobState.CANCELED and env.told(running)[4] == ABANDONED
    # The submits still on their way (or sent again) are refused; others are taken as usual.
    late = core.on_submit(CLIENT, [true().to_wire()] * 3, ["k-3", "k-1", "k-4"])
    assert late[0] == {"error": ABANDONED} and late[1] == {"error": ABANDONED} and "id" in late[2]


def test_a_submit_id_given_up_finds_its_job_in_the_journal(tmp_path: Path) -> None:
    env = CoreEnv(cores=1, store=Store.open(tmp_path / "journal.db"))
    env.register("n0")
    (made,) = env.core.on_submit(CLIENT, [true().to_wire()], ["k-2"])  # k-1 never came
    step = env.step()  # committed: the submit id is in the journal only now
    assert not env.core.book.fresh_by_submit_id and step.orders("n0")
    assert env.core.on_abandon(["k-1", "k-2"]) == [{"submit_id": "k-1"}, {"submit_id": "k-2", "ids": [made["id"]]}]
    step = env.step()
    assert step.kills("n0") == {"canceled": [[made["id"], 0]]}  # on its way to the agent: killed there
    env.started("n0", made["id"])
    env.exited("n0", made["id"], code=-15)
    env.step()
    assert env.state(made["id"]) is JobState.CANCELED

"""Exactly once across a daemon restart (issue 19, item 1), driven deterministically in process: the daemon
killed between the steps of a withdrawal from behind a busy core, then resumed from its journal while its
agent re-registers with what it holds and its unacknowledged events.

Each test shows one way the promise broke before each placement had its own process job id, the journal
told behind, withdrawing and started apart, and an agent sent again the batches it made while registering.

* ``AgentModel`` plays the agent's side of the protocol as ``agent/`` does it, step by step: an order placed
  ``after_cores`` waits while its cores are busy and starts when they are free (``ProcessEngine.submit``); a
  WITHDRAW takes back only a waiting order and reports it ``withdrawn`` (``withdraw``); a KILL drops a
  waiting order (``exited``, ``spawned: False``) or signals a running one (``kill``); orders are keyed by
  ``(job id, slot)`` only and a second order of the same key is run too; events are numbered per batch,
  kept until acknowledged, and all go again with a REGISTER together with what runs and waits
  (``Agent._forward``, ``Agent._tick``, ``ProcessEngine.snapshot``). It counts how often each job started.
* The test of events lost around a re-registration drives the real ``agent.agent.Agent`` (null launches,
  no socket I/O: its frames are handed to the core and back by hand).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from core_env import CoreEnv, Step, true

from agent.agent import Agent
from pilot.core.phase import Phase
from pilot.model.job_state import JobState
from pilot.model.node import NodeConfigured
from pilot.model.process_order import ProcessOrder
from pilot.store import Store
from pilot.wire.messages import (
    TO_DAEMON_FROM_AGENT,
    Heartbeat,
    HeartbeatReply,
    Kill,
    Launch,
    Register,
    Registered,
    TaskEvent,
    TaskEvents,
    Withdraw,
    decode,
)

pytestmark = pytest.mark.timeout(10)


def _node(name: str, cores: int) -> NodeConfigured:
    return NodeConfigured(name=name, hostname=name, processors=list(range(cores)), memory=1 << 30)


class AgentModel:
    """One node's agent as the daemon sees it through the wire (see the module's docstring)."""

    def __init__(self, env: CoreEnv, name: str = "n0") -> None:
        self.env = env
        self.name = name
        self.cores = env.cores
        self.running: list[dict[str, Any]] = []
        self.waiting: list[dict[str, Any]] = []
        self.pending: list[list[Any]] = []  # events not forwarded yet
        self.unacked: list[tuple[int, list[list[Any]]]] = []
        self.seq = 0
        self.registered = False
        self.starts: Counter[str] = Counter()  # job id -> processes started for it

    # -- what the daemon tells it ------------------------------------------------------------------

    def receive(self, step: Step) -> None:
        """Carry out one flush, in the order the daemon sends it (daemon.py ``_flush``)."""
        for node, msg in step.out.to_agents:
            if node != self.name:
                continue
            if isinstance(msg, Registered):
                self.registered = True
                self._ack(msg.acked)
            elif isinstance(msg, HeartbeatReply):
                if msg.known:
                    self._ack(msg.acked)
                else:
                    self.registered = False
        for reason, refs in step.kills(self.name).items():
            for k in refs:
                self._kill((k[0], k[1]), reason)
        for k in step.out.withdraws.get(self.name, []):
            if self._take(self.waiting, (k[0], k[1])) is not None:
                self._event(k[0], k[1], "withdrawn", {})
        for order in step.orders(self.name):
            if order.get("after_cores") and self._busy(order["cores"]):
                self.waiting.append(order)
            else:
                self._start(order)

    # -- what happens on the node ------------------------------------------------------------------

    def exit(self, job_id: str, slot: int = 0) -> None:
        order = self._take(self.running, (job_id, slot))
        assert order is not None, f"{job_id} is not running"
        self._event(job_id, slot, "exited", {"exit_code": 0})
        self._start_waiting()

    def exit_all(self) -> None:
        """Let everything run to its end, one wave at a time, each wave reported to the daemon."""
        for _ in range(10):
            if not self.running:
                return
            for order in list(self.running):
                self.exit(order["job_id"], order["slot"])
            self.send()
            self.receive(self.env.step())
        raise AssertionError("the agent never ran out of work")

    # -- what it tells the daemon ------------------------------------------------------------------

    def send(self) -> None:
        """Forward the pending events (TaskEvents, only while registered: else they wait for a REGISTER)."""
        if not self.pending:
            return
        events, self.pending = self.pending, []
        self.seq += 1
        self.unacked.append((self.seq, events))
        if self.registered:
            self.env.core.on_agent(self.name, TaskEvents(tuple(TaskEvent.from_wire(e) for e in events), self.seq))

    def heartbeat(self) -> None:
        self.env.core.on_agent(self.name, Heartbeat())

    def register_message(self) -> Register:
        """A REGISTER: what runs and waits here, and every unacknowledged event."""
        self.send()
        refs = tuple((o["job_id"], o["slot"]) for o in self.running + self.waiting)
        events = tuple(TaskEvent.from_wire(e) for _, chunk in self.unacked for e in chunk)
        return Register(_node(self.name, self.cores), refs, events, self.seq)

    def register(self) -> None:
        self.env.core.on_agent(self.name, self.register_message())
        self.receive(self.env.step())

    def reregister(self) -> list[Register]:
        """The new daemon answers a heartbeat with 'unknown'; the agent sends REGISTER (and again every
        0.5 s until REGISTERED comes: two of them, taken together before either is answered)."""
        self.heartbeat()
        self.receive(self.env.step())
        assert not self.registered
        return [self.register_message(), self.register_message()]

    # -- inside --------------------------------------------------------------------------------------

    def _event(self, job_id: str, slot: int, kind: str, data: dict[str, Any]) -> None:
        self.pending.append([job_id, slot, kind, self.env.clock.wall, data])

    def _busy(self, cores: list[int]) -> bool:
        return any(c in o["cores"] for o in self.running for c in cores)

    def _start(self, order: dict[str, Any]) -> None:
        self.running.append(order)
        self.starts[order["job_id"].partition("~")[0]] += 1  # per job, whichever placement
        self._event(order["job_id"], order["slot"], "started", {})

    def _start_waiting(self) -> None:
        waiting, self.waiting = self.waiting, []
        for order in waiting:
            if self._busy(order["cores"]):
                self.waiting.append(order)
            else:
                self._start(order)

    @staticmethod
    def _take(orders: list[dict[str, Any]], key: tuple[str, int]) -> dict[str, Any] | None:
        for i, order in enumerate(orders):
            if (order["job_id"], order["slot"]) == key:
                return orders.pop(i)
        return None

    def _kill(self, key: tuple[str, int], reason: str) -> None:
        if self._take(self.running, key) is not None:
            self._event(key[0], key[1], "exited", {"exit_code": None, "signal": 15, "reason": reason})
            self._start_waiting()
        elif self._take(self.waiting, key) is not None:
            self._event(key[0], key[1], "exited", {"reason": reason, "spawned": False})

    def _ack(self, acked: int) -> None:
        self.unacked = [u for u in self.unacked if u[0] > acked]


def _withdrawal_meets_a_new_job(env: CoreEnv, agent: AgentModel) -> tuple[str, str, str]:
    """Two cores. ``long`` runs on core 0, a short job on core 1 ends, and ``behind`` (placed behind core 0)
    has waited past RECLAIM_AFTER with core 1 free: the daemon sends WITHDRAW. Before the agent's
    ``withdrawn`` comes back, a new job ``late`` takes core 1 (the stream goes on under load). The agent has
    carried out the WITHDRAW; its ``withdrawn`` event is pending (not forwarded yet)."""
    agent.register()
    long, short, behind = env.submit(true(), true(), true())
    agent.receive(env.step())
    assert [o["job_id"] for o in agent.waiting] == [behind]
    agent.exit(short)
    agent.send()
    agent.receive(env.step())
    env.advance(0.1)
    reclaim = env.step()
    assert reclaim.out.withdraws == {"n0": [[behind, 0]]}
    (late,) = env.submit(true())
    placed = env.step()
    assert [o["job_id"] for o in placed.orders("n0")] == [late]
    agent.receive(reclaim)
    agent.receive(placed)
    assert not agent.waiting and [e[2] for e in agent.pending] == ["withdrawn", "started"]
    return long, behind, late


@pytest.mark.parametrize("meanwhile", ["waits", "starts"])
def test_a_replayed_withdrawn_does_not_take_back_the_order_placed_again(tmp_path: Path, meanwhile: str) -> None:
    """The old daemon handled ``withdrawn``: it placed the job again behind a busy core and committed that,
    the agent got the new order, and the daemon died before it acknowledged the event. The new daemon
    resumes the job BEHIND with the new order; the agent re-registers holding it and replaying
    ``withdrawn`` of the first order. That replay names the first placement's process job id, so it
    touches nothing: the order the agent holds is adopted, not killed, and the job runs once. (When
    both placements carried the same id, the replay requeued the job, the held order was killed as
    unknown and the job placed a third time; with ``starts`` it ran twice.)"""
    path = tmp_path / "journal.db"
    env = CoreEnv(cores=2, store=Store.open(path))
    agent = AgentModel(env)
    long, behind, _ = _withdrawal_meets_a_new_job(env, agent)
    agent.send()  # withdrawn + late's start reach the old daemon
    step = env.step()  # ... which places the job again: both cores busy, so behind one (its own process id)
    assert [(o["job_id"], o.get("after_cores", False)) for o in step.orders("n0")] == [(f"{behind}~1", True)]
    agent.receive(step)  # the agent holds the new order; the daemon dies before acknowledging anything
    if meanwhile == "starts":
        agent.exit(long)  # while no daemon runs: the new order starts on the freed core
        assert agent.starts[behind] == 1

    again = env.restarted(path)
    agent.env = again
    first, _ = agent.reregister()
    assert (f"{behind}~1", 0) in first.running and "withdrawn" in [e.kind for e in first.events if e.job_id == behind]
    again.core.on_agent("n0", first)
    step = again.step()
    killed = [k for refs in step.kills("n0").values() for k in refs]
    agent.receive(step)
    agent.send()
    agent.receive(again.step())
    agent.exit_all()

    assert agent.starts[behind] == 1, f"job {behind} started {agent.starts[behind]} times"
    assert again.state(behind) is JobState.COMPLETED, again.told(behind)[1:5]
    assert [f"{behind}~1", 0] not in killed, "the agent was told to kill the order the journal gave it"
    assert not agent.running and not agent.waiting


def test_a_repeated_register_does_not_withdraw_the_job_a_second_time(tmp_path: Path) -> None:
    """The daemon dies after sending WITHDRAW and before reading the agent's ``withdrawn``. The new daemon
    resumes the job WITHDRAWING (as journaled); the agent sends REGISTER twice (the new daemon, busy
    resuming, answers after 0.5 s). The first is handled as it should be: ``withdrawn`` replayed, the job
    requeued and placed again behind a busy core, under a new process job id. The second REGISTER
    replays the same ``withdrawn``, which names the first placement: nothing happens, and the job runs
    once. (When both placements carried the same id, it was placed a third time and ran twice.)"""
    path = tmp_path / "journal.db"
    env = CoreEnv(cores=2, store=Store.open(path))
    agent = AgentModel(env)
    _, behind, _ = _withdrawal_meets_a_new_job(env, agent)
    agent.send()  # sent to the old daemon, which dies before it reads it

    again = env.restarted(path)
    agent.env = again
    assert again.job(behind).phase is Phase.WITHDRAWING  # as journaled: asked back, not only behind
    first, second = agent.reregister()
    again.core.on_agent("n0", first)
    step = again.step()
    assert [(o["job_id"], o.get("after_cores", False)) for o in step.orders("n0")] == [(f"{behind}~1", True)]
    again.core.on_agent("n0", second)  # sent before REGISTERED came back; read after that step
    step2 = again.step()
    agent.receive(step)
    agent.receive(step2)
    assert agent.starts[behind] == 0  # nothing of it ran before the restart
    agent.exit_all()

    assert agent.starts[behind] == 1, f"job {behind} started {agent.starts[behind]} times after the restart"
    assert again.state(behind) is JobState.COMPLETED
    assert not agent.running and not agent.waiting


def _frames_to_core(agent: Agent, env: CoreEnv) -> list[Any]:
    """What the agent queued for the daemon, decoded and handed to the core."""
    frames, agent._out = agent._out, []
    msgs = [decode(f, TO_DAEMON_FROM_AGENT) for f in frames]
    for msg in msgs:
        env.core.on_agent(agent.node.name, msg)  # type: ignore[arg-type]
    return msgs


def _step_to_agent(env: CoreEnv, agent: Agent) -> Step:
    """One flush of the core, carried out by the agent in the order the daemon sends it."""
    step = env.step()
    name = agent.node.name
    for node, msg in step.out.to_agents:
        if node == name:
            agent._handle(msg)
    for reason, refs in step.kills(name).items():
        agent._handle(Kill(tuple((k[0], k[1]) for k in refs), reason))
    if step.out.withdraws.get(name):
        agent._handle(Withdraw(tuple((k[0], k[1]) for k in step.out.withdraws[name])))
    if step.orders(name):
        agent._handle(Launch(tuple(ProcessOrder.from_wire(o) for o in step.orders(name))))
    agent._submit()
    return step


def test_an_exit_between_register_and_registered_reaches_the_daemon(tmp_path: Path) -> None:
    """The real agent (null launches, its loop's steps called by hand). A job runs; the daemon is killed
    and resumed. The agent's REGISTER (its snapshot: the job running) is on its way when the job exits:
    the agent forwards the exit while unregistered, so it only joins its unacknowledged events
    (``Agent._forward``). REGISTERED comes back acknowledging up to the REGISTER's number; nothing sends
    the exit after it, and the next acknowledged batch drops it (acknowledgements are cumulative). The
    job ran exactly once and stays 'running (ranks)' until ``pilot down``. (A ``withdrawn`` in that window
    leaves its job WITHDRAWING -- 'being taken back' -- the same way.)"""
    path = tmp_path / "journal.db"
    env = CoreEnv(cores=2, store=Store.open(path))
    agent = Agent(
        daemon_url="tcp://127.0.0.1:9", node=_node("n0", 2), workdir=tmp_path, launch="null", null_duration=600
    )
    try:
        agent._tick(time.monotonic())  # not registered yet: a REGISTER
        _frames_to_core(agent, env)
        _step_to_agent(env, agent)
        assert agent._registered
        (job,) = env.submit(true())
        _step_to_agent(env, agent)
        agent._forward()  # its start
        _frames_to_core(agent, env)
        env.step()
        assert env.job(job).phase is Phase.RANKS and env.job(job).run.started is not None

        again = env.restarted(path)
        agent._queue(Heartbeat())
        _frames_to_core(agent, again)
        _step_to_agent(again, agent)  # "unknown": register again
        assert not agent._registered
        agent._next_beat = 0.0
        agent._tick(time.monotonic())
        register = agent._out[:]  # the REGISTER is on its way ...
        agent._out.clear()
        agent._engine.poll(time.monotonic() + 3600)  # ... when the job exits
        agent._forward()
        assert not agent._out  # unregistered: kept for a REGISTER only
        agent._out = register
        _frames_to_core(agent, again)
        _step_to_agent(again, agent)
        assert agent._registered
        (other,) = again.submit(true())  # work goes on: a later batch of events is sent and acknowledged
        _step_to_agent(again, agent)
        agent._forward()
        agent._queue(Heartbeat())
        _frames_to_core(agent, again)
        _step_to_agent(again, agent)
        agent._engine.poll(time.monotonic() + 7200)
        agent._forward()
        agent._queue(Heartbeat())
        _frames_to_core(agent, again)
        _step_to_agent(again, agent)

        assert again.state(other) is JobState.COMPLETED
        left = again.core.book.jobs.get(job)
        assert left is None or left.final, (
            f"job {job} ran once and is still {left.phase.name}; unacked: {agent._unacked}"
        )
        assert again.state(job) is JobState.COMPLETED
    finally:
        agent._sock.close(0)
        agent._ctx.term()
        agent._waiter.close()


def test_a_resumed_job_that_started_behind_a_core_is_not_asked_back(tmp_path: Path) -> None:
    """A job placed behind a busy core starts; its start is acknowledged and journaled (phase 'ranks',
    started set). After a restart, resume() turns every 'ranks' job whose order was placed after_cores
    into BEHIND -- started or not -- so the next reclaim sends WITHDRAW for a process that runs, and
    'pilot explain' says it is being taken back until it ends (an agent that had withdrawn it and one
    that runs it look the same to the resumed core: the journal never recorded which)."""
    path = tmp_path / "journal.db"
    env = CoreEnv(cores=2, store=Store.open(path))
    agent = AgentModel(env)
    agent.register()
    long, short, behind = env.submit(true(), true(), true())
    agent.receive(env.step())
    agent.exit(long)  # core 0 free: the job behind it starts
    agent.send()
    agent.heartbeat()
    agent.receive(env.step())
    assert env.job(behind).phase is Phase.RANKS and env.job(behind).run.started is not None
    assert not agent.unacked

    again = env.restarted(path)
    agent.env = again
    agent.env.core.on_agent("n0", agent.reregister()[0])
    agent.receive(again.step())
    agent.exit(short)  # core 1 free
    agent.send()
    agent.receive(again.step())
    again.advance(0.1)
    step = again.step()
    assert again.job(behind).phase is Phase.RANKS, again.job(behind).phase
    assert not step.out.withdraws


def test_a_batch_is_taken_once_and_only_as_the_next() -> None:
    """Batches of task events are numbered by the agent: a repeat (sent again after a REGISTER carried it)
    is dropped; one that skips a number is not taken (acknowledging it would make the agent drop the
    missing one) -- the agent is asked to register again, with every event it holds."""
    env = CoreEnv(cores=2)
    env.register("n0")
    a, b = env.submit(true(), true())
    env.step()
    started = TaskEvents((TaskEvent(a, 0, "started", env.clock.wall, {}),), 1)
    env.core.on_agent("n0", started)
    env.core.on_agent("n0", started)  # the repeat changes nothing
    assert env.core.nodes.agents["n0"].acked == 1
    exited = TaskEvent(a, 0, "exited", env.clock.wall, {"exit_code": 0})
    env.core.on_agent("n0", TaskEvents((exited,), 3))  # batch 2 was lost
    step = env.step()
    assert ("n0", HeartbeatReply(known=False)) in step.out.to_agents
    assert env.job(a).phase is Phase.RANKS and not env.core.agents.registered("n0")
    b_exited = TaskEvent(b, 0, "exited", env.clock.wall, {"exit_code": 0})
    register = Register(_node("n0", 2), (), (exited, b_exited), 3)  # everything unacknowledged, batches 2 and 3
    env.core.on_agent("n0", register)
    env.step()
    assert env.state(a) is JobState.COMPLETED and env.state(b) is JobState.COMPLETED
    assert env.core.nodes.agents["n0"].acked == 3

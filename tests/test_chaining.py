"""The chained spawner (agent.chaining), driven through the process engine with real processes: a core
whose tasks are short is given orders ahead, its helper starts each when the one before has exited, and
nothing of the engine's contract changes: each order runs once, one at a time on its core, in order;
kills reach running and queued tasks; long tasks get no orders ahead (those stay withdrawable); and a
helper that dies loses no order silently and runs none twice."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
from pilot_waits import wait_for

from agent.chaining import held_wakes
from agent.processes import ProcessEngine
from pilot.model.node import NodeConfigured
from pilot.model.process_order import ProcessOrder
from pilot.wire.messages import TaskEvent


class _Engine:
    """An engine on one declared core of one real cpu (a chain core), and the events it gives."""

    def __init__(self, tmp_path: Path) -> None:
        self.cpu = min(os.sched_getaffinity(0))
        self.poked = threading.Event()
        node = NodeConfigured("n0", "localhost", [self.cpu], 1 << 30)
        self.engine = ProcessEngine(node=node, workdir=tmp_path, notify=self.poked.set)
        self.events: list[TaskEvent] = []

    def order(self, job: str, script: str, *, after: bool = True, **kwargs: object) -> ProcessOrder:
        return ProcessOrder(
            job_id=job,
            slot=0,
            role="rank",
            executable="/bin/sh",
            arguments=["-c", script, job],  # (the job is the script's $0)
            cores=[self.cpu],
            after_cores=after,
            **kwargs,  # type: ignore[arg-type]
        )

    def until(self, jobs: set[str], limit: float = 30) -> list[TaskEvent]:
        """Drain until each of ``jobs`` has an exited, failed or withdrawn event."""
        end = time.monotonic() + limit
        while not jobs <= {e.job_id for e in self.events if e.kind in ("exited", "failed", "withdrawn")}:
            assert time.monotonic() < end, f"not all of {jobs} ended: {self.events}"
            self.events += self.engine.drain()
            deadline = self.engine.next_deadline()
            self.poked.wait(0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic())))
            self.poked.clear()
        return self.events

    def warm(self) -> None:
        """Run a few short tasks: the core's last task is short, so its next orders may go ahead."""
        warm = [self.order(f"w{i}", "exit 0", after=i > 0) for i in range(3)]
        self.engine.submit(warm)
        self.until({o.job_id for o in warm})

    def started(self, job: str, limit: float = 30) -> TaskEvent:
        """Drain until ``job`` has its started event (or its exit, which carries it)."""
        end = time.monotonic() + limit
        while True:
            for ev in self.events:
                if ev.job_id == job and ev.kind in ("started", "exited") and "pid" in ev.data:
                    return ev
            assert time.monotonic() < end, f"{job} did not start: {self.events}"
            self.events += self.engine.drain()
            self.poked.wait(0.02)
            self.poked.clear()

    def ended(self, job: str) -> TaskEvent:
        (event,) = [e for e in self.events if e.job_id == job and e.kind in ("exited", "failed", "withdrawn")]
        return event


def _chain_helpers() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children():
        try:
            if p.cmdline()[1:] == ["chain"]:
                out.append(p)
        except (psutil.Error, IndexError):
            pass
    return out


@pytest.mark.timeout(60)
def test_a_burst_runs_each_order_once_in_order_one_at_a_time_from_the_chained_helper(tmp_path: Path) -> None:
    e = _Engine(tmp_path)
    e.engine.start()
    try:
        log = tmp_path / "log"
        n = 300
        # Each task appends its job and its parent's pid; a task that ran while another did would see
        # the lock taken (mkdir is atomic) and say so.
        script = f'mkdir {tmp_path}/busy || echo overlap >> {log}; echo "$0 $PPID" >> {log}; rmdir {tmp_path}/busy'
        orders = [e.order(f"j{i}", script, after=i > 0) for i in range(n)]
        e.engine.submit(orders)
        e.until({o.job_id for o in orders})
        lines = log.read_text().split("\n")[:-1]
        assert "overlap" not in lines, "two tasks ran on the core at once"
        assert [line.split()[0] for line in lines] == [o.job_id for o in orders], "not each once, in order"
        exits = [e.ended(o.job_id) for o in orders]
        assert all(x.kind == "exited" and x.data["exit_code"] == 0 for x in exits), exits[:3]
        assert all(x.data["max_rss"] > 0 and x.data["wall_duration"] > 0 for x in exits)
        # Their parent was the chained helper (not the agent): the chain ran them, and it is still there.
        parents = {int(line.split()[1]) for line in lines}
        helpers = {p.pid for p in _chain_helpers()}
        assert helpers and parents <= helpers, (parents, helpers)
        # One at a time and back to back: each start is at or after the exit before it.
        for a, b in itertools.pairwise(exits):
            assert b.data["started"] >= a.time - 1e-3, (a, b)
        assert not e.engine.busy()
    finally:
        e.engine.stop()


@pytest.mark.timeout(60)
def test_kills_reach_the_running_task_and_withdraw_the_queued_ones(tmp_path: Path) -> None:
    e = _Engine(tmp_path)
    e.engine.start()
    try:
        e.warm()
        marker = tmp_path / "ran"
        long = e.order("long", "sleep 30")
        queued = [e.order(f"q{i}", f"touch {marker}{i}") for i in range(3)]
        e.engine.submit([long, *queued])
        wait_for(lambda: e.engine.is_running(("long", 0)), what="the long task to start")
        # Queued at the helper already: not withdrawable (they run here as ordered) but killable.
        assert not e.engine.withdraw(("q1", 0))
        assert e.engine.kill(("q1", 0), reason="canceled")
        assert e.engine.kill(("long", 0), reason="walltime")
        e.until({"long", "q0", "q1", "q2"})
        killed = e.ended("long")
        assert killed.kind == "exited" and killed.data["signal"] == signal.SIGTERM, killed
        assert killed.data["reason"] == "walltime"
        withdrawn = e.ended("q1")
        assert withdrawn.kind == "exited" and withdrawn.data == {"reason": "canceled", "spawned": False}
        assert not (tmp_path / "ran1").exists(), "the killed order ran"
        assert (tmp_path / "ran0").exists() and (tmp_path / "ran2").exists()
        assert e.ended("q2").data["exit_code"] == 0
        assert not e.engine.busy()
    finally:
        e.engine.stop()


@pytest.mark.timeout(60)
def test_behind_a_long_task_orders_wait_in_the_agent_and_stay_withdrawable(tmp_path: Path) -> None:
    e = _Engine(tmp_path)
    e.engine.start()
    try:
        first = e.order("long", "sleep 0.3", after=False)
        e.engine.submit([first])
        e.until({"long"})
        # The core's last task was long: what comes behind the next long one waits here, withdrawable.
        marker = tmp_path / "ran"
        e.engine.submit([e.order("long2", "sleep 0.5", after=False), e.order("b", f"touch {marker}")])
        wait_for(lambda: e.engine.is_running(("long2", 0)), what="the second long task to start")
        assert e.engine.withdraw(("b", 0))
        # After short tasks an order with a stream file is not sent ahead either: its file would open early.
        e.until({"long2", "b"})
        short = [e.order(f"s{i}", "exit 0") for i in range(3)]
        e.engine.submit(short)
        e.until({o.job_id for o in short})
        out = tmp_path / "out"
        e.engine.submit([e.order("long3", "sleep 0.5"), e.order("file", "echo hi", stdout_path=str(out))])
        wait_for(lambda: e.engine.is_running(("long3", 0)), what="the third long task to start")
        assert e.engine.withdraw(("file", 0))
        e.until({"long3", "file"})
        assert not marker.exists() and not out.exists()
    finally:
        e.engine.stop()


@pytest.mark.timeout(90)
def test_a_dead_helper_fails_what_it_had_kills_its_orphan_and_a_new_one_takes_the_next(tmp_path: Path) -> None:
    e = _Engine(tmp_path)
    e.engine.start()
    try:
        e.warm()
        pidfile = tmp_path / "pid"
        long = e.order("long", f"echo $$ > {pidfile}; exec sleep 60")
        behind = [e.order(f"b{i}", f"touch {tmp_path}/ran{i}") for i in range(3)]
        e.engine.submit([long, *behind])
        wait_for(lambda: e.engine.is_running(("long", 0)) and pidfile.exists() and pidfile.read_text().strip())
        # The three are at the helper (not still on the chain's queue, from where a new helper would
        # run them: seen under load): the long task's and theirs, four orders sent.
        (lane,) = e.engine._spawners._pinned.values()
        assert lane.chain is not None
        wait_for(lambda: len(lane.chain._sent) == 4, 30, "the three orders behind the long task to reach the helper")
        task = psutil.Process(int(pidfile.read_text()))
        (helper,) = _chain_helpers()
        helper.kill()
        e.until({"long", "b0", "b1", "b2"})
        lost = e.ended("long")
        assert lost.kind == "failed" and "exit status is lost" in lost.data["message"], lost
        for i in range(3):
            b = e.ended(f"b{i}")
            assert b.kind == "failed" and "may have run" in b.data["message"], b
            assert not (tmp_path / f"ran{i}").exists(), "a queued order ran after its helper died"
        task.wait(timeout=20)  # killed by its mark (the agent adopted it)
        # The next orders run through a new helper, once each.
        after = [e.order(f"n{i}", f"echo n{i} >> {tmp_path}/next") for i in range(5)]
        e.engine.submit(after)
        e.until({o.job_id for o in after})
        assert (tmp_path / "next").read_text().split() == [o.job_id for o in after]
        assert [p.pid for p in _chain_helpers()] != [helper.pid]
        assert not e.engine.busy()
    finally:
        e.engine.stop()


@pytest.mark.timeout(60)
def test_an_order_that_fails_in_the_agent_hands_its_core_to_the_next(tmp_path: Path) -> None:
    """An order the chain's thread fails itself (a NUL byte: no request is made) frees its core on that
    thread, which puts the next order on its own queue: that one must still go, and the one behind it
    (it waited in the agent: it names a stream file)."""
    e = _Engine(tmp_path)
    e.engine.start()
    try:
        e.warm()
        out = tmp_path / "out"
        bad = ProcessOrder(
            job_id="bad", slot=0, role="rank", executable="/bin/echo", arguments=["a\x00b"], cores=[e.cpu]
        )
        e.engine.submit([bad, e.order("file", "echo hi", stdout_path=str(out)), e.order("last", "exit 7")])
        e.until({"bad", "file", "last"}, limit=20)
        assert e.ended("bad").kind == "failed" and "null" in e.ended("bad").data["message"]
        assert e.ended("file").data["exit_code"] == 0 and out.read_text() == "hi\n"
        assert e.ended("last").data["exit_code"] == 7
        assert not e.engine.busy()
    finally:
        e.engine.stop()


@pytest.mark.timeout(60)
def test_a_death_the_agent_did_not_cause_is_reported_after_a_hold(tmp_path: Path) -> None:
    """The batch system ending an allocation signals the agent's whole step in no set order: a task's
    death by a signal the agent did not send waits ``_EXTERNAL_HOLD`` (the agent dies meanwhile, and the
    daemon fails the job with the allocation's account); one the agent caused is reported at once."""
    from agent import processes

    e = _Engine(tmp_path)
    e.engine.start()
    try:
        e.engine.submit([e.order("outside", "sleep 30", after=False)])
        os.kill(e.started("outside").data["pid"], signal.SIGTERM)  # as slurmstepd does at scancel
        killed = time.monotonic()
        e.until({"outside"})
        assert time.monotonic() - killed >= processes._EXTERNAL_HOLD
        assert e.ended("outside").data["signal"] == signal.SIGTERM
        assert e.ended("outside").data["reason"] is None
        assert not e.engine.busy()

        e.engine.submit([e.order("own", "sleep 30", after=False)])
        e.started("own")
        assert e.engine.kill(("own", 0), reason="cancelled by the user")
        # Reaped, it is reported without the hold: the first drain after the exit gives it.
        wait_for(lambda: not e.engine.running(), timeout=30, what="the killed task reaped")
        e.until({"own"}, limit=processes._EXTERNAL_HOLD / 2)
        assert e.ended("own").data["reason"] == "cancelled by the user"

        # A crash is no allocation's end: reported at once too.
        e.engine.submit([e.order("crash", "kill -SEGV $$", after=False)])
        wait_for(lambda: not e.engine.running(), timeout=30, what="the crashed task reaped")
        e.until({"crash"}, limit=processes._EXTERNAL_HOLD / 2)
        assert e.ended("crash").data["signal"] == signal.SIGSEGV
    finally:
        e.engine.stop()


@pytest.mark.timeout(60)
def test_a_start_and_exit_read_together_make_one_exit_event_with_what_both_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short task's START and EXIT records in one read are taken in one step (ProcessEngine._ran): its
    exit event carries what the two would (its pid, start, code, the reason of a kill that came while
    it was queued), and no started event goes out for it."""
    folded: list[str] = []
    ran = ProcessEngine._ran

    def counted(self: ProcessEngine, order: ProcessOrder, *args: object) -> None:
        folded.append(order.job_id)
        ran(self, order, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ProcessEngine, "_ran", counted)
    e = _Engine(tmp_path)
    e.engine.start()
    try:
        e.warm()
        orders = [e.order(f"j{i}", f"echo $$ > {tmp_path}/$0") for i in range(100)]
        e.engine.submit(orders)
        assert e.engine.kill(("j60", 0), reason="cancelled by the user")
        e.until({o.job_id for o in orders})
        folded = [job for job in folded if job.startswith("j")]  # (not the warm-up's)
        assert folded, "no start and exit came in one read"
        assert not {ev.job_id for ev in e.events if ev.kind == "started"} & set(folded)
        for job in folded:
            x = e.ended(job)
            assert x.kind == "exited" and x.data["exit_code"] == 0 and x.data["signal"] is None, x
            assert x.data["pid"] == int((tmp_path / job).read_text())
            assert x.data["processors"] == 1 and x.data["max_rss"] > 0
            assert x.time == x.data["started"] + x.data["wall_duration"]
            assert x.data["reason"] == ("cancelled by the user" if job == "j60" else None)
        killed = e.ended("j60")  # withdrawn from the helper's queue, or run: with the kill's reason
        assert killed.data["reason"] == "cancelled by the user", killed
        assert not e.engine.busy()
    finally:
        e.engine.stop()


@pytest.mark.timeout(60)
def test_orders_handed_within_held_wakes_wait_for_its_end_then_run(tmp_path: Path) -> None:
    """The agent's loop hands orders to a chain within ``held_wakes()``: the chain's thread is woken as
    the loop's turn ends, not as each order comes (it would want the GIL and the engine's lock while the
    loop holds both). Until then the order stays on the chain's queue; then it runs."""
    e = _Engine(tmp_path)
    e.engine.start()
    try:
        e.warm()  # the chain's thread is running, idle in its poll
        (lane,) = e.engine._spawners._pinned.values()
        chain = lane.chain
        assert chain is not None
        with held_wakes():
            e.engine.submit([e.order("held", "exit 0")])
            time.sleep(0.3)  # a chain woken at once takes an order within a millisecond or two
            assert chain.queue.qsize() == 1, "the chain was woken before the held wakes ended"
            assert not [ev for ev in e.engine.drain() if ev.job_id == "held"]
        (ended,) = [ev for ev in e.until({"held"}) if ev.job_id == "held" and ev.kind == "exited"]
        assert ended.data["exit_code"] == 0
        # Outside the block, a hand-off wakes the chain at once, as before.
        e.engine.submit([e.order("free", "exit 0")])
        e.until({"free"})
    finally:
        e.engine.stop()

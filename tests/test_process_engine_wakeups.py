"""The process engine's contract with the agent loop, driven directly: the loop sleeps until
``next_deadline`` or a poke, and every exit still reaches it, also when the engine holds exits back
and skips the poke because orders wait behind the exiting task (real processes, no pilot). Each test
runs with both ways of reaping: pidfds (the pinned spawner waits for its own task) and ``wait4(-1)``
with a sentinel child (``PILOT_AGENT_PIDFDS=0``, as where pidfds are missing)."""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

import psutil
import pytest
from pilot_waits import wait_for

from agent.processes import ProcessEngine
from pilot.model.node import NodeConfigured
from pilot.model.process_order import ProcessOrder
from pilot.wire.messages import TaskEvent


@pytest.fixture(autouse=True, params=["pidfd", "wait4"])
def reaping(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The way the engines of a test reap (read when an engine is made)."""
    mode: str = request.param
    if mode == "wait4":
        monkeypatch.setenv("PILOT_AGENT_PIDFDS", "0")
    else:
        monkeypatch.delenv("PILOT_AGENT_PIDFDS", raising=False)
    return mode


class _Loop:
    """What agent.Agent._loop does with the engine: drain, then wait for a poke or the deadline (no
    deadline: a poke only)."""

    def __init__(self, tmp_path: Path, *, declared: int = 1) -> None:
        """``declared`` cores, all on one real cpu (more than one: no spawner waits for its own task)."""
        self.poked = threading.Event()
        self.pokes = 0
        self.batches: list[list[str]] = []  # the jobs whose exits each drain gave, in order
        cpu = min(os.sched_getaffinity(0))
        cores = [cpu] if declared == 1 else list(range(declared))
        node = NodeConfigured("n0", "localhost", cores, 1 << 30)
        cpu_map = None if declared == 1 else dict.fromkeys(cores, cpu)
        self.engine = ProcessEngine(node=node, workdir=tmp_path, notify=self._poke, cpu_map=cpu_map)
        self.cpu = cpu

    def _poke(self) -> None:
        self.pokes += 1
        self.poked.set()

    def run_until(self, refs: set[tuple[str, int]], limit: float) -> list[TaskEvent]:
        """Events until every ref exited; fails if the loop would sleep forever or past ``limit``."""
        got: list[TaskEvent] = []
        end = time.monotonic() + limit
        while True:
            batch = self.engine.drain()
            if exits := [e.job_id for e in batch if e.kind == "exited"]:
                self.batches.append(exits)
            got += batch
            if refs <= {(e.job_id, e.slot) for e in got if e.kind in ("exited", "failed")}:
                return got
            deadline = self.engine.next_deadline()
            timeout = end - time.monotonic() if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.poked.wait(timeout) and deadline is None:
                pytest.fail(f"the loop would sleep forever: exits of {refs} never reported; got {got}")
            self.poked.clear()
            assert time.monotonic() < end, f"not all exits within {limit} s: {got}"


def _order(job: str, cpu: int, args: list[str], *, after: bool) -> ProcessOrder:
    return ProcessOrder(
        job_id=job,
        slot=0,
        role="rank",
        executable="/bin/sh",
        arguments=["-c", *args],
        cores=[cpu],
        after_cores=after,
    )


@pytest.mark.timeout(60)
def test_exits_held_behind_waiting_orders_still_reach_a_sleeping_loop(tmp_path: Path) -> None:
    loop = _Loop(tmp_path)
    loop.engine.start()
    try:
        # Each exit frees the core for the order waiting behind it: the hold applies, and the exit's
        # poke is left to the spawner that takes the next order, or to the loop's own deadline.
        orders = [_order(f"j{i}", loop.cpu, ["sleep 0.05"], after=i > 0) for i in range(4)]
        loop.engine.submit(orders)
        got = loop.run_until({(o.job_id, 0) for o in orders}, limit=30)
        exits = [e for e in got if e.kind == "exited"]
        assert [e.job_id for e in exits] == [o.job_id for o in orders], got
        assert all(e.data["exit_code"] == 0 for e in exits), exits
        assert not loop.engine.busy()
        # Nothing left over: a later drain has no stray events.
        assert loop.engine.drain() == []
    finally:
        loop.engine.stop()


@pytest.mark.timeout(60)
def test_held_exits_go_once_half_the_waiting_orders_have_started(tmp_path: Path) -> None:
    """Exits of short tasks are held while orders wait behind them, but not until the queue runs dry:
    once half of the orders that waited at the first exit have started, the batch goes (the daemon then
    sends more while the other half runs). Seven wait behind q0: its exit, q1's, q2's and q3's go
    together while s0, the fourth to start, runs, well before the exit hold's upper bound."""
    loop = _Loop(tmp_path)
    loop.engine.start()
    try:
        quick = [_order(f"q{i}", loop.cpu, ["exit 0"], after=i > 0) for i in range(4)]
        slow = [_order(f"s{i}", loop.cpu, ["sleep 0.012"], after=True) for i in range(4)]
        loop.engine.submit(quick + slow)
        loop.run_until({(o.job_id, 0) for o in quick + slow}, limit=30)
        assert [j for b in loop.batches for j in b] == [o.job_id for o in quick + slow], loop.batches
        # Held at most until the low-water mark: no slow task's exit is in the first batch (with a plain
        # 20 ms hold, s0 would have exited before it ended), and more batches follow.
        assert all(j.startswith("q") for j in loop.batches[0]), loop.batches
        assert len(loop.batches) >= 2, loop.batches
    finally:
        loop.engine.stop()


@pytest.mark.timeout(60)
def test_an_exit_with_nothing_waiting_wakes_the_loop_at_once(tmp_path: Path) -> None:
    loop = _Loop(tmp_path)
    loop.engine.start()
    try:
        loop.engine.submit([_order("solo", loop.cpu, ["exit 3"], after=False)])
        got = loop.run_until({("solo", 0)}, limit=30)
        (exited,) = [e for e in got if e.kind == "exited"]
        assert exited.data["exit_code"] == 3
        assert loop.pokes >= 1  # no deadline was pending once it ran: only a poke could deliver it
    finally:
        loop.engine.stop()


@pytest.mark.timeout(60)
def test_a_short_tasks_exit_replaces_its_start_not_sent_yet(tmp_path: Path) -> None:
    """A task that exits before its ``started`` event left is reported by its exit alone (which carries
    the start time): the engine drops the held start at the exit, not the loop after draining both."""
    loop = _Loop(tmp_path)
    loop.engine.start()
    try:
        loop.engine.submit([_order("short", loop.cpu, ["exit 0"], after=False)])
        # Not drained before the exit (a start never pokes): the start is still held when it comes.
        assert loop.poked.wait(30), "the exit never woke the loop"
        events = loop.engine.drain()
        assert [(e.job_id, e.kind) for e in events] == [("short", "exited")], events
        assert 0 < events[0].data["started"] <= events[0].time
        assert loop.engine.drain() == []
    finally:
        loop.engine.stop()


def _sentinels(known: set[int]) -> list[psutil.Process]:
    """The engine's sentinel children: those not in ``known`` that run ``/bin/sh -c 'read _'``."""
    found = []
    for p in psutil.Process().children():
        try:
            if p.pid not in known and p.cmdline() == ["/bin/sh", "-c", "read _"]:
                found.append(p)
        except psutil.Error:  # a task that ended meanwhile
            pass
    return found


def _the_sentinel(known: set[int]) -> psutil.Process:
    """The engine's one sentinel, once it shows as such: posix_spawn returns when the child's exec has
    begun, and for a moment after that its /proc cmdline may still be empty."""
    found: list[psutil.Process] = []

    def one() -> bool:
        found[:] = _sentinels(known)
        return len(found) == 1

    wait_for(one, timeout=10, what="the engine's sentinel child")
    return found[0]


@pytest.mark.timeout(60)
def test_a_sentinel_child_keeps_the_reaper_in_wait4_while_the_engine_lives(tmp_path: Path, reaping: str) -> None:
    """With no task running the reaper still waits in wait4 (a task's start then need not wake it): on
    a child of the engine's own, which stop() ends and reaps. With pidfds there is none."""
    known = {p.pid for p in psutil.Process().children()}
    loop = _Loop(tmp_path)
    loop.engine.start()
    if reaping == "pidfd":
        try:
            assert _sentinels(known) == []
        finally:
            loop.engine.stop()
        return
    try:
        sentinel = _the_sentinel(known)
        assert sentinel.environ() == {}  # nothing of the agent's (its credentials were in its environment)
        loop.engine.submit([_order("j", loop.cpu, ["exit 0"], after=False)])
        (exited,) = [e for e in loop.run_until({("j", 0)}, limit=30) if e.kind == "exited"]
        assert exited.data["exit_code"] == 0
        assert sentinel.is_running() and sentinel.status() != psutil.STATUS_ZOMBIE
    finally:
        loop.engine.stop()
    # is_running() is true for a zombie too: this holds only once the reaper has reaped it.
    wait_for(lambda: not sentinel.is_running(), timeout=10, what="stop() to end and reap the sentinel")


@pytest.mark.timeout(60)
def test_tasks_are_still_reaped_once_the_sentinel_is_gone(tmp_path: Path, reaping: str) -> None:
    if reaping == "pidfd":
        pytest.skip("no sentinel with pidfds")
    known = {p.pid for p in psutil.Process().children()}
    loop = _Loop(tmp_path)
    loop.engine.start()
    try:
        sentinel = _the_sentinel(known)
        sentinel.kill()
        # Reaped by the engine's reaper (which then waits on a condition between tasks); is_running()
        # is true for a zombie too.
        wait_for(lambda: not sentinel.is_running(), timeout=10, what="the killed sentinel to be reaped")
        for job in ("a", "b"):
            loop.engine.submit([_order(job, loop.cpu, ["exit 4"], after=False)])
            (exited,) = [e for e in loop.run_until({(job, 0)}, limit=30) if e.kind == "exited"]
            assert exited.data["exit_code"] == 4
    finally:
        loop.engine.stop()


@pytest.mark.timeout(60)
def test_an_order_waiting_for_its_cores_can_be_withdrawn_one_started_cannot(tmp_path: Path) -> None:
    """WITHDRAW (the daemon takes back a job waiting behind a long task): an order still waiting is
    dropped unstarted and reported ``withdrawn``; the running one, and unknown refs, are left alone."""
    loop = _Loop(tmp_path)
    loop.engine.start()
    try:
        marker = tmp_path / "ran"
        first = _order("long", loop.cpu, ["sleep 0.5"], after=False)
        behind = _order("short", loop.cpu, [f"touch {marker}"], after=True)
        loop.engine.submit([first, behind])
        deadline = time.monotonic() + 10
        while not loop.engine.is_running(("long", 0)):
            assert time.monotonic() < deadline, "the first order never started"
            time.sleep(0.01)
        assert not loop.engine.withdraw(("long", 0)), "a running process is not withdrawn"
        assert not loop.engine.withdraw(("nobody", 0))
        assert loop.engine.withdraw(("short", 0))
        assert not loop.engine.withdraw(("short", 0)), "withdrawn once"
        got = loop.run_until({("long", 0)}, limit=30)
        kinds = [(e.job_id, e.kind) for e in got]
        assert ("short", "withdrawn") in kinds and ("long", "exited") in kinds, kinds
        assert not any(j == "short" and k in ("started", "exited") for j, k in kinds), kinds
        # Idle once the long one is reaped: had the withdrawn order started after it, it would run now,
        # or have run (its marker).
        assert not loop.engine.busy()
        assert not marker.exists(), "the withdrawn order ran"
    finally:
        loop.engine.stop()


@pytest.mark.timeout(60)
def test_a_task_without_a_pidfd_is_still_reaped(tmp_path: Path, reaping: str) -> None:
    """Out of file descriptors, the reaper cannot open a task's pidfd: it looks for the exit itself."""
    if reaping != "pidfd":
        pytest.skip("pidfds only")
    loop = _Loop(tmp_path, declared=2)  # two cores on one cpu: the reaper waits for the tasks
    loop.engine.start()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        lowest_free = os.dup(0)
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no new fd can be had
        try:
            with pytest.raises(OSError):
                os.close(os.pidfd_open(os.getpid()))  # as the engine will find
            loop.engine.submit([_order("j", 0, ["exit 3"], after=False)])
            (exited,) = [e for e in loop.run_until({("j", 0)}, limit=30) if e.kind == "exited"]
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert exited.data["exit_code"] == 3 and exited.data["wall_duration"] > 0
        loop.engine.submit([_order("k", 1, ["exit 4"], after=False)])  # with a pidfd again
        (exited,) = [e for e in loop.run_until({("k", 0)}, limit=30) if e.kind == "exited"]
        assert exited.data["exit_code"] == 4
    finally:
        loop.engine.stop()

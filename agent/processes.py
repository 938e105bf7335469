"""The process engine: the table every thread of it shares, and the hand-off of its events to the loop.

Four kinds of thread touch a task: the agent's loop (orders in, kills, events out), the spawner threads
that start processes (:mod:`agent.spawning`; on a chained core, :mod:`agent.chaining`, whose helper
also reaps them and takes their kills), the reaper that waits for them (:mod:`agent.reaping`;
with pidfds, a pinned spawner also waits for its own task) and the tree thread that kills what a killed
task's process group does not hold and reaps what the agent adopted (:mod:`agent.trees`, which only reads
the table). What they share lives here, under one lock that every step takes once: the running processes
by pid and by ref (job id, slot), the orders being started and those waiting for their cores, the cores'
users, and the events not drained yet with the state of their hold. One lock, not one per part, because
each step changes several parts together (an exit frees its cores, hands the orders that waited on them
to their spawners and queues its event), and :meth:`snapshot` must see them all at one instant. The
spawner, reaper and tree threads call this class's underscored methods and read its table under its lock
directly: they are parts of the engine split out by thread, not clients of it (an accessor per read
would cost on every task).

Events go to the loop through a list and one ``notify`` (a self-pipe): a burst of exits costs one
wake-up, and most starts none (see :meth:`ProcessEngine.drain` and ``_report``).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import psutil
import structlog

from agent import environment
from agent.chaining import AHEAD
from agent.reaping import Reaper
from agent.spawning import Spawners, names_streams
from agent.table import Running, WaitingOrders
from agent.trees import Trees
from pilot.model.node import NodeConfigured
from pilot.model.process_order import ProcessOrder
from pilot.wire.messages import ProcessRef, TaskEvent

log = structlog.get_logger("agent.processes")


class ProcessEngine:
    def __init__(
        self,
        *,
        node: NodeConfigured,
        workdir: Path,
        notify: Callable[[], None],
        cpu_map: dict[int, int] | None = None,
        kill_grace: float = 2.0,
    ) -> None:
        """``kill_grace``: seconds between the SIGTERM and the SIGKILL to a killed task's descendants
        outside its process group (agent.trees; the agent's loop escalates for the group)."""
        self._notify = notify
        self._cpu_map = cpu_map or {}
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._by_pid: dict[int, Running] = {}
        self._by_ref: dict[ProcessRef, Running] = {}
        self._early: dict[int, tuple[int, Any, float]] = {}
        self._cancelled: dict[ProcessRef, str] = {}
        self._core_users: dict[int, int] = {}  # core -> processes (running, or handed to a spawner) on it
        self._waiting = WaitingOrders()
        self._waiting_orders = self._waiting.orders  # (its size, read per task: no __len__ call)
        self._events: list[TaskEvent] = []
        #: Deaths this agent did not cause, reported ``_EXTERNAL_HOLD`` later (due time, event): see _defer.
        self._deferred: list[tuple[float, TaskEvent]] = []
        self._held_since: float | None = None  # monotonic start of the oldest held ``started`` event
        self._report_since: float | None = None  # monotonic time of the oldest undrained exit or failure
        self._urgent = False  # an undrained event that is not held (see _report)
        self._hold = _EXIT_HOLD  # how long the undrained exits may wait (see _report)
        self._low_water = 0  # and go once no more orders than this wait here (see _report)
        #: The latest the loop comes back (what next_deadline last told it), and whether a spawner owes
        #: it a wake-up for an undrained exit: see _report.
        self._loop_due = math.inf
        self._wake_owed = False
        self._handoffs = 0  # orders put on a spawner's queue and not taken yet
        self._stopping = False
        self._pending_orders = 0
        #: Orders accepted and not yet started or failed: a ref leaves this set only in the same locked
        #: step that records its first event, so :meth:`snapshot` never misses a process.
        self._pending_refs: dict[ProcessRef, int] = {}
        self._reaper = Reaper(engine=self)
        self._pidfds = self._reaper.pidfds
        self._trees = Trees(engine=self, grace=kill_grace, reaps=self._pidfds)
        self._spawners = Spawners(
            engine=self,
            node=node,
            workdir=workdir,
            cpu_map=self._cpu_map,
            own_reaping=self._pidfds,
            mark=self._trees.prefix,
        )
        #: Chain cores (agent.chaining): how many orders each may be given beyond the one it runs (0 while
        #: its tasks are long: see _ahead), how many of its users are its chain's, and the orders sent
        #: to a chain's helper and not started or failed yet (they are pending, but no agent's child).
        self._chain_cores = self._spawners.chain_cores
        self._room: dict[int, int] = {}
        self._chain_load: dict[int, int] = {}
        self._chained = 0

    # -- called from the event loop ------------------------------------------------------------

    def start(self) -> None:
        self._trees.start()  # the child subreaper first: no task's descendant may go to init
        self._reaper.start(devnull=self._spawners.devnull)
        self._spawners.streams.start()
        self._spawners.thread.start()

    def submit(self, orders: list[ProcessOrder]) -> None:
        """Queue orders for the spawner. One marked ``after_cores`` waits here until no process this
        agent runs (or was told to run) uses its cores: the daemon placed it behind them."""
        with self._lock:
            users = self._core_users
            for order in orders:
                cores = order.cores
                if order.after_cores and (users.get(cores[0]) if len(cores) == 1 else any(users.get(c) for c in cores)):
                    if self._room and self._ahead(order) and not self._waiting.waits_on(cores[0]):
                        self._accept(order)
                    else:
                        self._waiting.add(order)
                else:
                    self._accept(order)

    def _ahead(self, order: ProcessOrder) -> bool:
        """Whether ``order`` may go to its core's chain now, behind what that chain runs (the lock held):
        its core is a chain core whose tasks are short (``_room``), used by its chain's orders only, with
        room left; and the order opens no stream file (that would open before its task starts)."""
        cores = order.cores
        if len(cores) != 1 or self._stopping:
            return False
        core = cores[0]
        room = self._room.get(core)
        return (
            room is not None
            and room > 0
            and self._core_users.get(core, 0) == self._chain_load.get(core, 0) <= room
            and order.role == "rank"
            and not names_streams(order)
        )

    def _accept(self, order: ProcessOrder) -> None:
        # Called with the lock held.
        users = self._core_users
        cores = order.cores
        for c in cores:
            users[c] = users.get(c, 0) + 1
        if len(cores) == 1 and cores[0] in self._chain_cores:
            self._chain_load[cores[0]] = self._chain_load.get(cores[0], 0) + 1
        self._pending_orders += 1
        self._handoffs += 1
        ref = (order.job_id, order.slot)
        self._pending_refs[ref] = self._pending_refs.get(ref, 0) + 1
        self._spawners.hand(order, stopping=self._stopping)

    def _release(self, order: ProcessOrder) -> None:
        """The order never started: free its cores, start who waited on them."""
        with self._lock:
            # The loop's next_deadline must see them pending (their starts do not wake it), unless an
            # undrained exit already makes it come back within the exit hold.
            wake = self._free(order) and self._report_since is None
        if wake:
            self._notify()

    def _free(self, order: ProcessOrder) -> bool:
        """Free the order's cores and hand the orders that waited on them to their spawners (the lock
        held); True if any."""
        users = self._core_users
        cores = order.cores
        for c in cores:
            users[c] -= 1
        if len(cores) == 1 and cores[0] in self._chain_cores:
            self._chain_load[cores[0]] -= 1
        return bool(self._waiting_orders) and self._waiting.release(
            cores, users, self._accept, ahead=self._ahead if self._room else None
        )

    def poll(self, mono: float) -> None:
        """Nothing to do at a given time: the spawner and reaper threads report by themselves."""

    def next_deadline(self) -> float | None:
        """When held events are due (see :meth:`drain`); while orders are being spawned, one start hold
        from now, since their ``started`` events come without a wake-up. The loop calls this right
        before it waits: what it returns bounds the loop's next turn (``_report`` relies on it)."""
        with self._lock:
            when = self._next_deadline()
            if self._deferred and (when is None or self._deferred[0][0] < when):
                when = self._loop_due = self._deferred[0][0]
            return when

    def _next_deadline(self) -> float | None:
        """:meth:`next_deadline` of the events held by :meth:`drain` (the lock held)."""
        when = None if self._report_since is None else self._report_since + self._hold
        if when is not None and not self._urgent and (self._waiting_orders or self._pending_orders):
            # drain() gives nothing before the exit hold ends, held starts included: an earlier
            # turn would find nothing, and the next one the same, a busy loop until then.
            self._loop_due = when
            return when
        if self._held_since is not None:
            start = self._held_since + _START_HOLD
        elif self._pending_orders:
            start = time.monotonic() + _START_HOLD
        else:
            start = None
        if start is not None:
            when = start if when is None else min(when, start)
        self._loop_due = math.inf if when is None else when
        return when

    def drain(self) -> list[TaskEvent]:
        """Events to send. A ``started`` event is held up to ``_START_HOLD`` seconds while its process
        runs: a short task's exit then carries it (one event, one daemon pass, not two). A task's
        ``started`` never wakes the loop by itself; exits and failures do. While orders wait here for
        their cores, exits are held too (up to ``_EXIT_HOLD`` seconds, or until half of those orders have
        started: _report): the cores stay busy meanwhile, and the daemon gets the exits of a burst in one
        message (and answers with one batch of orders) instead of one each; an agent with no queued work
        reports at once."""
        with self._lock:
            deferred = self._deferred
            if deferred:
                now = time.monotonic()
                while deferred and deferred[0][0] <= now:
                    self._report(deferred.pop(0)[1])
            if not self._events:  # (then nothing is held either: the fields below are reset)
                return []
            now = time.monotonic()
            since = self._report_since
            if (
                since is not None
                and not self._urgent
                and now - since < self._hold
                and (self._waiting_orders or self._pending_orders)
            ):
                return []
            events, self._events = self._events, []
            self._held_since = self._report_since = None
            self._wake_owed = self._urgent = False
            for e in events:  # (a plain loop, no generator: most batches are exits alone)
                if e.kind == "started":
                    break
            else:
                return events
            out: list[TaskEvent] = []
            for e in events:
                run = self._by_ref.get((e.job_id, e.slot)) if e.kind == "started" else None
                if run is not None and now - run.started_mono < _START_HOLD:
                    self._events.append(e)
                    if self._held_since is None or run.started_mono < self._held_since:
                        self._held_since = run.started_mono
                else:
                    out.append(e)
        return out

    def kill(self, ref: ProcessRef, *, reason: str, sig: int = signal.SIGTERM) -> bool:
        """Signal the process group of ``ref`` here, and have the tree thread signal what of it left that
        group (SIGTERM there escalates by itself, agent.trees); an order not started yet is dropped.
        False if unknown."""
        with self._lock:
            run = self._by_ref.get(ref)
            if run is None:
                waiting = self._waiting.take(ref)
                if waiting is not None:
                    self._report(TaskEvent(ref[0], ref[1], "exited", time.time(), {"reason": reason, "spawned": False}))
                elif self._pending_orders:
                    self._cancelled[ref] = reason
                    if self._chained:
                        self._spawners.cancel(ref)
                else:
                    return False
                notify = waiting is not None
            else:
                notify = False
                if run.reason is None:
                    run.reason = reason
        if run is None:
            if notify:
                self._notify()
            return True
        self._signal(run, sig)
        return True

    def _signal(self, run: Running, sig: int) -> None:
        """Signal a task's process group (through the helper that reaps it, if one does), and what of its
        tree left that group (agent.trees)."""
        if run.signal is not None:
            run.signal(sig)
        else:
            try:
                os.killpg(run.pid, sig)
            except ProcessLookupError:
                pass
        self._trees.kill(run.tag, run.order.job_id, run.pid, sig)

    def kill_rest(self) -> None:
        """The agent is stopping: what ended tasks left running gets SIGTERM too, SIGKILL after the kill
        grace (agent.trees); the caller kills the running tasks."""
        self._trees.kill_all()

    def withdraw(self, ref: ProcessRef) -> bool:
        """Drop an order still waiting here for its cores (the daemon places it elsewhere) and report
        it ``withdrawn``; False when it is not waiting any more (started, being started, or unknown):
        then it runs here as ordered, and its events say so."""
        with self._lock:
            if self._waiting.take(ref) is None:
                return False
            wake = self._report(TaskEvent(ref[0], ref[1], "withdrawn", time.time(), {}))
        if wake:
            self._notify()
        return True

    def deadline(self, ref: ProcessRef) -> float | None:
        """Monotonic time at which ``ref`` exceeds its walltime, if it runs and has one."""
        with self._lock:
            run = self._by_ref.get(ref)
            if run is None or run.order.walltime is None:
                return None
            return run.started_mono + run.order.walltime

    def is_running(self, ref: ProcessRef) -> bool:
        with self._lock:
            return ref in self._by_ref

    def running(self) -> list[ProcessRef]:
        """Refs of the processes this agent runs and of the orders waiting for their cores."""
        with self._lock:
            return self._running_locked()

    def _running_locked(self) -> list[ProcessRef]:
        refs = dict.fromkeys(self._by_ref)
        refs.update(dict.fromkeys(self._pending_refs))
        refs.update(dict.fromkeys((w.job_id, w.slot) for w in self._waiting))
        return list(refs)

    def snapshot(self) -> tuple[list[ProcessRef], list[TaskEvent]]:
        """Running refs and the events not drained yet, taken together: every order this agent got is
        in one or the other (or in events drained before), which a restarted daemon relies on to tell
        orders the agent never received from ones it ran."""
        with self._lock:
            events, self._events = self._events, []
            events += [event for _, event in self._deferred]
            self._deferred.clear()
            self._held_since = self._report_since = None
            self._wake_owed = self._urgent = False
            return self._running_locked(), events

    def busy(self) -> bool:
        with self._lock:
            return bool(self._by_ref) or self._pending_orders > 0 or bool(self._waiting) or bool(self._deferred)

    def sample(self) -> None:
        """psutil pass over running process trees (peak RSS of the whole tree, for Delivered)."""
        now = time.monotonic()
        with self._lock:
            runs = [r for r in self._by_ref.values() if now - r.started_mono > 1.0]
        for run in runs:
            try:
                proc = psutil.Process(run.pid)
                rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            run.tree_rss = rss
            run.peak_tree_rss = max(run.peak_tree_rss, rss)

    def tasks_rss(self) -> int:
        """The running tasks' trees' RSS at their last sample (tasks under a second old not counted)."""
        with self._lock:
            return sum(r.tree_rss for r in self._by_ref.values())

    def stop(self) -> None:
        """Stop spawning; the caller has killed what runs. Threads end once the last child is reaped."""
        with self._lock:
            self._stopping = True
            self._cv.notify_all()
            pinned = self._spawners.pinned()
            fd = self._reaper.take_sentinel_fd()
        self._reaper.stop(fd)
        self._spawners.stop(pinned)
        threads = [self._spawners.thread, self._reaper.thread, *(lane.thread for lane in pinned)]
        for t in threads:
            t.join(timeout=10)
        self._trees.stop()  # what the tasks left running: nothing of theirs outlives the agent
        self._spawners.streams.stop()  # after its writers are gone: their last output is kept
        if not any(t.is_alive() for t in threads):
            self._spawners.close()

    # -- called from the spawner threads ----------------------------------------------------------

    def _unpend(self, order: ProcessOrder) -> None:
        """The order is no longer being started (the lock held): it runs, or it never will."""
        self._pending_orders -= 1
        ref = (order.job_id, order.slot)
        left = self._pending_refs[ref] - 1
        if left:
            self._pending_refs[ref] = left
        else:
            del self._pending_refs[ref]

    def _taken(self, ref: ProcessRef, *, chained: bool = False) -> bool:
        """A spawner took the order of ``ref`` off its queue: False when it was cancelled meanwhile
        (reported here). ``chained``: a chain's thread took it for its helper (it counts as sent to the
        chain from here on, in the same step: no agent's child will come of it)."""
        with self._lock:
            self._handoffs -= 1
            cancelled = self._cancelled.pop(ref, None) if self._cancelled else None
            if chained and cancelled is None:
                self._chained += 1
            wake, self._wake_owed = self._wake_owed, False
        if wake:  # the hand-off that mattered is done (see _report)
            self._notify()
        if cancelled is not None:
            self._emit(TaskEvent(ref[0], ref[1], "exited", time.time(), {"reason": cancelled, "spawned": False}))
            return False
        return True

    def _started(
        self, ref: ProcessRef, run: Running, started: TaskEvent, *, reaps: bool, chained: bool = False
    ) -> bool:
        """A process runs for ``ref``: into the table, its ``started`` event queued. True when the spawner
        that started it waits for it itself (``reaps``, with pidfds); else the reaper does. ``chained``:
        a chain's helper started it (no longer one of the orders sent to a chain, in the same step)."""
        pid = run.pid
        own = False
        with self._lock:
            if chained:
                self._chained -= 1
            self._by_pid[pid] = run
            self._by_ref[ref] = run
            early = self._early.pop(pid, None) if self._early else None
            self._events.append(started)  # no wake-up: see drain
            # Not pending from here on, in the same step: an exit reaped right away (a short task's)
            # must not see its own order still being started, and be held for it (_report).
            self._unpend(run.order)
            # Killed while it was being started: it gets the kill now.
            cancelled = self._cancelled.pop(ref, None) if self._cancelled else None
            if cancelled is not None:
                run.reason = cancelled
            if self._pidfds:  # in the same step: the reaper never sees "nothing left" while it starts
                if reaps:
                    own = True
                else:
                    self._reaper.watch(pid)
            else:
                self._cv.notify()  # (a reaper that lost its sentinel waits for it; with pidfds none does)
        if cancelled is not None:
            self._signal(run, signal.SIGTERM)
        if early is not None:
            try:
                self._finish(pid, *early)
            except Exception:  # it started: the spawner must not count it as never started
                log.exception("reaping an early exit failed", job=ref[0], slot=ref[1])
        return own

    def _never_started(self, order: ProcessOrder, *, chained: bool = False) -> None:
        """The order failed to start, or was cancelled before: it is no longer pending (``chained``: nor
        sent to a chain)."""
        with self._lock:
            if chained:
                self._chained -= 1
            self._unpend(order)
        self._release(order)

    # -- called from the reaper, or a spawner that waits for its own task -------------------------

    def _finish(self, pid: int, status: int, rusage: Any, mono: float) -> None:
        with self._lock:
            run = self._by_pid.pop(pid, None)
            if run is None:
                # A spawner may not have put it in the table yet (orders sent to chains are no children).
                if self._pending_orders - self._chained > self._handoffs:
                    self._keep_early(pid, status, rusage, mono)
                # else it is no task: a descendant of one, adopted by the agent (agent.trees), reaped
                # by wait4(-1) (without pidfds)
                return
            # The process is gone: its cores first, so that the order waiting on them reaches its
            # spawner before anything else (the task's exit event, the loop's wake-up) takes the GIL.
            order = run.order
            if run.signal is not None:  # a chain's: it may run orders ahead while its tasks are short
                self._room[order.cores[0]] = AHEAD if mono - run.started_mono < _HOLD_UNDER else 0
            self._free(order)
            ref = (order.job_id, order.slot)
        code, event = _exited(order, run.pid, run.started, mono - run.started_mono, status, rusage, run.reason)
        if run.popen is not None:
            run.popen.returncode = code  # reaped here: its Popen must not wait for it again
        data = event.data
        data["max_rss"] = max(data["max_rss"], run.peak_tree_rss)
        if run.env_file is not None:
            after = environment.take_file(run.env_file)
            if after is not None and run.env is not None:
                data["environment"], data["unset"] = environment.changes(run.env, after)
        with self._lock:
            if self._by_ref.get(ref) is run:
                del self._by_ref[ref]  # in the same step as its exit event: see snapshot()
            events = self._events
            if events:
                # Not sent yet, and the exit carries the start (a short task's, mostly): one event, not
                # two to hold, drain and match up (drain, Agent._forward drop it otherwise). Last, or
                # next to last: another spawner's start came after it.
                start = run.start_event
                if events[-1] is start:
                    events.pop()
                elif len(events) > 1 and events[-2] is start:
                    del events[-2]
            wake = self._defer(event) if -code in _ENDING_SIGNALS and run.reason is None else self._report(event)
        if wake:
            self._notify()

    # -- called from a chain's thread (agent.chaining) --------------------------------------------

    def _ran(
        self, order: ProcessOrder, pid: int, started: float, mono0: float, status: int, rusage: Any, mono: float
    ) -> None:
        """A chain's task whose start and exit came in one read of its helper's records: one locked step
        for both (what ``_started`` and ``_finish`` do), with no row in the table and no ``started`` event
        to queue and take back. ``order``: no pre process's (no environment file to read)."""
        ref = (order.job_id, order.slot)
        with self._lock:
            self._chained -= 1
            self._unpend(order)
            reason = self._cancelled.pop(ref, None) if self._cancelled else None
            code, event = _exited(order, pid, started, mono - mono0, status, rusage, reason)
            self._room[order.cores[0]] = AHEAD if mono - mono0 < _HOLD_UNDER else 0
            self._free(order)
            wake = self._defer(event) if -code in _ENDING_SIGNALS and reason is None else self._report(event)
        if wake:
            self._notify()

    def _sent_to_chain(self, n: int) -> None:
        with self._lock:
            self._chained += n

    def _cancel_reason(self, ref: ProcessRef) -> str:
        """Why the order of ``ref`` was withdrawn from a chain: its kill's reason, else the agent's stop."""
        with self._lock:
            return self._cancelled.pop(ref, None) or "agent exiting"

    def _unchain(self, cpu: int) -> None:
        """The chain of ``cpu`` has no helper: its core gets one order at a time again."""
        with self._lock:
            for core in self._chain_cores:
                if self._cpu_map.get(core, core) == cpu:
                    self._room.pop(core, None)

    def _lost(self, run: Running, message: str) -> None:
        """A started task whose helper died: its exit is lost. It fails, its cores are free, and what runs
        of it (adopted by the agent, as the helper's orphan) is killed by its mark."""
        order = run.order
        ref = (order.job_id, order.slot)
        with self._lock:
            if self._by_pid.get(run.pid) is run:
                del self._by_pid[run.pid]
            if self._by_ref.get(ref) is run:
                del self._by_ref[ref]
            self._free(order)
            wake = self._defer(TaskEvent(order.job_id, order.slot, "failed", time.time(), {"message": message}))
        self._trees.kill(run.tag, order.job_id, 0, signal.SIGKILL)
        if wake:
            self._notify()

    def _lost_order(self, tag: int, order: ProcessOrder) -> None:
        """An order whose helper died before it reported a start (reported failed): it never started, or
        what it started is killed by its mark."""
        self._trees.kill(tag, order.job_id, 0, signal.SIGKILL)
        self._never_started(order)

    def _keep_early(self, pid: int, status: int, rusage: Any, mono: float) -> None:
        """An exit reaped before its spawner put the process in the table (the lock held), kept for
        ``_started``; or an adopted process's, reaped while a spawner was starting one: kept, and
        dropped ``_EARLY_KEPT`` seconds later (its pid could come back as a new task's)."""
        early = self._early
        if early:
            for old in [p for p, (_, _, when) in early.items() if mono - when > _EARLY_KEPT]:
                del early[old]
        early[pid] = (status, rusage, mono)

    def _emit(self, event: TaskEvent) -> None:
        with self._lock:
            first = self._report(event)
        if first:
            self._notify()

    def _defer(self, event: TaskEvent) -> bool:
        """Report a task's death that this agent did not cause (one of ``_ENDING_SIGNALS`` it did not
        send, the loss of the task's helper) ``_EXTERNAL_HOLD`` seconds from now (the lock held). The
        batch system ending the allocation (scancel, walltime) signals every process of the agent's
        step, the agent's own included, in no set order: the agent dies within that time, and the
        daemon fails the job with the allocation's account of why, not with "killed by signal 15" or
        "its helper ended". True: wake the loop, which then waits until it is due (next_deadline)."""
        self._deferred.append((time.monotonic() + _EXTERNAL_HOLD, event))
        return True

    def _report(self, event: TaskEvent) -> bool:
        """Queue an exit or failure (the lock held). True if the loop must be woken: only for the first
        one not drained yet (the loop then drains or holds them all, next_deadline), and not when
        :meth:`drain` would hold it anyway and the loop comes back by the end of that hold by itself
        (``_loop_due``) or is woken by the spawner that takes a handed-off order (``_wake_owed``): a
        wake-up now would only make the loop compete for the GIL with the thread that hands that
        order over and the spawner that starts it. Exits of short tasks wait up to ``_EXIT_HOLD``, where
        batching pays most (many per second), but only until half the orders that waited here when the
        first of them came have started (``_low_water``): the other half keeps the cores busy while the
        daemon answers the batch with more. An agent that runs few tasks per second (one core of many
        nodes) so sends batches as large as one that runs many. While an exit of a task that ran
        ``_HOLD_UNDER`` or longer is among them, ``_EXIT_HOLD_LONG``. A failure or a withdrawal is
        reported at once, with whatever was held."""
        self._events.append(event)
        wall = event.data.get("wall_duration")
        if event.kind != "exited" or not isinstance(wall, float):
            wake = not self._urgent
            self._urgent = True
            if self._report_since is None:
                self._report_since = time.monotonic()
            return wake
        hold = _EXIT_HOLD if wall < _HOLD_UNDER else _EXIT_HOLD_LONG
        if self._report_since is not None:
            self._hold = min(self._hold, hold)  # the loop's deadline stays as it was: at most later
            if self._urgent or len(self._waiting_orders) + self._chained > self._low_water:
                return False
            self._urgent = True  # half the queue is gone: the daemon must send more
        else:
            now = self._report_since = time.monotonic()
            self._hold = hold
            waiting = len(self._waiting_orders) + self._chained  # (queued at a chain's helper too)
            self._low_water = waiting // 2
            if not waiting:
                self._urgent = True
            elif self._loop_due <= now + hold:
                return False
        if self._handoffs:
            self._wake_owed = True
            return False
        return True


def _exited(
    order: ProcessOrder, pid: int, started: float, wall: float, status: int, rusage: Any, reason: str | None
) -> tuple[int, TaskEvent]:
    """A task's exit code (negative: the signal) and its ``exited`` event."""
    code = os.waitstatus_to_exitcode(status)
    wall = max(0.0, wall)
    data: dict[str, Any] = {
        "pid": pid,
        "started": started,
        "exit_code": code if code >= 0 else None,
        "signal": -code if code < 0 else None,
        "wall_duration": wall,
        "user_cpu_time": rusage.ru_utime,
        "system_cpu_time": rusage.ru_stime,
        "max_rss": rusage.ru_maxrss * 1024,
        "processors": len(order.cores),
        "reason": reason,
    }
    return code, TaskEvent(order.job_id, order.slot, "exited", started + wall, data)


_START_HOLD: Final = 0.005  # seconds a running task's ``started`` event may wait for its exit (drain)
#: Seconds the exits of short tasks may wait at most to go together while orders wait here (drain, _report).
_EXIT_HOLD: Final = 0.02
_EXTERNAL_HOLD: Final = 1.0  # seconds a death this agent did not cause waits to be reported (_defer)
#: What batch systems send a job's processes at its end (Slurm, PBS, LSF, Grid Engine): a task's death by
#: one of these that the agent did not send waits _EXTERNAL_HOLD; a crash (SIGSEGV, SIGABRT) does not.
_ENDING_SIGNALS: Final = frozenset({signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP})
_EXIT_HOLD_LONG: Final = 0.002  # the same for exits of tasks that ran _HOLD_UNDER or longer (few per second)
_HOLD_UNDER: Final = 0.02
_EARLY_KEPT: Final = 5.0  # seconds an exit no spawner claimed is kept (_keep_early)

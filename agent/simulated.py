"""Null (simulated) launches: the agent takes orders and reports them as run, without any process.

A benchmark and testing mode, never a way to run work: ``python -m agent --launch null`` (or
``allocation.launch = "null"`` for the local LRM). Each process order "starts" when the real engine
would spawn it (its cores free, or at once) and "exits" with code 0 after ``duration`` seconds (0: in
the same batch of events), with the events, fields and core ownership of a real launch (an order
placed ``after_cores`` waits for its cores; kill and walltime end it with the signal, as a process that
dies of it). Delivered figures are zeros and the exit event says ``simulated``. No thread, no process:
the agent's loop drives it (:meth:`poll`, :meth:`next_deadline`), so one process can host many nodes
and the daemon's scheduler and wire can be measured at a thousand nodes on one machine.
"""

from __future__ import annotations

import heapq
import itertools
import signal
import time
from collections import Counter, deque
from dataclasses import dataclass

from agent.table import WaitingOrders
from pilot.model.process_order import ProcessOrder
from pilot.wire.messages import ProcessRef, TaskEvent


@dataclass(slots=True)
class _Simulated:
    order: ProcessOrder
    started: float  # wall clock
    started_mono: float
    reason: str | None = None


class NullEngine:
    """The agent's process engine with simulated processes (same interface as ``ProcessEngine``)."""

    def __init__(self, *, duration: float = 0.0) -> None:
        if not duration >= 0:  # NaN included
            raise ValueError(f"simulated duration must be >= 0 seconds, not {duration!r}")
        self._duration = duration
        self._running: dict[ProcessRef, _Simulated] = {}
        self._waiting = WaitingOrders()  # indexed by core: an exit looks only at its own cores' orders
        self._core_users: Counter[int] = Counter()
        self._due: list[tuple[float, int, ProcessRef]] = []  # (monotonic end, tie-break, ref)
        self._tie = itertools.count()
        self._events: list[TaskEvent] = []
        self._ending: deque[ProcessRef] = deque()  # started with no duration: they exit in the same step

    # -- the engine interface (all called from the agent's loop) ----------------------------------

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def sample(self) -> None:
        pass

    def submit(self, orders: list[ProcessOrder]) -> None:
        now, mono = time.time(), time.monotonic()
        for order in orders:
            if order.after_cores and any(self._core_users[c] for c in order.cores):
                self._waiting.add(order)
            else:
                self._start(order, now, mono)
        self._settle()

    def poll(self, mono: float) -> None:
        """End the simulated processes whose duration is over."""
        while self._due and self._due[0][0] <= mono:
            _, _, ref = heapq.heappop(self._due)
            run = self._running.get(ref)
            if run is not None:
                self._exit(ref, run, exit_code=0, sig=None)
        self._settle()

    def next_deadline(self) -> float | None:
        """Now while events wait to go (orders submitted at the end of the loop's turn start at once),
        else the next simulated exit."""
        if self._events:
            return time.monotonic()
        return self._due[0][0] if self._due else None

    def drain(self) -> list[TaskEvent]:
        events, self._events = self._events, []
        return events

    def snapshot(self) -> tuple[list[ProcessRef], list[TaskEvent]]:
        return self.running(), self.drain()

    def kill(self, ref: ProcessRef, *, reason: str, sig: int = signal.SIGTERM) -> bool:
        run = self._running.get(ref)
        if run is not None:
            if run.reason is None:
                run.reason = reason
            self._exit(ref, run, exit_code=None, sig=int(sig))
            self._settle()
            return True
        if self._waiting.take(ref) is None:
            return False
        self._events.append(TaskEvent(ref[0], ref[1], "exited", time.time(), {"reason": reason, "spawned": False}))
        return True

    def withdraw(self, ref: ProcessRef) -> bool:
        if self._waiting.take(ref) is None:
            return False
        self._events.append(TaskEvent(ref[0], ref[1], "withdrawn", time.time(), {}))
        return True

    def deadline(self, ref: ProcessRef) -> float | None:
        run = self._running.get(ref)
        if run is None or run.order.walltime is None:
            return None
        return run.started_mono + run.order.walltime

    def is_running(self, ref: ProcessRef) -> bool:
        return ref in self._running

    def running(self) -> list[ProcessRef]:
        return [*self._running, *((w.job_id, w.slot) for w in self._waiting)]

    def kill_rest(self) -> None:
        """Nothing outlives a simulated process."""

    def busy(self) -> bool:
        return bool(self._running or self._waiting.orders)

    # -- simulated processes ------------------------------------------------------------------------

    def _start(self, order: ProcessOrder, now: float, mono: float) -> None:
        ref = (order.job_id, order.slot)
        for c in order.cores:
            self._core_users[c] += 1
        run = _Simulated(order, now, mono)
        self._running[ref] = run
        self._events.append(TaskEvent(order.job_id, order.slot, "started", now, {"pid": 0}))
        if self._duration == 0:
            self._ending.append(ref)
        else:
            heapq.heappush(self._due, (mono + self._duration, next(self._tie), ref))

    def _exit(self, ref: ProcessRef, run: _Simulated, *, exit_code: int | None, sig: int | None) -> None:
        del self._running[ref]
        mono = time.monotonic()
        wall = max(0.0, mono - run.started_mono)
        data = {
            "pid": 0,
            "started": run.started,
            "exit_code": exit_code,
            "signal": sig,
            "wall_duration": wall,
            "user_cpu_time": 0.0,
            "system_cpu_time": 0.0,
            "max_rss": 0,
            "processors": len(run.order.cores),
            "reason": run.reason,
            "simulated": True,
        }
        self._events.append(TaskEvent(ref[0], ref[1], "exited", run.started + wall, data))
        cores = run.order.cores
        for c in cores:
            self._core_users[c] -= 1
        if self._waiting.orders:
            now = run.started + wall  # they start the instant its cores are free, on the same clock
            self._waiting.release(cores, self._core_users, lambda w: self._start(w, now, mono))

    def _settle(self) -> None:
        """Exit what started with no duration (and what that lets start), without recursion."""
        while self._ending:
            ref = self._ending.popleft()
            run = self._running.get(ref)
            if run is not None:
                self._exit(ref, run, exit_code=0, sig=None)

"""The records an engine's threads share: a process's row in the table (its ref is the wire's
``ProcessRef``, the events it produces the wire's :class:`~pilot.wire.messages.TaskEvent`).

Apart from the engines (processes, simulated) so that the spawner and reaper modules can build and read
them without importing the engine that owns the table. A :class:`Running` row is written by the spawner
that starts its process and read under the engine's lock by everyone else; only its ``reason`` (the loop,
when it signals the process) and ``peak_tree_rss`` (the sampler) change after.
"""

from __future__ import annotations

import heapq
import subprocess
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pilot.model.process_order import ProcessOrder
from pilot.wire.messages import ProcessRef, TaskEvent


class WaitingOrders:
    """Orders that wait for their cores, first come first served, indexed by core: an exit looks only at
    the orders on the cores it freed, not at every one waiting (that scan, ~30 orders deep on a busy
    2-core node, was a quarter of the spawner threads' profile). Every order here is blocked by a busy
    core (it came in blocked, and each freeing starts what it unblocks), so only an order on a core
    just freed can start."""

    __slots__ = ("_on", "_seq", "orders")

    def __init__(self) -> None:
        #: Arrival number -> order, in arrival order. Read-only to others: the engine tests its size and
        #: emptiness on this dict, with no call of a Python method per task (``__len__``).
        self.orders: dict[int, ProcessOrder] = {}
        #: core -> arrival numbers of the orders on it, ascending; numbers no longer in ``orders``
        #: (started, withdrawn, killed) are dropped when they reach the front.
        self._on: dict[int, deque[int]] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self.orders)

    def __iter__(self) -> Iterator[ProcessOrder]:
        return iter(self.orders.values())

    def add(self, order: ProcessOrder) -> None:
        self._seq += 1
        self.orders[self._seq] = order
        for c in order.cores:
            on = self._on.get(c)
            if on is None:
                on = self._on[c] = deque()
            on.append(self._seq)

    def take(self, ref: ProcessRef) -> ProcessOrder | None:
        """Remove and return the order of ``ref`` (a KILL or a WITHDRAW of one not started); None when
        none waits."""
        for seq, order in self.orders.items():
            if (order.job_id, order.slot) == ref:
                del self.orders[seq]
                return order
        return None

    def waits_on(self, core: int) -> bool:
        """Whether an order waits for ``core``."""
        on = self._on.get(core)
        return on is not None and bool(self._pruned(on))

    def _pruned(self, on: deque[int]) -> deque[int]:
        """``on`` without the numbers at its front that are no longer waiting orders."""
        orders = self.orders
        while on and on[0] not in orders:
            on.popleft()
        return on

    def release(
        self,
        cores: list[int],
        users: dict[int, int],
        start: Callable[[ProcessOrder], None],
        *,
        ahead: Callable[[ProcessOrder], bool] | None = None,
    ) -> bool:
        """``cores`` were just released (``users``: processes per core): ``start`` the orders that now
        can, in arrival order; True if any. ``ahead``: whether an order may start on its one busy core
        all the same (a chain core's, agent.chaining): the orders first on that core go while it says so."""
        orders = self.orders
        if len(cores) == 1:  # (most orders: one core, whose waiting orders are in arrival order already)
            core = cores[0]
            on = self._on.get(core)
            if on is None:
                return False
            started = False
            if not users.get(core):
                for seq in self._pruned(on):
                    order = orders.get(seq)
                    # (an order of this one core alone needs no look at the others: it is free)
                    if order is not None and (len(order.cores) == 1 or not any(users.get(c) for c in order.cores)):
                        del orders[seq]
                        start(order)  # its core is busy again: only what may go ahead of it can start
                        started = True
                        break
                else:
                    return False
            if ahead is not None:
                while True:
                    if not self._pruned(on) or not ahead(orders[on[0]]):
                        break
                    start(orders.pop(on.popleft()))
                    started = True
            return started
        freed = [c for c in cores if not users.get(c)]
        if not freed or not orders:
            return False
        lists = []
        for c in freed:
            on = self._on.get(c)
            if on is None:
                continue
            if self._pruned(on):
                lists.append(on)
            else:
                del self._on[c]
        if not lists:
            return False
        started = False
        for seq in lists[0] if len(lists) == 1 else heapq.merge(*lists):
            order = orders.get(seq)  # (None: gone, or started already from another freed core's list)
            if order is None or any(users.get(c) for c in order.cores):
                continue
            del orders[seq]
            started = True
            start(order)
            if all(users.get(c) for c in freed):
                break  # what is left on these cores needs one of them
        return started


@dataclass(slots=True)
class Running:
    order: ProcessOrder
    pid: int
    popen: subprocess.Popen[bytes] | None  # only when started through Popen (rlimits, no thread cwd)
    started: float  # wall clock
    started_mono: float
    env_file: str | None = None
    env: dict[str, str] | None = None  # a pre process's environment before its script ran
    reason: str | None = None  # why the agent signalled it (walltime, canceled, ...)
    peak_tree_rss: int = 0
    tree_rss: int = 0  # its tree's RSS at the last sample (the node's Utilized memory, virtual nodes)
    start_event: TaskEvent | None = None  # its ``started`` event, which its exit makes redundant (_finish)
    tag: int = 0  # numbers the agent's starts: the mark its descendants inherit (agent.trees)
    #: Signals its process group through the helper that reaps it (agent.chaining); None: the agent's child
    signal: Callable[[int], None] | None = None

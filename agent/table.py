"""The records an engine's threads share: a process's row in the table (its ref is the wire's
``ProcessRef``, the events it produces the wire's :class:`~pilot.wire.messages.TaskEvent`).

Apart from the engines (processes, simulated) so that the spawner and reaper modules can build and read
them without importing the engine that owns the table. A :class:`Running` row is written by the spawner
that starts its process and read under the engine's lock by everyone else; only its ``reason`` (the loop,
when it signals the process) and ``peak_tree_rss`` (the sampler) change after.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from pilot.model.process_order import ProcessOrder
from pilot.wire.messages import ProcessRef, TaskEvent


def take_waiting(waiting: list[ProcessOrder], ref: ProcessRef) -> ProcessOrder | None:
    """Remove and return the order of ``ref`` from orders that wait for their cores (a KILL or a
    WITHDRAW of one not started), or None when none waits."""
    for i, order in enumerate(waiting):
        if (order.job_id, order.slot) == ref:
            return waiting.pop(i)
    return None


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

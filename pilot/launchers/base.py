"""The launcher interface: how a placed job's ranks become processes on the agents.

``single`` starts one process that owns all the job's slots; ``multiple`` one process per rank;
``mpirun`` and ``srun`` (later) one launching process that starts the ranks itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from pilot.model.job_description import JobDescription
from pilot.model.process_order import ProcessOrder
from pilot.model.sss.execution import RlimitSetting
from pilot.scheduler.placement import RankPlacement


@dataclass(slots=True, eq=False)
class TaskLaunch:
    """What one task runs: its description (executable, arguments, streams, environment), whether it
    truncates its output files when it starts alone (Append keeps earlier output), and its limits."""

    description: JobDescription
    truncate: bool = True
    rlimits: tuple[RlimitSetting, ...] = ()


_NO_TASKS: Mapping[int, TaskLaunch] = MappingProxyType({})


@dataclass(slots=True, eq=False)
class GroupLaunch:
    """How one task group is launched: its launcher, what its tasks run (a task may run its own
    launch), and whether its processes are told their group and task (PILOT_TASK_GROUP, PILOT_TASK_ID)."""

    launcher: str
    template: TaskLaunch
    tasks: Mapping[int, TaskLaunch] = field(default_factory=lambda: _NO_TASKS)
    labelled: bool = False
    #: Where the request named its launcher, for messages ("JobSpec.launcher").
    named_by: str = "JobSpec.launcher"

    def task(self, index: int) -> TaskLaunch:
        return self.tasks.get(index, self.template)


@dataclass(slots=True)
class PlannedProcess:
    node: str
    order: ProcessOrder
    #: Indices into the job's ranks whose slots this process holds; released when it exits.
    holds: list[int]
    #: Its process id on the node, once the agent reported it started (SSS Task Process).
    pid: int | None = None
    #: Its order as sent (msgpack), once dispatched: what the journal keeps of it.
    packed: bytes | None = None


class Launcher(ABC):
    name: ClassVar[str]
    #: The LRM kind whose allocation this launcher needs (srun: slurm), or None for any.
    needs_lrm: ClassVar[str | None] = None

    @abstractmethod
    def plan(
        self,
        *,
        job_id: str,
        description: JobDescription,
        ranks: list[RankPlacement],
        hosts: list[str],
        environment: dict[str, str] | None,
        launches: Sequence[TaskLaunch] | None = None,
    ) -> list[PlannedProcess]:
        """Process orders for the rank phase. ``environment`` holds what the job's pre_launch script
        set (applied over each node's own environment), or None when there was none. ``launches``:
        what each rank runs when its task has a launch of its own (one process per rank only)."""


def rank_order(
    *,
    job_id: str,
    slot: int,
    description: JobDescription,
    cores: list[int],
    gpus: list[int],
    hosts: list[str],
    environment: dict[str, str] | None,
    truncate: bool,
) -> ProcessOrder:
    d = description
    # Positional, in field order (checked by tests/test_wire_messages.py): one order per task, and a
    # keyword call of 24 names costs more than building the rest of it.
    return ProcessOrder(
        job_id, slot, "rank", d.executable, d.arguments, d.environment, environment or {}, [],
        d.inherit_environment, job_directory(d), d.stdin_path, d.stdout_path,
        d.stderr_path, truncate, cores, gpus, d.duration,
        {"PILOT_JOB_ID": job_id, "PILOT_RANK": str(slot), "PILOT_SIZE": str(len(hosts))},
        hosts, None, False, [], [], False,
    )  # fmt: skip


def job_directory(d: JobDescription) -> str:
    """The job's working directory: as given, else the directory the client submitted from."""
    return d.directory or d.submit_directory or ""

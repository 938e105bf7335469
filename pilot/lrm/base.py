"""The LRM-executor interface: acquire an allocation, follow its state, release it.

An LRM executor knows one batch system. It does not place tasks and does not know launchers: it
submits a pilot job whose payload starts one agent per node (``AllocationRequest.agent_argv``).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

from pilot.model.node import NodeConfigured


class AllocationState(Enum):
    QUEUED = "queued"
    STARTING = "starting"
    ACTIVE = "active"
    ENDING = "ending"
    DONE = "done"
    FAILED = "failed"

    @property
    def final(self) -> bool:
        return self in (AllocationState.DONE, AllocationState.FAILED)


@dataclass(slots=True)
class AllocationRequest:
    nodes: int
    walltime: float | None
    agent_argv: list[str]
    agent_env: dict[str, str]
    workdir: Path
    #: Added to every node name of this allocation (``@a2``), so two allocations sharing a host keep
    #: distinct nodes; empty for the first. Agents add it themselves (``PILOT_AGENT_NODE_SUFFIX``).
    node_suffix: str = ""


@dataclass(slots=True, eq=False)
class Allocation:
    native_id: str
    lrm: str
    state: AllocationState
    nodes: int
    #: Nodes as the LRM knows them before agents register (used to refuse impossible jobs early).
    expected_nodes: list[NodeConfigured] = field(default_factory=list)
    message: str = ""
    submitted: float = field(default_factory=time.time)
    started: float | None = None
    walltime: float | None = None
    #: Node names as the batch system lists them once the allocation runs (agents register under these).
    hosts: list[str] = field(default_factory=list)
    #: The batch system's own state word and reason (``PENDING``/``Priority``), shown as they are.
    native_state: str = ""
    reason: str = ""
    #: The batch job's exit code once it has ended, when the batch system tells it.
    exit_code: int | None = None
    #: What this LRM executor needs to re-attach to the allocation from a restarted daemon (journaled).
    detail: dict[str, Any] = field(default_factory=dict)

    def to_status(self) -> dict[str, Any]:
        remaining = None
        if self.started is not None and self.walltime is not None:
            remaining = max(0.0, self.started + self.walltime - time.time())
        return {
            "lrm": self.lrm,
            "native_id": self.native_id,
            "state": self.state.value,
            "nodes": self.nodes,
            "message": self.message,
            "submitted": self.submitted,
            "started": self.started,
            "walltime": self.walltime,
            "remaining": remaining,
            "hosts": self.hosts,
            "native_state": self.native_state,
            "reason": self.reason,
            "exit_code": self.exit_code,
        }


class LrmExecutor(ABC):
    kind: ClassVar[str]
    #: PSI/J job fields this batch system's allocations have an option for: field -> option key (Slurm:
    #: ``queue_name`` -> ``partition``). A job naming one runs only in allocations of sites whose option
    #: holds that value.
    job_fields: ClassVar[dict[str, str]] = {}

    def __init__(self, *, options: dict[str, Any], source: str, table: str = "allocation") -> None:
        self.options = options
        self.source = source
        #: The config table the options come from (``allocation``, ``sites.NAME``): errors name keys there.
        self.table = table

    def offers(self, field: str) -> str | None:
        """The value this site's allocations have for a PSI/J job field (``queue_name``, ...), or None."""
        key = self.job_fields.get(field)
        opts: dict[str, Any] = getattr(self, "opts", {})
        value = opts.get(key) if key is not None else None
        return str(value) if value else None

    def validate(self, *, nodes: int) -> None:
        """Raise ConfigError for a request this LRM can never satisfy, before anything is started.
        Most batch systems only answer at submission, so the default accepts everything."""
        return None

    @abstractmethod
    async def submit(self, request: AllocationRequest) -> Allocation:
        """Ask for the allocation; returns at once with its native id and first state. A refusal by the
        batch system (bad partition, no such account) comes back as a FAILED allocation whose
        ``message`` carries the batch system's own error, not as an exception."""

    @abstractmethod
    async def poll(self, allocations: Sequence[Allocation]) -> None:
        """Refresh the state of every allocation in one query (never one call per allocation).
        May be called often: batch executors rate-limit themselves (``poll_interval``)."""

    @abstractmethod
    async def cancel(self, allocation: Allocation) -> None:
        """Release the allocation and end whatever still runs in it."""

    async def node_lost(self, allocation: Allocation, node: str) -> None:
        """The agent of ``node`` was declared lost: whatever it left running there may be ended. A batch
        system ends a lost node's processes with the node (or the allocation), so the default does nothing."""
        return None

    async def reattach(self, allocation: Allocation) -> None:
        """Take over an allocation a previous daemon acquired (recovered from its journal), so that poll
        and cancel work on it as on one this executor submitted. Batch jobs are found by their native
        id, so the default just polls it."""
        await self.poll([allocation])

"""The daemon's record of one job: its description, state, phase, and its current attempt."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from pilot.core.phase import Phase
from pilot.launchers.base import PlannedProcess
from pilot.model.job_description import JobDescription
from pilot.model.job_state import JobState
from pilot.request import Request
from pilot.scheduler.distribution import JobPlacement
from pilot.scheduler.placement import RankPlacement


@dataclass(slots=True)
class ProcessResult:
    node: str
    role: str
    exit_code: int | None = None
    signal: int | None = None
    message: str | None = None  # spawn failure, loss of node
    reason: str | None = None  # why the agent signalled it (walltime, canceled, ...)
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.message is None and self.exit_code == 0


#: What an attempt holds before it is placed: shared empty, immutable values (a queued job's attempt
#: holds no list or dict of its own; the first write makes them).
_NO_PROCESSES: Final[Mapping[int, Any]] = MappingProxyType({})


@dataclass(slots=True, eq=False)
class Attempt:
    """One placement of a job and what came of it. A job placed afresh (requeued after a lost node,
    or given back unstarted) gets a new one: nothing of the last one can leak into the next."""

    #: Re-runs after losing a node (restartable jobs); a withdrawal keeps the number (nothing ran).
    number: int = 0
    ranks: Sequence[RankPlacement] = ()
    #: Which task of which group holds each rank, and the per-job consumables taken (task group
    #: requests); None for alike processes placed on slots alone.
    placement: JobPlacement | None = None
    taken: list[bool] | tuple[()] = ()  # per rank: its slots are still taken
    #: slot -> plan, while outstanding (written through :meth:`add_process` and :meth:`pop_process`).
    processes: Mapping[int, PlannedProcess] = field(default_factory=lambda: _NO_PROCESSES)
    #: slot -> what came of it (written through :meth:`add_result`).
    results: Mapping[int, ProcessResult] = field(default_factory=lambda: _NO_PROCESSES)
    environment: dict[str, str] | None = None  # what pre_launch set
    unset: Sequence[str] = ()  # what pre_launch unset
    started: float | None = None
    ended: float | None = None

    def add_process(self, slot: int, plan: PlannedProcess) -> None:
        processes = self.processes if isinstance(self.processes, dict) else {}
        processes[slot] = plan
        self.processes = processes

    def pop_process(self, slot: int) -> PlannedProcess:
        processes = self.processes if isinstance(self.processes, dict) else dict(self.processes)
        plan = processes.pop(slot)
        self.processes = processes
        return plan

    def add_result(self, slot: int, result: ProcessResult) -> None:
        results = self.results if isinstance(self.results, dict) else {}
        results[slot] = result
        self.results = results


@dataclass(slots=True, eq=False)
class JobRecord:
    id: str
    description: JobDescription
    submitted: float = field(default_factory=time.time)
    state: JobState = JobState.QUEUED
    phase: Phase = Phase.QUEUED
    message: str | None = None
    exit_code: int | None = None
    #: What its processes reported, once it ended (None until then: a queued job holds no dict).
    metadata: dict[str, Any] | None = None
    state_time: float = field(default_factory=time.time)
    run: Attempt = field(default_factory=Attempt)
    cancel_reason: str | None = None
    closing: bool = False  # stopped because the allocation's walltime was ending
    #: How many times it was placed (each placement's orders carry their own process job id).
    placements: int = 0
    #: Client connections that follow its statuses (ZeroMQ routing identities): almost always one, so a
    #: tuple (a set of one costs four times its size, for every job queued).
    subscribers: tuple[bytes, ...] = ()
    #: What it asks for, in the one shape every language compiles to (None: the plain request of
    #: ``description``, made when the record is).
    request: Request = None  # type: ignore[assignment]
    #: Resolved dependency edges, as the journal keeps them: [[condition, code, [job ids]], ...].
    edges: list[Any] | None = None
    user_hold: bool = False  # <Hold>: waits until 'pilot release'
    #: What the journal held beside the description (a document, edges, Hold): rebuilt on resume.
    journaled: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.request is None:
            self.request = Request.of_description(self.description)

    @property
    def category(self) -> Any:
        """Its scheduling category: identical requests are placed alike."""
        return self.request.category

    @property
    def final(self) -> bool:
        return self.state.final

    @property
    def proc_id(self) -> str:
        """The job id its processes carry: the first placement's are the job's id, each later placement's
        (a re-run after a lost node, or an order taken back and placed again) ``<id>~<n>``. A late event,
        a replay or a kill of an earlier placement can so never be taken for one of the current one."""
        n = self.placements
        return f"{self.id}~{n - 1}" if n > 1 else self.id

    def status(self) -> list[Any]:
        """The wire form of the job's current status: [id, state, time, exit_code, message, metadata]."""
        return [self.id, self.state._value_, self.state_time, self.exit_code, self.message, self.metadata or None]

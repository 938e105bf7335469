"""The one job shape every language compiles to, and the only one the core knows.

A front-end (:mod:`pilot.frontends`) turns a submitted PSI/J description or SSS document into
:class:`Request` objects: the job-level description (name, walltime, pre/post-launch scripts), its task
groups (what each task runs and which launcher starts it), how placement sees it, its dependencies and
Hold, and what the journal keeps to rebuild it. Placement sees one of two shapes:

- ``slots``: one group of alike processes holding cores, GPUs and memory (exact slot placement, the
  fast path, which may also wait behind a busy core);
- ``resolved``: task groups with node requirements, consumables, distribution rules and variants
  (matched against the nodes' attributes).

Which path places a job follows from its shape; nothing downstream asks which language it came in.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Final

from pilot.launchers import LAUNCHERS
from pilot.launchers.base import GroupLaunch, TaskLaunch
from pilot.model.job_description import JobDescription, ResourceRequest
from pilot.model.sss.job import Dependency, Job
from pilot.scheduler.dag import NewJob
from pilot.scheduler.distribution import JobRequest

_NEEDS: Final = {name: launcher.needs_lrm for name, launcher in LAUNCHERS.items()}


@dataclass(slots=True, eq=False)
class Request:
    description: JobDescription
    groups: tuple[GroupLaunch, ...]
    #: Jobs with equal categories are placed alike (the queue keeps one head per category).
    category: Hashable
    #: Exactly one of the two placement shapes is set.
    slots: ResourceRequest | None = None
    resolved: JobRequest | None = None
    #: Names the job in messages (an SSS element path); None: "job <id>".
    where: str | None = None
    #: What dependency designators find it by (its name, its submitter's own id), and what it waits for.
    name: str | None = None
    local_id: str | None = None
    dependencies: tuple[Dependency, ...] = ()
    hold: bool = False
    #: What the journal keeps of it (the front-end's form), to rebuild it after a restart.
    entry: dict[str, Any] = field(default_factory=dict)
    #: The job as an SSS Job for 'pilot show --xml' when it was written as one; None: made from the description.
    shown: Job | None = None

    @property
    def needs_lrm(self) -> str | None:
        """The batch system its launchers need (srun: slurm), so it is placed only there; None for any."""
        for g in self.groups:
            needs = _NEEDS.get(g.launcher)
            if needs is not None:
                return needs
        return None

    @classmethod
    def of_description(cls, description: JobDescription, *, entry: dict[str, Any] | None = None) -> Request:
        """A plain job: one group of ``description.resources.process_count`` alike processes."""
        return cls(
            description,
            (GroupLaunch(description.launcher, TaskLaunch(description)),),
            description.resources.category,
            slots=description.resources,
            name=description.name,
            entry=entry if entry is not None else {},
        )

    def new_job(self, job_id: str) -> NewJob:
        return NewJob(job_id, self.name, self.local_id, self.dependencies, self.where or f"job {job_id}")


@dataclass(slots=True)
class Submission:
    """What one submitted entry compiled to: its jobs (accepted together or not at all), the reader's
    warnings, and whether it was a document (answered with a list of ids) or a single job."""

    requests: list[Request]
    warnings: list[str] = field(default_factory=list)
    document: bool = False


__all__ = ["GroupLaunch", "Request", "Submission", "TaskLaunch"]

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
from pilot.model.staging import Staging
from pilot.scheduler.dag import NewJob
from pilot.scheduler.distribution import JobRequest

_NEEDS: Final = {name: launcher.needs_lrm for name, launcher in LAUNCHERS.items()}


#: The PSI/J custom attribute that orders the queue (higher first), as SSS <Priority> does.
PRIORITY: Final = "pilot.priority"
#: A job's priority is a whole number within +-this (SSS <Priority>, PSI/J ``pilot.priority``).
PRIORITY_LIMIT: Final = 1_000_000_000


class Request:
    """One job as every part after its front-end sees it. Thousands of them wait in a queue, so it
    holds no more than it must: a plain job's task group is made from its description when first
    asked for (at placement), not kept while it waits."""

    __slots__ = (
        "_groups",
        "dependencies",
        "description",
        "hold",
        "local_id",
        "name",
        "not_before",
        "priority",
        "resolved",
        "shown",
        "slots",
        "staging",
        "start_within",
        "targets",
        "where",
    )

    def __init__(
        self,
        description: JobDescription,
        groups: tuple[GroupLaunch, ...] | None = None,
        *,
        slots: ResourceRequest | None = None,
        resolved: JobRequest | None = None,
        where: str | None = None,
        name: str | None = None,
        local_id: str | None = None,
        dependencies: tuple[Dependency, ...] = (),
        hold: bool = False,
        shown: Job | None = None,
        priority: int = 0,
        not_before: float | None = None,
        start_within: float | None = None,
        staging: Staging | None = None,
        targets: tuple[Target | None, ...] | None = None,
    ) -> None:
        if (slots is None) == (resolved is None):
            raise ValueError("a request has exactly one placement shape: slots or resolved")
        if groups is None and slots is None:
            raise ValueError("a request of task groups names its groups")
        self.description = description
        self._groups = groups
        #: Alike processes holding cores, GPUs and memory (slot placement, the fast path) ...
        self.slots = slots
        #: ... or task groups with requirements, consumables, distribution and variants (matching).
        self.resolved = resolved
        #: Names the job in messages (an SSS element path); None: "job <id>".
        self.where = where
        #: What dependency designators find it by (its name, its submitter's own id), and what it waits for.
        self.name = name
        self.local_id = local_id
        self.dependencies = dependencies
        self.hold = hold
        #: The job as an SSS Job for 'pilot show --xml' when it was written as one; None: made from the description.
        self.shown = shown
        #: Queue order: higher first, first come first served within one priority (SSS <Priority>,
        #: PSI/J ``pilot.priority``).
        self.priority = priority
        #: Not started before this time (seconds since the epoch; JRDL jobStartTime) ...
        self.not_before = not_before
        #: ... or FAILED when not started this many seconds after its submission (JRDL jobStartBefore).
        self.start_within = start_within
        #: Files in before its processes, out after, removed last (any language's; see pilot.model.staging).
        self.staging = staging if staging is not None else description.staging
        #: Co-allocation (JRDL subjobs naming a resourceManagerContact or jobManagerType): per task group,
        #: where it must run (None: any allocation); each group is placed inside one allocation, all groups
        #: at once or none. None: the whole job runs inside one allocation.
        self.targets = targets

    @classmethod
    def of_description(cls, description: JobDescription) -> Request:
        """A plain job: one group of ``description.resources.process_count`` alike processes."""
        return cls(description, slots=description.resources, name=description.name)

    @property
    def groups(self) -> tuple[GroupLaunch, ...]:
        """Its task groups: what each task runs and which launcher starts it."""
        groups = self._groups
        if groups is None:
            d = self.description
            groups = self._groups = (GroupLaunch(d.launcher, TaskLaunch(d)),)
        return groups

    @property
    def category(self) -> Hashable:
        """Jobs of equal categories are placed alike: the queue keeps one head per category. A job that
        names a queue, project or reservation may run in fewer allocations: its own category."""
        if self.slots is not None:
            category: Hashable = self.slots.category
        else:
            assert self.resolved is not None
            category = self.resolved.category
        if self.targets is not None:
            category = (category, self.targets)
        d = self.description
        if d.queue_name is None and d.project_name is None and d.reservation_id is None:
            return category
        return (category, d.queue_name, d.project_name, d.reservation_id)

    def launchers(self) -> list[tuple[str, str]]:
        """Each launcher it needs, with where the request named it (for messages)."""
        if self._groups is None:
            return [(self.description.launcher, "JobSpec.launcher")]
        return [(g.launcher, g.named_by) for g in self._groups]

    @property
    def needs_lrm(self) -> str | None:
        """The batch system its launchers need (srun: slurm), so it is placed only there; None for any."""
        if self._groups is None:
            return _NEEDS.get(self.description.launcher)
        for g in self._groups:
            needs = _NEEDS.get(g.launcher)
            if needs is not None:
                return needs
        return None

    def new_job(self, job_id: str) -> NewJob:
        return NewJob(job_id, self.name, self.local_id, self.dependencies, self.where or f"job {job_id}")


#: jobManagerType's job managers as the batch system kinds of this pilot's sites: ``fork`` runs on this
#: machine (the local LRM), ``pbs`` in a PBS site.
JOB_MANAGER_LRMS: Final = {"fork": "local", "pbs": "pbs"}


@dataclass(frozen=True, slots=True)
class Target:
    """Where one task group of a co-allocated job runs: a site of the pilot (its config name), one of its
    allocations (``a2``), and/or the kind of batch system (``local``, ``pbs``). ``named`` says how the
    document named it, for messages; it does not take part in comparisons."""

    site: str | None = None
    allocation: str | None = None
    lrm: str | None = None
    named: str = field(default="", compare=False)

    def admits(self, *, site: str, allocation: str, lrm: str) -> bool:
        return (
            (self.site is None or self.site == site)
            and (self.allocation is None or self.allocation == allocation)
            and (self.lrm is None or self.lrm == lrm)
        )


@dataclass(slots=True)
class Submission:
    """What one submitted entry compiled to: its jobs (accepted together or not at all), what the journal
    keeps of each (the front-end's own form, to rebuild it after a restart), the reader's warnings, and
    whether it was a document (answered with a list of ids) or a single job."""

    requests: list[Request]
    entries: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    document: bool = False


__all__ = ["JOB_MANAGER_LRMS", "GroupLaunch", "Request", "Submission", "Target", "TaskLaunch"]

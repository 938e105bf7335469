"""SSS jobs in the daemon: a submission (a Job or JobGroup as SSS XML) made into what scheduling,
launching and ``pilot show`` need, checked whole before anything is accepted.

A TaskGroup's tasks are processes of their own (one per task, as the spec's elaborate example
shows them), each on the node and cores placement gave it; an ``<Extension type="PSIJ"
name="Launcher">`` of ``mpirun`` or ``srun`` makes the group one parallel launch instead. A task with
its own ``<Task>`` element runs what that element says (executable, arguments, streams, limits).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final

from pilot.formats import read_job, write_job
from pilot.model.job_description import JobDescription, ResourceRequest
from pilot.model.sss import Dependency, EffectiveJob, EffectiveTaskGroup, Job, JobGroup, SssError, effective_jobs
from pilot.model.sss.execution import RlimitSetting, Streams, rlimit_settings, streams
from pilot.model.sss.job import merge
from pilot.model.sss.psij import description
from pilot.scheduler.cluster import Cluster
from pilot.scheduler.dag import NewJob
from pilot.scheduler.distribution import JobPlacement, JobRequest, resolve_job

#: Launchers a task group may name; ``multiple`` (one process per task) when it names none.
GROUP_LAUNCHERS: Final = ("multiple", "mpirun", "srun")


@dataclass(frozen=True, slots=True)
class TaskLaunch:
    """What one task (or every task without its own Task element) runs."""

    description: JobDescription
    streams: Streams
    rlimits: tuple[RlimitSetting, ...] = ()

    @property
    def truncate(self) -> bool:
        """Append keeps earlier output; a file several tasks share is appended to by each."""
        return not (self.streams.stdout_append or self.streams.stderr_append)


@dataclass(frozen=True, slots=True)
class GroupLaunch:
    launcher: str
    template: TaskLaunch
    tasks: dict[int, TaskLaunch] = field(default_factory=dict)

    def task(self, index: int) -> TaskLaunch:
        return self.tasks.get(index, self.template)


@dataclass(slots=True, eq=False)
class SssJob:
    """The daemon's SSS side of one job: what was submitted, its resolved request, how each group
    launches, its dependencies, and (once placed) which task runs where."""

    shown: Job  # as submitted, the JobGroup's JobDefaults applied: what 'pilot show --xml' writes
    effective: EffectiveJob
    request: JobRequest
    groups: tuple[GroupLaunch, ...]
    dependencies: tuple[Dependency, ...] = ()
    hold: bool = False
    placement: JobPlacement | None = None

    @property
    def xml(self) -> str:
        """The job alone, as the journal keeps it (reloaded after a restart with :func:`prepare`)."""
        return write_job(self.shown)

    def new_job(self, job_id: str) -> NewJob:
        return NewJob(job_id, self.effective.name, self.effective.id, self.dependencies, self.effective.where)


def read_submission(data: str | bytes) -> tuple[list[Job], list[str]]:
    """The jobs of an SSS Job or JobGroup document (JobDefaults applied to each), and the reader's
    warnings (``awarenessPolicy="Warn"``). Raises :class:`SssError` naming the line and element."""
    result = read_job(data)
    obj = result.value
    if isinstance(obj, JobGroup):
        jobs = []
        for j in obj.jobs:
            if obj.job_defaults is None:
                jobs.append(j)
                continue
            d = obj.job_defaults
            jobs.append(
                Job(
                    merge(d.properties, j.properties),
                    j.task_groups or list(d.task_groups),
                    j.task_group_defaults or d.task_group_defaults,
                    dict(j.attributes),
                    j.line,
                )
            )
        if not jobs:
            raise SssError("has no Job: nothing to run", element="JobGroup")
        return jobs, list(result.warnings)
    if isinstance(obj, Job):
        return [obj], list(result.warnings)
    raise SssError("is not a Job or JobGroup", element=type(obj).__name__)


def prepare(job: Job, cluster: Cluster, *, where: str | None = None) -> SssJob:
    """Everything the daemon needs of one job, or :class:`SssError` naming what cannot run."""
    eff = effective_jobs(job)[0]
    if where is not None:
        eff = dataclasses.replace(eff, where=where)
    request = resolve_job(eff, cluster)
    groups = tuple(_group(eff, tg) for tg in eff.task_groups)
    props = eff.properties
    return SssJob(
        shown=job,
        effective=eff,
        request=request,
        groups=groups,
        dependencies=tuple(props.dependencies),
        hold=bool(props.holds),
    )


def _group(job: EffectiveJob, tg: EffectiveTaskGroup) -> GroupLaunch:
    launcher = tg.properties.extension("Launcher") or "multiple"
    if launcher not in GROUP_LAUNCHERS:
        raise SssError(
            f'Extension name="Launcher" is {launcher!r}; a TaskGroup launches with one of {", ".join(GROUP_LAUNCHERS)}',
            element=tg.where,
        )
    template = _launch(job, dataclasses.replace(tg, properties=tg.task_template), tg.where)
    tasks: dict[int, TaskLaunch] = {}
    for t in tg.tasks:
        if launcher != "multiple":
            raise SssError(
                f"has Task elements of their own, which a {launcher!r} launch cannot honour (it starts every task "
                "alike); use the default launcher (one process per task)",
                element=t.where,
            )
        tasks[t.index] = _launch(job, dataclasses.replace(tg, properties=t.properties), t.where)
    return GroupLaunch(launcher, template, tasks)


def _launch(job: EffectiveJob, tg: EffectiveTaskGroup, where: str) -> TaskLaunch:
    p = tg.properties
    if not p.executable:
        raise SssError("names no Executable: give one in the Job, TaskGroup or Task", element=where)
    s = streams(p, where=where)
    d = description(job, tg, resources=ResourceRequest())  # placement comes from the request, not these
    stdout = None if s.stdout_closed else s.stdout
    stderr = None if s.stderr_closed else s.stderr
    if s.merge == "stdout":
        stderr = stdout
    elif s.merge == "stderr":
        stdout = stderr
    d = dataclasses.replace(
        d,
        stdin_path=None if s.stdin_closed else s.stdin,
        stdout_path=stdout,
        stderr_path=stderr,
        launcher="multiple",
    )
    return TaskLaunch(d, s, tuple(rlimit_settings(p.resource_limits, where=where)))


def placement_wire(placement: JobPlacement) -> list[Any]:
    """The placement as the journal keeps it: which variant, per task (group, index), and per-job amounts."""
    return [
        placement.variant,
        [[t.group, t.task, list(t.amounts)] for t in placement.tasks],
        [[level, [list(a) for a in amounts]] for level, amounts in placement.per_job],
    ]


__all__ = [
    "GROUP_LAUNCHERS",
    "GroupLaunch",
    "SssJob",
    "TaskLaunch",
    "placement_wire",
    "prepare",
    "read_submission",
]

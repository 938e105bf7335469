"""The SSS front-end: a Job or JobGroup document compiled to :class:`~pilot.request.Request` objects,
every job checked whole before any is accepted.

A TaskGroup's tasks are processes of their own (one per task, as the spec's elaborate example
shows them), each on the node and cores placement gave it; an ``<Extension type="PSIJ"
name="Launcher">`` of ``mpirun`` or ``srun`` makes the group one parallel launch instead. A task with
its own ``<Task>`` element runs what that element says (executable, arguments, streams, limits).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from pilot.formats import read_job, write_job
from pilot.launchers.base import GroupLaunch, TaskLaunch
from pilot.model.job_description import DescriptionError, JobDescription, ResourceRequest
from pilot.model.sss import EffectiveJob, EffectiveTaskGroup, Job, JobGroup, SssError, effective_jobs
from pilot.model.sss.execution import rlimit_settings, streams
from pilot.model.sss.job import merge
from pilot.model.sss.psij import description
from pilot.request import PRIORITY_LIMIT, Request, Submission
from pilot.scheduler.cluster import Cluster
from pilot.scheduler.distribution import resolve_job

#: Where an SSS submission carries its document (in SUBMIT and in the journal).
DOCUMENT_KEY: Final = "sss"

#: Launchers a task group may name; ``multiple`` (one process per task) when it names none.
GROUP_LAUNCHERS: Final = ("multiple", "mpirun", "srun")


def read_submission(data: str | bytes) -> tuple[list[Job], list[str]]:
    """The jobs of an SSS Job or JobGroup document (JobDefaults applied to each), and the reader's
    warnings (``awarenessPolicy="Warn"``). Raises :class:`SssError` naming the line and element."""
    result = read_job(data, submitted=True)
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


def compile_entry(raw: dict[str, Any], *, cluster: Cluster) -> Submission:
    """An SSS submission ``{"sss": document}``: every job of it, resolved against this pilot's nodes."""
    document = raw.get(DOCUMENT_KEY)
    if not isinstance(document, str | bytes):
        raise DescriptionError("an SSS submission carries its XML document as text under 'sss'")
    jobs, warnings = read_submission(document)
    requests = [prepare(job, cluster) for job in jobs]
    entries = [{**r.description.to_wire(), DOCUMENT_KEY: write_job(job)} for r, job in zip(requests, jobs, strict=True)]
    return Submission(requests, entries, warnings, document=True)


def rebuild(description: JobDescription, extra: dict[str, Any], *, cluster: Cluster) -> Request:
    """A journaled SSS job, from the document the journal kept (its description is derived again)."""
    return prepare(read_submission(extra[DOCUMENT_KEY])[0][0], cluster)


def prepare(job: Job, cluster: Cluster) -> Request:
    """One job compiled, or :class:`SssError` naming what cannot run."""
    eff = effective_jobs(job)[0]
    resolved = resolve_job(eff, cluster)
    groups = tuple(_group(eff, tg) for tg in eff.task_groups)
    props = eff.properties
    description = dataclasses.replace(groups[0].template.description, launcher="single")
    return Request(
        description,
        groups,
        resolved=resolved,
        where=eff.where,
        name=eff.name,
        local_id=eff.id,
        dependencies=tuple(props.dependencies),
        hold=bool(props.holds),
        shown=job,
        priority=_priority(props.integer("Priority"), where=eff.where),
    )


def _priority(value: int | None, *, where: str) -> int:
    if value is None:
        return 0
    if not -PRIORITY_LIMIT <= value <= PRIORITY_LIMIT:
        raise SssError(f"<Priority> must be from {-PRIORITY_LIMIT} to {PRIORITY_LIMIT}, not {value}", element=where)
    return value


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
    return GroupLaunch(launcher, template, tasks, labelled=True, named_by=f'{tg.where}: Extension name="Launcher"')


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
    truncate = not (s.stdout_append or s.stderr_append)  # Append keeps earlier output
    return TaskLaunch(d, truncate, tuple(rlimit_settings(p.resource_limits, where=where)))


__all__ = ["DOCUMENT_KEY", "GROUP_LAUNCHERS", "compile_entry", "prepare", "read_submission", "rebuild"]

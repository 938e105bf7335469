"""A PSI/J job (:class:`JobDescription`) as an SSS Job with one TaskGroup, and back, with no loss.

What SSS has a name for maps onto it (Executable, Arguments, InitialWorkingDirectory, Environment
with ``export`` for ``inherit_environment``, InputFile/OutputFile/ErrorFile, Queue, Project,
Reservation, Duration, TaskCount, Processors, NodeCount, TasksPerNode, Memory, a GPU Resource);
what it has not is carried in ``<Extension>`` elements (the spec's means for it): Launcher,
PreLaunch, PostLaunch, SubmitDirectory, Exclusive, and each custom attribute as JSON
(``type="CustomAttribute"``). :func:`from_sss` inverts :func:`to_sss` exactly, and refuses an SSS
job that says something a JobDescription cannot (naming the element) rather than dropping it.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Final

from pilot.model.job_description import RESTARTABLE, DescriptionError, JobDescription, ResourceRequest
from pilot.model.sss.errors import SssError
from pilot.model.sss.job import (
    EffectiveJob,
    EffectiveTaskGroup,
    Job,
    Properties,
    Property,
    TaskGroup,
    amount,
    effective_jobs,
)

_JOB_NAMES: Final = frozenset(
    {
        "Name",
        "Executable",
        "Arguments",
        "InitialWorkingDirectory",
        "Environment",
        "InputFile",
        "OutputFile",
        "ErrorFile",
        "Queue",
        "Project",
        "Reservation",
        "Extension",
    }
)
_GROUP_NAMES: Final = frozenset({"TaskCount", "Processors", "NodeCount", "TaskDistribution", "Memory", "Resource"})
_EXTENSIONS: Final = frozenset({"Launcher", "PreLaunch", "PostLaunch", "SubmitDirectory", "Exclusive"})


def _ext(name: str, value: object) -> Property:
    return Property.of("Extension", value, name=name, type="PSIJ")


def to_sss(d: JobDescription) -> Job:
    """``d`` as an SSS Job with exactly one TaskGroup."""
    items: list[Property] = []
    if d.name is not None:
        items.append(Property.of("Name", d.name))
    items.append(Property.of("Executable", d.executable))
    if d.arguments:
        items.append(Property.of("Arguments", shlex.join(d.arguments)))
    if d.directory is not None:
        items.append(Property.of("InitialWorkingDirectory", d.directory))
    if d.environment or not d.inherit_environment:
        variables = tuple(Property.of("Variable", v, name=k) for k, v in d.environment.items())
        items.append(Property.of("Environment", "", *variables, export=d.inherit_environment))
    for tag, path in (("InputFile", d.stdin_path), ("OutputFile", d.stdout_path), ("ErrorFile", d.stderr_path)):
        if path is not None:
            items.append(Property.of(tag, path))
    for tag, value in (("Queue", d.queue_name), ("Project", d.project_name), ("Reservation", d.reservation_id)):
        if value is not None:
            items.append(Property.of(tag, value))
    if d.launcher != "single":
        items.append(_ext("Launcher", d.launcher))
    hooks = (("PreLaunch", d.pre_launch), ("PostLaunch", d.post_launch), ("SubmitDirectory", d.submit_directory))
    for name, value in hooks:
        if value is not None:
            items.append(_ext(name, value))
    if d.resources.exclusive_node_use:
        items.append(_ext("Exclusive", True))
    for k, v in d.custom_attributes.items():
        items.append(Property.of("Extension", json.dumps(v), name=k, type="CustomAttribute"))
    requested = [Property.of("Duration", d.duration)] if d.duration is not None else None
    r = d.resources
    tg: list[Property] = [Property.of("TaskCount", r.process_count)]
    tg.append(Property.of("Processors", r.process_count * r.cpu_cores_per_process))
    if r.node_count is not None:
        tg.append(Property.of("NodeCount", r.node_count))
    if r.processes_per_node is not None:
        tg.append(Property.of("TaskDistribution", r.processes_per_node, type="TasksPerNode"))
    if r.memory_per_process:
        tg.append(Property.of("Memory", r.memory_per_process, units="B"))
    if r.gpu_cores_per_process:
        tg.append(Property.of("Resource", r.gpu_cores_per_process, name="GPU"))
    return Job(Properties.of(*items, requested=requested), [TaskGroup(Properties.of(*tg))])


def from_sss(job: Job) -> JobDescription:
    """The JobDescription :func:`to_sss` made ``job`` from. Raises :class:`SssError` naming what a
    JobDescription cannot hold (a second TaskGroup, a Feature, a Requested range, ...)."""
    effective = effective_jobs(job)[0]
    if len(effective.task_groups) != 1:
        raise SssError("has several TaskGroups; a PSI/J job has one", element=effective.where)
    tg = effective.task_groups[0]
    _only(effective.source.properties, _JOB_NAMES, effective.where, requested=("Duration",))
    if effective.source.task_groups:
        _only(effective.source.task_groups[0].properties, _GROUP_NAMES, tg.where, requested=())
        if effective.source.task_groups[0].tasks or effective.source.task_groups[0].task_defaults:
            raise SssError("has Task elements; a PSI/J job's processes are alike", element=tg.where)
    if effective.source.task_group_defaults is not None:
        raise SssError("has TaskGroupDefaults; a PSI/J job has one task group", element=effective.where)
    return description(effective, tg)


def _only(props: Properties, names: frozenset[str], where: str, *, requested: tuple[str, ...]) -> None:
    for p in props.items:
        if p.name not in names:
            raise SssError(f"{p.where} has no PSI/J equivalent; remove it to run this as a PSI/J job", element=where)
        if p.name == "Extension" and p.get("type") == "PSIJ" and p.get("name") not in _EXTENSIONS:
            raise SssError(f'Extension name="{p.get("name")}" is not a PSI/J field', element=where)
        if p.name == "Resource" and (p.get("name") != "GPU" or p.get("type") is not None):
            raise SssError(f'Resource name="{p.get("name")}" has no PSI/J equivalent (only GPU)', element=where)
        if p.name == "TaskDistribution" and p.get("type") != "TasksPerNode":
            raise SssError("a TaskDistribution other than TasksPerNode has no PSI/J equivalent", element=where)
    for p in props.requested or ():
        if p.name not in requested or p.get("op") not in (None, "EQ") or p.get("preference") is not None:
            raise SssError(f"Requested {p.where} has no PSI/J equivalent", element=where)
    if props.delivered:
        raise SssError("has Delivered properties; a PSI/J job description has none", element=where)


def description(
    job: EffectiveJob, tg: EffectiveTaskGroup, *, resources: ResourceRequest | None = None
) -> JobDescription:
    """The JobDescription of one (effective) task group: what the existing launchers need to start
    its tasks. ``resources`` overrides what the task group's own numbers say (e.g. a resolved variant).
    It is checked as the daemon checks a submitted job: :class:`SssError` says what cannot run."""
    p = tg.properties
    export = p.export_environment
    custom: dict[str, Any] = p.custom_attributes
    restartable = job.properties.text("Restartable")
    if restartable is not None and RESTARTABLE not in custom:
        custom = {**custom, RESTARTABLE: restartable.strip().lower() in ("true", "1")}
    duration = job.properties.duration
    d = JobDescription(
        executable=p.executable or "",
        arguments=p.arguments,
        directory=p.initial_working_directory,
        name=job.properties.name,
        inherit_environment=True if export is None else export,
        environment=p.environment,
        stdin_path=_path(p, "InputFile"),
        stdout_path=_path(p, "OutputFile"),
        stderr_path=_path(p, "ErrorFile"),
        pre_launch=p.extension("PreLaunch"),
        post_launch=p.extension("PostLaunch"),
        launcher=p.extension("Launcher") or "single",
        resources=resources if resources is not None else _resources(tg),
        duration=duration,
        queue_name=p.text("Queue"),
        project_name=p.text("Project"),
        reservation_id=p.text("Reservation"),
        custom_attributes=custom,
        submit_directory=p.extension("SubmitDirectory"),
    )
    try:
        return JobDescription.from_wire(d.to_wire())
    except DescriptionError as exc:
        raise SssError(f"cannot run as given: {exc}", element=tg.where) from None


def _path(p: Properties, name: str) -> str | None:
    r = p.first(name)
    return None if r is None else r.value


def _resources(tg: EffectiveTaskGroup) -> ResourceRequest:
    p = tg.properties
    count = p.task_count or 1
    processors = p.integer("Processors")
    cores = processors // count if processors else 1
    td = p.task_distribution
    ppn = None
    if td is not None and td.type == "TasksPerNode":
        try:
            ppn = int(td.value)
        except ValueError:
            raise SssError(f"TasksPerNode {td.value!r} is not a whole number", element=tg.where) from None
    mem = p.first("Memory")
    gpus = p.first("Resource")
    exclusive = (p.extension("Exclusive") or "").lower() in ("true", "1")
    return ResourceRequest(
        process_count=count,
        node_count=p.integer("NodeCount"),
        processes_per_node=ppn,
        cpu_cores_per_process=cores,
        gpu_cores_per_process=int(float(gpus.value)) if gpus is not None and gpus.get("name") == "GPU" else 0,
        memory_per_process=int(amount(mem)) if mem is not None else 0,
        exclusive_node_use=exclusive,
    )

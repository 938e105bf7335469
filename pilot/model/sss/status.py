"""A submitted job as it stands now, as an SSS Job: State, times, ExitCode, StatusMessage, the
Delivered resources and one Task element per placed task (node, cores, process), as the spec's
elaborate example shows them. Pure: the daemon passes what it knows, this builds the object."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from pilot.model.job_state import JobState
from pilot.model.sss.job import Job, Properties, Property, Task, TaskGroup, sss_state

#: Properties the status replaces rather than keeps from the submission.
_STATUS: Final = frozenset({"State", "ExitCode", "StatusMessage", "StartTime", "EndTime", "Id"})


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """One placed task: its task group, index in it, node, cores and GPUs, and process id once known."""

    group: int
    task: int
    node: str
    cores: Sequence[int] = ()
    gpus: Sequence[int] = ()
    process: int | None = None
    exit_code: int | None = None
    #: What its process delivered (the daemon's keys: pid, slot, wall_duration, cpu times, max_rss).
    delivered: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_entry(cls, entry: Sequence[Any]) -> TaskStatus:
        """One entry of the daemon's Delivered ``tasks``: [group, task, node, cores, gpus(, process)]."""
        g, t, n, c, gp = entry[:5]
        process = entry[5] if len(entry) > 5 and isinstance(entry[5], Mapping) else {}
        pid, code = process.get("pid"), process.get("exit_code")
        return cls(
            int(g),
            int(t),
            str(n),
            list(c),
            list(gp),
            process=pid if isinstance(pid, int) and pid > 0 else None,
            exit_code=code if isinstance(code, int) else None,
            delivered=process,
        )


@dataclass(frozen=True, slots=True)
class JobStatus:
    id: str
    state: JobState
    held: bool = False
    exit_code: int | None = None
    message: str | None = None
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    delivered: Mapping[str, Any] = field(default_factory=dict)  # the daemon's Delivered metadata
    tasks: Sequence[TaskStatus] = ()


def delivered_properties(metadata: Mapping[str, Any]) -> list[Property]:
    """The daemon's Delivered metadata (wall_duration, user/system_cpu_time, processors,
    consumption_rate, max_rss, gpus, nodes) as SSS Delivered properties."""
    out: list[Property] = []
    if metadata.get("wall_duration") is not None:
        out.append(Property.of("Duration", round(float(metadata["wall_duration"]), 3)))
    cpu = float(metadata.get("user_cpu_time") or 0) + float(metadata.get("system_cpu_time") or 0)
    if "user_cpu_time" in metadata or "system_cpu_time" in metadata:
        out.append(Property.of("CpuDuration", round(cpu, 3)))
    if metadata.get("processors"):
        rate = metadata.get("consumption_rate")
        out.append(
            Property.of(
                "Processors", int(metadata["processors"]), consumptionRate=None if rate is None else round(rate, 4)
            )
        )
    if metadata.get("max_rss"):
        out.append(Property.of("Memory", int(metadata["max_rss"]), metric="Max", units="B"))
    if metadata.get("gpus"):
        out.append(Property.of("Resource", int(metadata["gpus"]), name="GPU"))
    if metadata.get("nodes"):
        out.append(Property.of("NodeCount", len(metadata["nodes"])))
    return out


def job_with_status(job: Job, status: JobStatus) -> Job:
    """``job`` (as submitted) with its current status, Delivered and placed Task elements."""
    items = [p for p in job.properties.items if p.name not in _STATUS]
    head = [Property.of("Id", status.id), Property.of("State", sss_state(status.state, held=status.held))]
    times = (("SubmitTime", status.submit_time), ("StartTime", status.start_time), ("EndTime", status.end_time))
    for name, value in times:
        if value is not None:
            items = [p for p in items if p.name != name]
            head.append(Property.of(name, int(value)))
    if status.exit_code is not None:
        head.append(Property.of("ExitCode", status.exit_code))
    if status.message:
        head.append(Property.of("StatusMessage", status.message))
    delivered = delivered_properties(status.delivered) if status.delivered else job.properties.delivered
    props = Properties(head + items, job.properties.requested, delivered or None)
    groups = job.task_groups or [TaskGroup()]
    by_group: dict[int, list[TaskStatus]] = {}
    for t in status.tasks:
        by_group.setdefault(t.group, []).append(t)
    new_groups = []
    for gi, tg in enumerate(groups):
        placed = sorted(by_group.get(gi, []), key=lambda t: t.task)
        if not placed:
            new_groups.append(tg)
            continue
        tasks = []
        delivered_group = group_delivered(placed)
        for t in placed:
            own = tg.tasks[t.task].properties.items if t.task < len(tg.tasks) else []
            keep = [p for p in own if p.name not in ("Id", "Node", "Process", "ExitCode", "Extension")]
            items_t = [Property.of("Id", t.task), Property.of("Node", t.node)]
            if t.process is not None:
                items_t.append(Property.of("Process", t.process))
            if t.exit_code is not None:
                items_t.append(Property.of("ExitCode", t.exit_code))
            if t.cores:
                items_t.append(Property.of("Extension", ",".join(map(str, t.cores)), name="Cores", type="Placement"))
            if t.gpus:
                items_t.append(Property.of("Extension", ",".join(map(str, t.gpus)), name="GPUs", type="Placement"))
            tasks.append(Task(Properties(items_t + keep)))
        if delivered_group:
            p = tg.properties
            tg = replace(tg, properties=Properties(p.items, p.requested, delivered_properties(delivered_group)))
        new_groups.append(replace(tg, tasks=tasks))
    return Job(props, new_groups, job.task_group_defaults, dict(job.attributes), job.line)


def group_delivered(tasks: Sequence[TaskStatus]) -> dict[str, Any]:
    """A task group's Delivered, from its tasks' processes once all have ended (each process counted
    once: the tasks of one parallel launch share it); {} before."""
    if not tasks or any(not t.delivered or t.delivered.get("running") for t in tasks):
        return {}
    processes = {int(t.delivered.get("slot", -1 - i)): t.delivered for i, t in enumerate(tasks)}
    return {
        "wall_duration": max(float(d.get("wall_duration") or 0) for d in processes.values()),
        "user_cpu_time": sum(float(d.get("user_cpu_time") or 0) for d in processes.values()),
        "system_cpu_time": sum(float(d.get("system_cpu_time") or 0) for d in processes.values()),
        "max_rss": max(int(d.get("max_rss") or 0) for d in processes.values()),
        "processors": sum(len(t.cores) for t in tasks),
        "gpus": sum(len(t.gpus) for t in tasks),
        "nodes": sorted({t.node for t in tasks}),
    }

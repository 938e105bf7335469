"""The SSS job object: JobGroup, Job, TaskGroup and Task, their Defaults, Requested and Delivered.

Properties are kept as the spec writes them, one :class:`Property` per element in document order,
so nothing a submitter wrote is lost on the way back out as XML; typed accessors on
:class:`Properties` give the values the daemon acts on. Inheritance follows the spec exactly:

- Job properties in a Job override those of a sibling JobDefaults (spec 5.0);
- TaskGroup properties override a sibling TaskGroupDefaults (6.0), Task properties a TaskDefaults (7.0);
- a TaskGroup or Task may carry Job properties, which override the enclosing level's. A job without
  a TaskGroup has one implicit TaskGroup; a TaskGroup without Tasks has implicit ones.

"Override" is per property: a property is identified by its element name (plus ``name``/``type``
for Resource, ResourceLimit and Extension); every instance of that identity at the lower level
replaces every instance inherited. So ``<Environment>`` is replaced whole, not merged by variable.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Final

from pilot.model.job_state import JobState
from pilot.model.sss.errors import SssError
from pilot.model.sss.schema import RLIMITS, _norm


@dataclass(frozen=True, slots=True)
class Property:
    """One property element: its name, text, XML attributes and (for Environment) children."""

    name: str
    value: str = ""
    attributes: tuple[tuple[str, str], ...] = ()
    children: tuple[Property, ...] = ()
    line: int | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, name: str, value: object = "", /, *children: Property, **attributes: object) -> Property:
        """``Property.of("Resource", 1, name="License", type="ESSL2")``; None-valued attributes are left out."""
        attrs = tuple(sorted((k, _text(v)) for k, v in attributes.items() if v is not None))
        return cls(name, _text(value), attrs, tuple(children))

    def get(self, attribute: str, default: str | None = None) -> str | None:
        for k, v in self.attributes:
            if k == attribute:
                return v
        return default

    def without(self, *names: str) -> Property:
        return replace(self, attributes=tuple((k, v) for k, v in self.attributes if k not in names))

    @property
    def key(self) -> tuple[str, str | None, str | None]:
        """The identity a lower level overrides (see the module docstring)."""
        if self.name in ("Resource", "ResourceLimit", "Extension"):
            return (self.name, self.get("name"), self.get("type"))
        return (self.name, None, None)

    @property
    def where(self) -> str:
        return f"<{self.name}>" + (f" (line {self.line})" if self.line is not None else "")


def _text(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if not v.is_integer() or abs(v) >= 1e16 else str(int(v))
    return str(v)


@dataclass(frozen=True, slots=True)
class Redirect:
    """An OutputFile, ErrorFile or InputFile: the file (None: chosen by the pilot) and its redirectList."""

    path: str | None
    redirects: frozenset[str] = frozenset()

    @property
    def append(self) -> bool:
        return "Append" in self.redirects

    @property
    def close(self) -> bool:
        return "Close" in self.redirects

    @property
    def merge(self) -> bool:
        return "Merge" in self.redirects


@dataclass(frozen=True, slots=True)
class ResourceLimit:
    """A ResourceLimit; ``kind`` None sets both the soft and the hard limit (spec)."""

    name: str
    value: int  # -1: unlimited
    kind: str | None = None

    @property
    def resource(self) -> str:
        """The ``resource.RLIMIT_*`` name setrlimit takes."""
        return RLIMITS[_norm(self.name)]


@dataclass(frozen=True, slots=True)
class Dependency:
    """Run after ``target`` (a JobId, or every job of a JobName) when ``condition`` holds."""

    target: str
    condition: str = "OnSuccess"
    code: int | None = None
    designator: str = "JobId"

    def __str__(self) -> str:
        cond = self.condition + (f" code={self.code}" if self.code is not None else "")
        by = "job" if self.designator == "JobId" else "jobs named"
        return f"{cond} of {by} {self.target!r}"


@dataclass(frozen=True, slots=True)
class TaskDistribution:
    type: str  # Rule | TasksPerNode | ProcessorsPerTask | Geometry
    value: str


#: Units of Appendix A (and their usual abbreviations), in bytes. Memory, Disk and Swap default to MB.
UNITS: Final = {
    **{u: 1 for u in ("b", "byte", "bytes")},
    **{u: 2**10 for u in ("k", "kb", "kib", "kilobyte", "kilobytes")},
    **{u: 2**20 for u in ("m", "mb", "mib", "megabyte", "megabytes")},
    **{u: 2**30 for u in ("g", "gb", "gib", "gigabyte", "gigabytes")},
    **{u: 2**40 for u in ("t", "tb", "tib", "terabyte", "terabytes")},
    **{u: 2**50 for u in ("p", "pb", "pib", "petabyte", "petabytes")},
    **{u: 2**60 for u in ("e", "eb", "eib", "exabyte", "exabytes")},
}
BYTE_CONSUMABLES: Final = frozenset({"Memory", "Disk", "Swap", "Network"})


def amount(prop: Property) -> float:
    """A consumable's amount in base units: bytes for Memory/Disk/Swap/Network (MB when no units),
    the plain number otherwise."""
    try:
        v = float(prop.value)
    except ValueError:
        raise SssError(f"{prop.value!r} is not a number", element=f"<{prop.name}>", line=prop.line) from None
    if not math.isfinite(v) or v < 0:
        raise SssError(f"{prop.value!r} must be a finite amount >= 0", element=f"<{prop.name}>", line=prop.line)
    if prop.name in BYTE_CONSUMABLES:
        units = prop.get("units", "MB") or "MB"
        factor = UNITS.get(units.lower())
        if factor is None:
            raise SssError(
                f'units="{units}" is not known: use B, KB, MB, GB, TB, PB or EB',
                element=f"<{prop.name}>",
                line=prop.line,
            )
        v *= factor
        if not math.isfinite(v):
            raise SssError(
                f"{prop.value} {units} is more than any machine has", element=f"<{prop.name}>", line=prop.line
            )
    return v


@dataclass(slots=True)
class Properties:
    """A set of properties at one level: uncategorized ones, and the Requested and Delivered categories."""

    items: list[Property] = field(default_factory=list)
    requested: list[Property] | None = None
    delivered: list[Property] | None = None

    @classmethod
    def of(
        cls,
        *items: Property,
        requested: Iterable[Property] | None = None,
        delivered: Iterable[Property] | None = None,
    ) -> Properties:
        return cls(
            list(items),
            None if requested is None else list(requested),
            None if delivered is None else list(delivered),
        )

    def __iter__(self) -> Iterator[Property]:
        return iter(self.items)

    def all(self, name: str) -> list[Property]:
        return [p for p in self.items if p.name == name]

    def first(self, name: str) -> Property | None:
        for p in self.items:
            if p.name == name:
                return p
        return None

    def text(self, name: str) -> str | None:
        p = self.first(name)
        return None if p is None else p.value

    def requested_all(self, name: str) -> list[Property]:
        return [p for p in self.requested or () if p.name == name]

    def delivered_first(self, name: str) -> Property | None:
        for p in self.delivered or ():
            if p.name == name:
                return p
        return None

    # -- typed views the daemon acts on ------------------------------------------------------------

    @property
    def name(self) -> str | None:
        return self.text("Name")

    @property
    def id(self) -> str | None:
        return self.text("Id")

    @property
    def state(self) -> str | None:
        return self.text("State")

    @property
    def executable(self) -> str | None:
        return self.text("Executable")

    @property
    def arguments(self) -> list[str]:
        """Arguments split as a POSIX shell would (without expansion)."""
        p = self.first("Arguments")
        if p is None:
            return []
        try:
            return shlex.split(p.value)
        except ValueError as exc:
            raise SssError(
                f"cannot be split into arguments ({exc}); balance the quotes", element=p.where, line=None
            ) from None

    @property
    def initial_working_directory(self) -> str | None:
        return self.text("InitialWorkingDirectory")

    @property
    def environment(self) -> dict[str, str]:
        env = self.first("Environment")
        return {} if env is None else {v.get("name") or "": v.value for v in env.children}

    @property
    def export_environment(self) -> bool | None:
        """The Environment's ``export`` attribute: pass the submitter's environment through."""
        env = self.first("Environment")
        raw = None if env is None else env.get("export")
        return None if raw is None else raw.strip().lower() in ("true", "1")

    def redirect(self, name: str) -> Redirect | None:
        p = self.first(name)
        if p is None:
            return None
        redirects = frozenset(r.strip() for r in (p.get("redirectList") or "").split(",") if r.strip())
        return Redirect(p.value.strip() or None, redirects)

    @property
    def output_file(self) -> Redirect | None:
        return self.redirect("OutputFile")

    @property
    def error_file(self) -> Redirect | None:
        return self.redirect("ErrorFile")

    @property
    def input_file(self) -> Redirect | None:
        return self.redirect("InputFile")

    @property
    def resource_limits(self) -> list[ResourceLimit]:
        out = []
        for p in self.all("ResourceLimit"):
            raw = p.value.strip()
            if raw.lower() in ("unlimited", "infinity"):
                value = -1
            else:
                try:
                    value = int(raw)
                except ValueError:
                    raise SssError(
                        f"{raw!r} is not a whole number (or 'unlimited')", element=p.where, line=None
                    ) from None
                if value < 0:
                    raise SssError(f"{raw!r} is negative; give a limit >= 0 or 'unlimited'", element=p.where)
            out.append(ResourceLimit(p.get("name") or "", value, p.get("type")))
        return out

    @property
    def holds(self) -> list[str]:
        return [p.value.strip() for p in self.all("Hold") if p.value.strip()]

    @property
    def dependencies(self) -> list[Dependency]:
        out = []
        for p in self.all("Dependency"):
            code = p.get("code")
            try:
                code_int = None if code is None else int(code)
            except ValueError:
                raise SssError(f"code={code!r} is not an integer exit code", element=p.where) from None
            target = p.value.strip()
            if not target:
                raise SssError("names no job: give the JobId (or JobName) it depends on", element=p.where)
            out.append(Dependency(target, p.get("condition") or "OnSuccess", code_int, p.get("designator") or "JobId"))
        return out

    @property
    def task_distribution(self) -> TaskDistribution | None:
        p = self.first("TaskDistribution")
        return None if p is None else TaskDistribution(p.get("type") or "Rule", p.value.strip())

    def integer(self, name: str) -> int | None:
        p = self.first(name)
        if p is None:
            return None
        try:
            return int(p.value.strip())
        except ValueError:
            raise SssError(f"{p.value!r} is not an integer", element=p.where) from None

    @property
    def task_count(self) -> int | None:
        return self.integer("TaskCount")

    @property
    def duration(self) -> float | None:
        """Walltime in seconds: a Requested Duration (EQ/LE/LT bound it), else an uncategorized one."""
        for p in self.requested_all("Duration"):
            if p.get("op", "EQ") in ("EQ", "LE", "LT") and p.get("preference") is None:
                return float(p.value)
        text = self.text("Duration")
        return None if text is None else float(text)

    def extension(self, name: str) -> str | None:
        for p in self.all("Extension"):
            if p.get("name") == name and p.get("type") != "CustomAttribute":
                return p.value
        return None

    @property
    def custom_attributes(self) -> dict[str, Any]:
        """``<Extension type="CustomAttribute" name=k>json</Extension>``: PSI/J custom attributes, typed."""
        out: dict[str, Any] = {}
        for p in self.all("Extension"):
            if p.get("type") == "CustomAttribute":
                try:
                    out[p.get("name") or ""] = json.loads(p.value)
                except ValueError:
                    out[p.get("name") or ""] = p.value
        return out


def merge(defaults: Properties | None, own: Properties, *, skip: frozenset[str] = frozenset()) -> Properties:
    """``own`` over ``defaults`` per property identity; names in ``skip`` are not inherited.
    Delivered is never inherited: it describes one object."""
    if defaults is None:
        return own
    own_keys = {p.key for p in own.items}
    items = [p for p in defaults.items if p.key not in own_keys and p.name not in skip] + own.items
    requested = own.requested
    if defaults.requested:
        own_req = {p.key for p in own.requested or ()}
        inherited = [p for p in defaults.requested if p.key not in own_req and p.name not in skip]
        if inherited or requested is not None:
            requested = inherited + list(own.requested or ())
    return Properties(items, requested, own.delivered)


@dataclass(slots=True)
class Task:
    """A Task, or (as ``Task.defaults``) TaskDefaults: per-task properties such as the node it ran on."""

    properties: Properties = field(default_factory=Properties)
    attributes: dict[str, str] = field(default_factory=dict)
    line: int | None = field(default=None, compare=False)


@dataclass(slots=True)
class TaskGroup:
    """A TaskGroup (or TaskGroupDefaults): tasks sharing executable, resources and distribution."""

    properties: Properties = field(default_factory=Properties)
    tasks: list[Task] = field(default_factory=list)
    task_defaults: Task | None = None
    attributes: dict[str, str] = field(default_factory=dict)
    line: int | None = field(default=None, compare=False)


@dataclass(slots=True)
class Job:
    """A Job (or JobDefaults): one schedulable entity made of one or more task groups."""

    properties: Properties = field(default_factory=Properties)
    task_groups: list[TaskGroup] = field(default_factory=list)
    task_group_defaults: TaskGroup | None = None
    attributes: dict[str, str] = field(default_factory=dict)
    line: int | None = field(default=None, compare=False)


@dataclass(slots=True)
class JobGroup:
    """Jobs with dependencies between them (a DAG), and the defaults they share."""

    properties: Properties = field(default_factory=Properties)
    jobs: list[Job] = field(default_factory=list)
    job_defaults: Job | None = None
    attributes: dict[str, str] = field(default_factory=dict)
    line: int | None = field(default=None, compare=False)


# The spec's names for the Defaults elements: same structure as the element they default.
JobDefaults = Job
TaskGroupDefaults = TaskGroup
TaskDefaults = Task


# -- effective (inherited) view ------------------------------------------------------------------------

#: Names a TaskGroup does not inherit from its Job: they identify or describe the job itself.
_NOT_TO_GROUPS: Final = frozenset(
    {"Id", "Name", "State", "StatusMessage", "ExitCode", "StartTime", "EndTime", "Dependency", "Hold", "Duration"}
)
#: Totals that describe the job's single task group; with several groups each states its own.
SCOPE_TOTALS: Final = frozenset({"Processors", "NodeCount", "TaskCount", "TaskDistribution"})
_NOT_TO_TASKS: Final = frozenset({"Id", "Name", "State", "StatusMessage", "ExitCode", "StartTime", "EndTime"})


@dataclass(frozen=True, slots=True)
class EffectiveTask:
    index: int
    properties: Properties
    where: str


@dataclass(frozen=True, slots=True)
class EffectiveTaskGroup:
    """A task group with everything it inherits resolved. ``task_template`` is what a task without
    its own Task element gets; ``tasks`` are the explicit Task elements, resolved."""

    index: int
    where: str
    properties: Properties
    task_template: Properties
    tasks: tuple[EffectiveTask, ...]
    line: int | None

    @property
    def name(self) -> str | None:
        return self.properties.name


@dataclass(frozen=True, slots=True)
class EffectiveJob:
    index: int
    where: str
    properties: Properties
    task_groups: tuple[EffectiveTaskGroup, ...]
    source: Job

    @property
    def name(self) -> str | None:
        return self.properties.name

    @property
    def id(self) -> str | None:
        return self.properties.id


def _label(kind: str, props: Properties, index: int, line: int | None, *, single: bool) -> str:
    name = props.name
    label = f'{kind} "{name}"' if name else (kind if single else f"{kind}[{index + 1}]")
    return label + (f" (line {line})" if line is not None else "")


def effective_jobs(obj: JobGroup | Job) -> list[EffectiveJob]:
    """Every job of ``obj`` with JobDefaults, TaskGroupDefaults and TaskDefaults applied."""
    if isinstance(obj, Job):
        return [effective_job(obj, None, 0, single=True)]
    base = _label("JobGroup", obj.properties, 0, obj.line, single=True)
    return [effective_job(j, obj.job_defaults, i, prefix=base + "/") for i, j in enumerate(obj.jobs)]


def effective_job(
    job: Job, defaults: Job | None, index: int, *, prefix: str = "", single: bool = False
) -> EffectiveJob:
    props = merge(None if defaults is None else defaults.properties, job.properties)
    where = prefix + _label("Job", props, index, job.line, single=single)
    tg_defaults = job.task_group_defaults
    if defaults is not None and defaults.task_group_defaults is not None:
        tg_defaults = _merge_tg(defaults.task_group_defaults, tg_defaults)
    groups = job.task_groups or (defaults.task_groups if defaults is not None else []) or [TaskGroup()]
    skip = _NOT_TO_GROUPS | (SCOPE_TOTALS if len(groups) > 1 else frozenset())
    inherited = Properties(props.items, props.requested, None)
    resolved = []
    for i, tg in enumerate(groups):
        tg_props = merge(None if tg_defaults is None else tg_defaults.properties, tg.properties)
        tg_props = merge(inherited, tg_props, skip=skip)
        tg_where = where + "/" + _label("TaskGroup", tg_props, i, tg.line, single=len(groups) == 1)
        task_defaults = tg.task_defaults
        if tg_defaults is not None and tg_defaults.task_defaults is not None:
            task_defaults = _merge_task(tg_defaults.task_defaults, task_defaults)
        base = Properties(tg_props.items, None, None)
        template = merge(base, task_defaults.properties if task_defaults else Properties(), skip=_NOT_TO_TASKS)
        template_req = Properties(template.items, None, None)
        tasks = tuple(
            EffectiveTask(
                k,
                merge(template_req, t.properties, skip=_NOT_TO_TASKS),
                tg_where + "/" + _label("Task", t.properties, k, t.line, single=False),
            )
            for k, t in enumerate(tg.tasks)
        )
        resolved.append(EffectiveTaskGroup(i, tg_where, tg_props, template, tasks, tg.line))
    return EffectiveJob(index, where, props, tuple(resolved), job)


def _merge_tg(defaults: TaskGroup, own: TaskGroup | None) -> TaskGroup:
    if own is None:
        return defaults
    td = own.task_defaults
    if defaults.task_defaults is not None:
        td = _merge_task(defaults.task_defaults, td)
    return TaskGroup(merge(defaults.properties, own.properties), own.tasks, td, own.attributes, own.line)


def _merge_task(defaults: Task, own: Task | None) -> Task:
    if own is None:
        return defaults
    return Task(merge(defaults.properties, own.properties), own.attributes, own.line)


# -- states --------------------------------------------------------------------------------------------

_TO_SSS: Final = {
    JobState.NEW: "NotQueued",
    JobState.QUEUED: "Idle",
    JobState.ACTIVE: "Running",
    # The staging states keep PSI/J's names (the spec's list is open), as the final states do.
    JobState.STAGE_IN: "StageIn",
    JobState.STAGE_OUT: "StageOut",
    JobState.CLEANUP: "Cleanup",
    JobState.COMPLETED: "Completed",
    JobState.FAILED: "Failed",
    JobState.CANCELED: "Canceled",
}


def sss_state(state: JobState, *, held: bool = False) -> str:
    """The SSS State of a job: Idle, Hold, Running, Completed as the spec lists them; since the spec's
    list is open ("may include"), a final state keeps PSI/J's distinction: Failed, Canceled."""
    if held and state is JobState.QUEUED:
        return "Hold"
    return _TO_SSS[state]


def job_state(sss: str) -> JobState | None:
    """The PSI/J state an SSS State names, or None for one that has no equivalent (Suspended)."""
    for k, v in _TO_SSS.items():
        if v.lower() == sss.strip().lower():
            return k
    return {"hold": JobState.QUEUED, "unstarted": JobState.QUEUED, "active": JobState.ACTIVE}.get(sss.strip().lower())

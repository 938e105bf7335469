"""A job request resolved to numbers (SSS TaskCount, Processors, NodeCount, TaskDistribution and the
consumables each task or the job takes), with its contradictions refused naming both values; see
:mod:`pilot.scheduler.distribution` for the rules and for placing what is resolved here."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from pilot.model.job_description import ResourceRequest
from pilot.model.sss.errors import SssError
from pilot.model.sss.job import EffectiveJob, EffectiveTaskGroup, Property
from pilot.scheduler.attributes import ConsumableKind, Requestable
from pilot.scheduler.cluster import Cluster, attribute_name, consumable_definition
from pilot.scheduler.matching import Amounts, Need, NodeRequirement, compile_requirements
from pilot.scheduler.terms import AttributeTerm, leaves

MAX_JOB_VARIANTS: Final = 16


class Rule(StrEnum):
    ROUND_ROBIN = "RoundRobin"
    PACK = "Pack"
    SPREAD = "Spread"


@dataclass(frozen=True, slots=True)
class TaskGroupRequest:
    """One task group resolved to numbers: all placement needs. Hashable: it keys categories
    (``where`` only names it in messages, so identical requests of differently named jobs are equal)."""

    where: str = field(compare=False)
    task_count: int = 1
    processors_per_task: int = 1
    gpus_per_task: int = 0
    memory_per_task: int = 0  # bytes
    per_task: tuple[tuple[str, float], ...] = ()  # other consumables, per task
    per_job: tuple[tuple[str, float], ...] = ()  # consumables debited once per job
    #: Defaults of consumables the request leaves out: debited only on a level that has them (a level
    #: that lacks the attribute is skipped, as SGE does), so they never keep a task off a node.
    per_task_defaults: tuple[tuple[str, float], ...] = ()
    per_job_defaults: tuple[tuple[str, float], ...] = ()
    node_count: int | None = None
    tasks_per_node: int | None = None
    rule: Rule | None = None
    geometry: tuple[tuple[int, ...], ...] | None = None  # task indices (0-based) per node
    exclusive: bool = False
    requirement: NodeRequirement = field(default_factory=NodeRequirement)

    @property
    def processors(self) -> int:
        return self.task_count * self.processors_per_task

    @property
    def need(self) -> Need:
        """Per-task amounts a node must be configured with (the static part of the category)."""
        need: list[tuple[str, float]] = [("Processors", float(self.processors_per_task))]
        if self.memory_per_task:
            need.append(("Memory", float(self.memory_per_task)))
        if self.gpus_per_task:
            need.append(("Resource:GPU", float(self.gpus_per_task)))
        return tuple(need) + self.per_task

    @property
    def slot_request(self) -> ResourceRequest:
        return ResourceRequest(
            cpu_cores_per_process=self.processors_per_task,
            gpu_cores_per_process=self.gpus_per_task,
            memory_per_process=self.memory_per_task,
        )

    @property
    def category(self) -> tuple[NodeRequirement, Need, bool]:
        return (self.requirement, self.need, self.exclusive)


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A job resolved: its variants (one request per task group each), tried in order, and walltime."""

    where: str = field(compare=False)
    variants: tuple[tuple[TaskGroupRequest, ...], ...] = ()
    duration: float | None = None

    @property
    def category(self) -> tuple[tuple[TaskGroupRequest, ...], ...]:
        """Jobs of equal categories are placed alike: the queue keeps one head per category."""
        return self.variants


# -- resolving --------------------------------------------------------------------------------------------

_GEOMETRY_RE: Final = re.compile(r"\s*\{([^{}]*)\}\s*")


def parse_geometry(text: str, *, where: str = "<TaskDistribution>") -> tuple[tuple[int, ...], ...]:
    """``{1,4}{2}{3,5}`` -> ((0, 3), (1,), (2, 4)): 0-based task indices per node. Ids are numbered
    from 1 (the spec's example) or from 0, and must name every task exactly once."""
    blocks: list[list[int]] = []
    pos = 0
    while pos < len(text):
        m = _GEOMETRY_RE.match(text, pos)
        if not m:
            raise SssError(
                f'type="Geometry" value {text!r} is not a list of braces; '
                "write task ids per node like {1,4}{2}{3,5}",
                element=where,
            )
        ids = []
        for item in m.group(1).split(","):
            item = item.strip()
            if not re.fullmatch(r"\d+", item):
                raise SssError(f"Geometry block {{{m.group(1)}}} holds {item!r}; write task ids", element=where)
            ids.append(int(item))
        blocks.append(ids)
        pos = m.end()
    flat = [i for b in blocks for i in b]
    if not flat:
        raise SssError("Geometry names no task; write task ids per node like {1,4}{2}{3,5}", element=where)
    if len(set(flat)) != len(flat):
        dup = sorted({i for i in flat if flat.count(i) > 1})
        raise SssError(f"Geometry {text!r} places task(s) {dup} on more than one node", element=where)
    base = min(flat)
    if base not in (0, 1) or sorted(flat) != list(range(base, base + len(flat))):
        raise SssError(
            f"Geometry {text!r} must name tasks 1..{len(flat)} (or 0..{len(flat) - 1}) each once", element=where
        )
    return tuple(tuple(i - base for i in b) for b in blocks)


def _positive(td: Property | None, what: str, where: str) -> int:
    assert td is not None
    try:
        n = int(td.value.strip())
    except ValueError:
        n = 0
    if n < 1:
        raise SssError(
            f'type="{what}" needs a whole number >= 1, not {td.value.strip()!r}', element=f"{where}/{td.where}"
        )
    return n


def _int(v: float | None, name: str, where: str) -> int | None:
    if v is None:
        return None
    if not float(v).is_integer() or v < 1:
        raise SssError(f"{name}={v:g} must be a whole number >= 1", element=where)
    return int(v)


def resolve_task_group(
    tg: EffectiveTaskGroup,
    amounts: Amounts,
    requirement: NodeRequirement,
    cluster: Cluster,
    *,
    exclusive: bool = False,
) -> TaskGroupRequest:
    """One variant of one task group as numbers, or :class:`SssError` naming the contradiction."""
    where = tg.where
    props = tg.properties
    T = _int(amounts.get("TaskCount"), "TaskCount", where)
    P = _int(amounts.get("Processors"), "Processors", where)
    N = _int(amounts.get("NodeCount"), "NodeCount", where)
    td = props.first("TaskDistribution")
    kind = (td.get("type") or "Rule") if td is not None else None
    ppt = _positive(td, "ProcessorsPerTask", where) if kind == "ProcessorsPerTask" else None
    tpn = _positive(td, "TasksPerNode", where) if kind == "TasksPerNode" else None
    geometry = parse_geometry(td.value, where=f"{where}/{td.where}") if td is not None and kind == "Geometry" else None
    rule = Rule(td.value.strip()) if td is not None and kind == "Rule" else None
    explicit = len(tg.tasks)

    if ppt is not None and P is not None and T is not None and P != T * ppt:
        raise SssError(
            f"Processors={P} contradicts TaskCount={T} x ProcessorsPerTask={ppt} (= {T * ppt}); give two of the three",
            element=where,
        )
    if geometry is not None:
        g_tasks, g_nodes = sum(len(b) for b in geometry), len(geometry)
        if T is not None and T != g_tasks:
            raise SssError(
                f"Geometry {td.value.strip() if td else ''} places {g_tasks} task(s) but TaskCount={T}", element=where
            )
        if N is not None and N != g_nodes:
            raise SssError(
                f"Geometry {td.value.strip() if td else ''} uses {g_nodes} node(s) but NodeCount={N}", element=where
            )
        T, N = g_tasks, g_nodes
    if T is None and P is not None:
        per = ppt or 1
        if P % per:
            raise SssError(f"Processors={P} is not a multiple of ProcessorsPerTask={per}", element=where)
        T = P // per
    if T is None and tpn is not None and N is not None:
        T = N * tpn
    if T is None:
        T = explicit or N or 1
    if ppt is None:
        if P is not None:
            if P < T:
                raise SssError(
                    f"Processors={P} is fewer than TaskCount={T}: every task needs a processor", element=where
                )
            if P % T:
                raise SssError(
                    f"Processors={P} cannot be split evenly over TaskCount={T} tasks; make Processors a "
                    "multiple of TaskCount or say ProcessorsPerTask",
                    element=where,
                )
            ppt = P // T
        else:
            ppt = 1
    if tpn is not None:
        implied = math.ceil(T / tpn)
        if N is not None and N != implied:
            raise SssError(
                f"TasksPerNode={tpn} puts TaskCount={T} task(s) on {implied} node(s), but NodeCount={N}",
                element=where,
            )
        N = implied
    if explicit > T:
        raise SssError(f"has {explicit} <Task> elements but TaskCount={T}", element=where)
    if N is not None and N > T:
        raise SssError(
            f"NodeCount={N} but only {T} task(s): a node without a task cannot be used; lower NodeCount", element=where
        )

    asked = amounts.per_task()
    memory = math.ceil(asked.pop("Memory", 0.0))
    gpus_f = asked.pop("Resource:GPU", 0.0)
    if not float(gpus_f).is_integer():
        raise SssError(f"Resource GPU={gpus_f:g} must be a whole number of GPUs", element=where)
    per_task: dict[str, float] = {}
    per_job: dict[str, float] = {}
    for key, value in asked.items():
        if key == "Duration":
            continue
        d = consumable_definition(cluster.registry, key)
        if d is not None and d.requestable is Requestable.NO and key.startswith("Resource:"):
            raise SssError(
                f"Resource {key.removeprefix('Resource:')} cannot be requested (requestable = NO in the pilot "
                f"config): remove it; every task is given its default of {d.default:g}",
                element=where,
            )
        (per_job if _kind(cluster, key) is ConsumableKind.JOB else per_task)[key] = value
    named = {attribute_name(cluster.registry, k) for k in (*per_task, *per_job)}
    task_defaults: dict[str, float] = {}
    job_defaults: dict[str, float] = {}
    for d in cluster.registry.consumables:
        if d.builtin or d.default is None or d.name in named:
            continue
        key = "Resource:" + d.name
        if not cluster.offers(key):
            continue
        assert isinstance(d.default, float)
        (job_defaults if d.consumable is ConsumableKind.JOB else task_defaults)[key] = d.default
    if requirement.expr is not None:
        named |= {leaf.condition.name for leaf in leaves(requirement.expr) if isinstance(leaf, AttributeTerm)}
    return TaskGroupRequest(
        where=where,
        task_count=T,
        processors_per_task=ppt,
        gpus_per_task=int(gpus_f),
        memory_per_task=memory,
        per_task=tuple(sorted(per_task.items())),
        per_job=tuple(sorted(per_job.items())),
        per_task_defaults=tuple(sorted(task_defaults.items())),
        per_job_defaults=tuple(sorted(job_defaults.items())),
        node_count=N,
        tasks_per_node=tpn,
        rule=rule,
        geometry=geometry,
        exclusive=exclusive,
        requirement=dataclasses.replace(requirement, asked=requirement.asked | frozenset(named)),
    )


def _kind(cluster: Cluster, key: str) -> ConsumableKind:
    d = consumable_definition(cluster.registry, key)
    return d.consumable if d is not None and d.consumable is not ConsumableKind.NO else ConsumableKind.SLOT


def _exclusive(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("true", "1", "yes")


def resolve_job(job: EffectiveJob, cluster: Cluster) -> JobRequest:
    """Every task group of ``job`` compiled and resolved, with the checks across levels: a Job's own
    Processors/NodeCount/TaskCount against its single TaskGroup's, or Processors against the sum of
    several groups."""
    per_group: list[list[TaskGroupRequest]] = []
    several = len(job.task_groups) > 1
    own = job.source.properties
    if several and (own.first("NodeCount") is not None or any(p.name == "NodeCount" for p in own.requested or ())):
        raise SssError(
            "a Job NodeCount with several TaskGroups is ambiguous; give each TaskGroup its NodeCount", element=job.where
        )
    for i, tg in enumerate(job.task_groups):
        if not several and i < len(job.source.task_groups):
            _check_totals(job, tg, job.source.task_groups[i].properties.items)
        req = compile_requirements(tg.properties, cluster, where=tg.where)
        exclusive = _exclusive(tg.properties.extension("Exclusive"))
        variants = [resolve_task_group(tg, a, req.node, cluster, exclusive=exclusive) for a in req.variants]
        per_group.append(variants)
    combos = _combinations(per_group)
    job_p = own.integer("Processors") if several else None
    if job_p is not None:
        fitting = [c for c in combos if sum(g.processors for g in c) == job_p]
        if not fitting:
            sums = sorted({sum(g.processors for g in c) for c in combos})
            raise SssError(
                f"Job Processors={job_p} but its TaskGroups hold {' or '.join(map(str, sums))} processors in all; "
                "make them agree or drop the Job's Processors",
                element=job.where,
            )
        combos = fitting
    return JobRequest(job.where, tuple(combos), job.properties.duration)


def _check_totals(job: EffectiveJob, tg: EffectiveTaskGroup, tg_own: Iterable[Property]) -> None:
    own = {p.name: p.value.strip() for p in job.source.properties.items if p.name in ("Processors", "NodeCount")}
    for p in tg_own:
        if p.name in own and own[p.name] != p.value.strip():
            raise SssError(
                f"the Job says {p.name}={own[p.name]} but its only TaskGroup says {p.name}={p.value.strip()}; "
                "give it once",
                element=tg.where,
            )


def _combinations(per_group: list[list[TaskGroupRequest]]) -> list[tuple[TaskGroupRequest, ...]]:
    """Variant combinations across groups, best (lowest summed preference index) first, capped."""
    combos: list[tuple[int, tuple[TaskGroupRequest, ...]]] = [(0, ())]
    for variants in per_group:
        combos = [(s + i, (*c, v)) for s, c in combos for i, v in enumerate(variants)]
        combos.sort(key=lambda sc: sc[0])
        combos = combos[: MAX_JOB_VARIANTS * 4]
    return [c for _, c in combos[:MAX_JOB_VARIANTS]]


__all__ = [
    "MAX_JOB_VARIANTS",
    "JobRequest",
    "Rule",
    "TaskGroupRequest",
    "parse_geometry",
    "resolve_job",
    "resolve_task_group",
]

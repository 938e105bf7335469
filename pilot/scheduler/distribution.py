"""How a job's tasks map onto nodes: SSS TaskDistribution, NodeCount, exclusive nodes, and placement.

A task group is first resolved to numbers (:class:`TaskGroupRequest`): how many tasks, processors
per task, per-task consumables, node count and the distribution rule. Processors, NodeCount and
TaskCount can contradict each other (SSS job spec, TaskDistribution: "components are responsible
for resolving conflicting requirements"); here a contradiction refuses the job with both values
named. The rules:

- ``TasksPerNode`` n: blocks of n consecutive tasks per node (the last may hold fewer);
- ``ProcessorsPerTask`` n: each task holds n processors;
- ``Geometry`` ``{1,4}{2}{3,5}``: the task ids on each node (ids numbered from 1 as in the spec, or
  from 0), so the group uses as many nodes as there are braces;
- ``Rule`` ``Pack``: fill one node before the next (fewest nodes); ``Spread``: as many nodes as
  possible, evenly, consecutive ids on one node; ``RoundRobin``: the nodes of Spread, with ids dealt
  one per node in turn (task 0 on the first node, task 1 on the second, ...).

With NodeCount and no rule, tasks are spread evenly over exactly that many nodes; with neither,
packed. Amounts are per task except Processors (the task group's total) and consumables an
attribute definition makes per job (licenses): those are debited once for the whole job.

:class:`SchedulingPass` places queued jobs. Per category (identical node requirement and per-task
need) it keeps the matcher's ranked node list and a cursor past the nodes that are full, so the
cost per task stays flat however long the queue (SGE complex-attribute spec, section 5).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from pilot.model.job_description import ResourceRequest
from pilot.model.sss.errors import SssError
from pilot.model.sss.job import EffectiveJob, EffectiveTaskGroup, Property
from pilot.scheduler.attributes import ConsumableKind, ConsumableLedger
from pilot.scheduler.cluster import Cluster, MatchNode
from pilot.scheduler.matching import Amounts, Matcher, Need, NodeRequirement, compile_requirements, uncached_candidates
from pilot.scheduler.placement import NodeSlots, RankPlacement

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
        (per_job if _kind(cluster, key) is ConsumableKind.JOB else per_task)[key] = value
    for d in cluster.registry.consumables:
        if d.builtin or d.default is None:
            continue
        key = "Resource:" + d.name
        if key in per_task or key in per_job or not cluster.offers(key):
            continue
        assert isinstance(d.default, float)
        (per_job if d.consumable is ConsumableKind.JOB else per_task)[key] = d.default
    return TaskGroupRequest(
        where=where,
        task_count=T,
        processors_per_task=ppt,
        gpus_per_task=int(gpus_f),
        memory_per_task=memory,
        per_task=tuple(sorted(per_task.items())),
        per_job=tuple(sorted(per_job.items())),
        node_count=N,
        tasks_per_node=tpn,
        rule=rule,
        geometry=geometry,
        exclusive=exclusive,
        requirement=requirement,
    )


def _kind(cluster: Cluster, key: str) -> ConsumableKind:
    d = cluster.registry.get(key.removeprefix("Resource:"))
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


# -- placing ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class TaskPlacement:
    """Where one task runs: its node and the cores, GPUs and memory it holds there."""

    group: int
    task: int
    node: str
    cores: list[int]
    gpus: list[int]
    memory: int
    amounts: tuple[tuple[str, float], ...] = ()


@dataclass(slots=True)
class JobPlacement:
    tasks: list[TaskPlacement]
    variant: int
    per_job: list[tuple[str, tuple[tuple[str, float], ...]]] = field(default_factory=list)  # (level, amounts)

    def by_group(self, group: int) -> list[TaskPlacement]:
        return [t for t in self.tasks if t.group == group]


@dataclass(slots=True)
class Resources:
    """What placement takes from: the nodes' slots, their other consumables, and the global pool."""

    slots: dict[str, NodeSlots]
    ledgers: dict[str, ConsumableLedger] = field(default_factory=dict)
    global_ledger: ConsumableLedger = field(default_factory=ConsumableLedger)

    def ledger(self, node: str) -> ConsumableLedger:
        led = self.ledgers.get(node)
        if led is None:
            led = self.ledgers[node] = ConsumableLedger()
        return led

    def idle_copy(self) -> Resources:
        led = {k: ConsumableLedger.of(v.capacity) for k, v in self.ledgers.items()}
        return Resources(
            {k: s.idle_copy() for k, s in self.slots.items()}, led, ConsumableLedger.of(self.global_ledger.capacity)
        )


def _split(g: TaskGroupRequest, res: Resources) -> tuple[dict[str, float], dict[str, float]]:
    """Per-task consumables of ``g`` that live on nodes, and those in the global pool."""
    host: dict[str, float] = {}
    glob: dict[str, float] = {}
    for k, v in g.per_task:
        (glob if k in res.global_ledger.capacity else host)[k] = v
    return host, glob


def room(g: TaskGroupRequest, name: str, res: Resources, job_id: str, host: Mapping[str, float]) -> int:
    """How many more tasks of ``g`` fit on node ``name`` now."""
    s = res.slots.get(name)
    if s is None or not s.usable:
        return 0
    if s.exclusive_job is not None and s.exclusive_job != job_id:
        return 0
    if g.exclusive and s.holders and s.exclusive_job != job_id:
        return 0
    n = len(s.free_cores) // g.processors_per_task
    if g.gpus_per_task:
        n = min(n, len(s.free_gpus) // g.gpus_per_task)
    if g.memory_per_task:
        n = min(n, s.free_memory // g.memory_per_task)
    if host and n:
        r = res.ledger(name).room(host)
        n = int(min(n, r))
    return n


def shares(g: TaskGroupRequest, caps: Sequence[tuple[str, int]]) -> list[tuple[str, list[int]]] | None:
    """Which tasks of ``g`` go on which candidate node, given each node's room (in rank order);
    None when they do not fit. Pure: the heart of the distribution rules."""
    T = g.task_count
    usable = [(n, c) for n, c in caps if c > 0]
    if g.geometry is not None or g.tasks_per_node is not None:
        if g.geometry is not None:
            blocks = [list(b) for b in g.geometry]
        else:
            tpn = g.tasks_per_node or 1
            blocks = [list(range(i, min(i + tpn, T))) for i in range(0, T, tpn)]
        order = sorted(range(len(blocks)), key=lambda i: -len(blocks[i]))
        taken: set[str] = set()
        assigned: dict[int, str] = {}
        for i in order:
            for n, c in usable:
                if n not in taken and c >= len(blocks[i]):
                    assigned[i] = n
                    taken.add(n)
                    break
            else:
                return None
        return [(assigned[i], blocks[i]) for i in range(len(blocks))]
    if g.node_count is not None:
        N = g.node_count
        if len(usable) < N:
            return None
        if g.rule is Rule.PACK:
            chosen = sorted(usable, key=lambda nc: -nc[1])[:N]
            rank = {n: i for i, (n, _) in enumerate(usable)}
            chosen.sort(key=lambda nc: rank[nc[0]])
            counts = [1] * N
            left = T - N
            for i, (_, c) in enumerate(chosen):
                extra = min(c - 1, left)
                counts[i] += extra
                left -= extra
            if left:
                return None
        else:
            base, extra = divmod(T, N)
            want = [base + 1] * extra + [base] * (N - extra)
            by_room = sorted(range(len(usable)), key=lambda i: (-usable[i][1], i))[:N]
            if any(usable[i][1] < w for i, w in zip(by_room, want, strict=True)):
                return None
            pairs = sorted(zip(by_room, want, strict=True))
            chosen = [usable[i] for i, _ in pairs]
            counts = [w for _, w in pairs]
        return _deal(g, [n for n, _ in chosen], counts)
    if g.rule in (Rule.SPREAD, Rule.ROUND_ROBIN):
        if sum(c for _, c in usable) < T:
            return None
        counts = [0] * len(usable)
        left = T
        while left:  # deal one task per node in turn while nodes have room: as even as room allows
            for i, (_, c) in enumerate(usable):
                if left and counts[i] < c:
                    counts[i] += 1
                    left -= 1
        keep = [(usable[i][0], counts[i]) for i in range(len(usable)) if counts[i]]
        return _deal(g, [n for n, _ in keep], [c for _, c in keep])
    # Pack (the default): fill nodes in rank order.
    names: list[str] = []
    counts = []
    left = T
    for n, c in usable:
        k = min(c, left)
        names.append(n)
        counts.append(k)
        left -= k
        if not left:
            return _deal(g, names, counts)
    return None


def _deal(g: TaskGroupRequest, nodes: list[str], counts: list[int]) -> list[tuple[str, list[int]]]:
    """Task indices per node: consecutive blocks, or one per node in turn for RoundRobin."""
    if g.rule is Rule.ROUND_ROBIN:
        tasks: list[list[int]] = [[] for _ in nodes]
        t = 0
        while t < g.task_count:
            for i in range(len(nodes)):
                if len(tasks[i]) < counts[i] and t < g.task_count:
                    tasks[i].append(t)
                    t += 1
        return list(zip(nodes, tasks, strict=True))
    out = []
    t = 0
    for n, c in zip(nodes, counts, strict=True):
        out.append((n, list(range(t, t + c))))
        t += c
    return out


@dataclass(slots=True)
class _Cursor:
    names: list[str]
    start: int = 0


class SchedulingPass:
    """One scheduling pass: places jobs in queue order, remembering per category which nodes are
    already full (so each is skipped once, not once per task). Start a new pass whenever resources
    were released or nodes changed. ``cache=False`` matches every job afresh: the baseline."""

    def __init__(self, matcher: Matcher, resources: Resources, *, cache: bool = True) -> None:
        self.matcher = matcher
        self.res = resources
        self.cache = cache
        self._cursors: dict[tuple[NodeRequirement, Need, bool], _Cursor] = {}
        self._full: set[tuple[tuple[TaskGroupRequest, ...], ...]] = set()

    def _candidates(self, g: TaskGroupRequest) -> _Cursor:
        if not self.cache:
            return _Cursor([n.name for n in uncached_candidates(self.matcher, g.requirement, g.need)])
        cur = self._cursors.get(g.category)
        if cur is None:
            ranked: list[MatchNode] = self.matcher.candidates(g.requirement, g.need)
            cur = self._cursors[g.category] = _Cursor([n.name for n in ranked])
        return cur

    def place(self, job_id: str, request: JobRequest) -> JobPlacement | None:
        """Take resources for every task of one variant of ``request`` (the first that fits), or
        nothing and None."""
        if self.cache and request.category in self._full:
            return None
        for i, variant in enumerate(request.variants):
            p = self._place_variant(job_id, variant, i)
            if p is not None:
                return p
        if self.cache:
            self._full.add(request.category)
        return None

    def _place_variant(self, job_id: str, variant: tuple[TaskGroupRequest, ...], index: int) -> JobPlacement | None:
        res = self.res
        taken: list[tuple[str, RankPlacement, dict[str, float]]] = []
        glob_taken: list[dict[str, float]] = []
        exclusive_marked: list[str] = []
        placement = JobPlacement([], index)
        ok = True
        for gi, g in enumerate(variant):
            host, glob = _split(g, res)
            if glob and not res.global_ledger.fits(glob, g.task_count):
                ok = False
                break
            cur = self._candidates(g)
            names = cur.names
            # Skip, once per pass, the nodes at the cursor that cannot take even one more task.
            while cur.start < len(names) and room(g, names[cur.start], res, job_id, host) == 0:
                cur.start += 1
            if g.task_count == 1 and g.geometry is None and g.node_count is None:
                plan = None
                for k in range(cur.start, len(names)):
                    if room(g, names[k], res, job_id, host) > 0:
                        plan = [(names[k], [0])]
                        break
            else:
                caps = [(n, room(g, n, res, job_id, host)) for n in names[cur.start :]]
                plan = shares(g, caps)
            if plan is None:
                ok = False
                break
            req = g.slot_request
            for node, tasks in plan:
                slot = res.slots[node]
                for t in tasks:
                    rank = slot.take(req)
                    if host:
                        res.ledger(node).take(host)
                    taken.append((node, rank, host))
                    placement.tasks.append(TaskPlacement(gi, t, node, rank.cores, rank.gpus, rank.memory, g.per_task))
                if g.exclusive and slot.exclusive_job is None:
                    slot.exclusive_job = job_id
                    exclusive_marked.append(node)
            if glob:
                res.global_ledger.take(glob, g.task_count)
                glob_taken.append({k: v * g.task_count for k, v in glob.items()})
        if ok:
            ok = self._take_per_job(variant, placement)
        if not ok:
            for node, rank, host in reversed(taken):
                res.slots[node].give_back(rank)
                if host:
                    res.ledger(node).give_back(host)
            for amounts in glob_taken:
                res.global_ledger.give_back(amounts)
            for node in exclusive_marked:
                res.slots[node].exclusive_job = None
            return None
        for amounts in glob_taken:
            placement.per_job.append(("global", tuple(sorted(amounts.items()))))
        placement.tasks.sort(key=lambda t: (t.group, t.task))
        return placement

    def _take_per_job(self, variant: tuple[TaskGroupRequest, ...], placement: JobPlacement) -> bool:
        """Per-job consumables, once for the whole job: from the global pool, else the first task's node."""
        wanted: dict[str, float] = {}
        for g in variant:
            for k, v in g.per_job:
                wanted[k] = max(wanted.get(k, 0.0), v)
        if not wanted:
            return True
        glob = {k: v for k, v in wanted.items() if k in self.res.global_ledger.capacity}
        host = {k: v for k, v in wanted.items() if k not in glob}
        first = placement.tasks[0].node if placement.tasks else None
        if glob and not self.res.global_ledger.fits(glob):
            return False
        if host and (first is None or not self.res.ledger(first).fits(host)):
            return False
        if glob:
            self.res.global_ledger.take(glob)
            placement.per_job.append(("global", tuple(sorted(glob.items()))))
        if host and first is not None:
            self.res.ledger(first).take(host)
            placement.per_job.append((first, tuple(sorted(host.items()))))
        return True


def release(placement: JobPlacement, resources: Resources, *, job_id: str) -> None:
    """Give back everything ``placement`` took."""
    for t in placement.tasks:
        s = resources.slots.get(t.node)
        if s is not None:
            s.give_back(RankPlacement(t.node, t.cores, t.gpus, t.memory))
        host = {k: v for k, v in t.amounts if k not in resources.global_ledger.capacity}
        if host:
            resources.ledger(t.node).give_back(host)
    for level, amounts in placement.per_job:
        if level == "global":
            resources.global_ledger.give_back(dict(amounts))
        else:
            resources.ledger(level).give_back(dict(amounts))
    for t in placement.tasks:
        s = resources.slots.get(t.node)
        if s is not None and s.exclusive_job == job_id:
            s.exclusive_job = None


def resumed_placement(request: JobRequest, ranks: Sequence[RankPlacement]) -> JobPlacement:
    """The placement of a job placed before a daemon restart: its tasks map onto its journaled ranks in
    order (its first variant: a job with alternatives that ran another shows the first's task numbering)."""
    tasks = []
    i = 0
    for group, g in enumerate(request.variants[0]):
        for t in range(g.task_count):
            r = ranks[i]
            tasks.append(TaskPlacement(group, t, r.node, r.cores, r.gpus, r.memory, g.per_task))
            i += 1
    return JobPlacement(tasks, 0)


def why_not(request: JobRequest, matcher: Matcher, resources: Resources, *, idle: bool = False) -> list[str]:
    """Why ``request`` does not fit now (or, with ``idle``, can never fit this allocation): an empty
    list when it fits. For ``pilot explain`` and the refusal at submit."""
    res = resources.idle_copy() if idle else resources
    reasons: list[str] = []
    for i, variant in enumerate(request.variants):
        trial = SchedulingPass(matcher, _copy(res))
        if trial.place("explain", JobRequest(request.where, (variant,))) is not None:
            return []
        label = f"variant {i + 1}: " if len(request.variants) > 1 else ""
        for g in variant:
            for key, _ in g.per_job:
                if key not in res.global_ledger.capacity and not any(
                    key in led.capacity for led in res.ledgers.values()
                ):
                    reasons.append(
                        f"{label}{g.where}: no node and no global pool offers {key.removeprefix('Resource:')}"
                    )
            cands = matcher.candidates(g.requirement, g.need)
            if not cands:
                for line in matcher.explain(g.requirement, g.need):
                    reasons.append(f"{label}{g.where}: {line}")
                if not matcher.cluster.nodes:
                    break
                continue
            host, _ = _split(g, res)
            total = sum(room(g, n.name, res, "explain", host) for n in cands)
            what = f"{g.task_count} task(s) of {g.processors_per_task} processor(s)"
            if g.memory_per_task:
                what += f", {g.memory_per_task / 2**20:g} MB"
            if g.gpus_per_task:
                what += f", {g.gpus_per_task} GPU(s)"
            layout = ""
            if g.geometry is not None:
                layout = f" in Geometry of {len(g.geometry)} node(s)"
            elif g.node_count is not None:
                layout = f" on {g.node_count} node(s)"
            elif g.tasks_per_node is not None:
                layout = f" at {g.tasks_per_node} per node"
            state = "when idle" if idle else "now"
            reasons.append(
                f"{label}{g.where}: needs {what}{layout}; the {len(cands)} matching node(s) hold room for "
                f"{total} such task(s) {state}" + (" (exclusive nodes)" if g.exclusive else "")
            )
    return reasons or ["it does not fit (the task groups cannot all be placed at once)"]


def _copy(res: Resources) -> Resources:
    slots = {}
    for k, s in res.slots.items():
        c = s.idle_copy()
        c.free_cores = list(s.free_cores)
        c.free_gpus = list(s.free_gpus)
        c.free_memory = s.free_memory
        c.exclusive_job = s.exclusive_job
        c.holders = s.holders
        c.usable = s.usable
        slots[k] = c
    return Resources(slots, {k: v.copy() for k, v in res.ledgers.items()}, res.global_ledger.copy())


__all__ = [
    "JobPlacement",
    "JobRequest",
    "Resources",
    "Rule",
    "SchedulingPass",
    "TaskGroupRequest",
    "TaskPlacement",
    "parse_geometry",
    "release",
    "resolve_job",
    "resolve_task_group",
    "resumed_placement",
    "room",
    "shares",
    "why_not",
]

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pilot.scheduler.attributes import ConsumableLedger
from pilot.scheduler.cluster import MatchNode
from pilot.scheduler.matching import Matcher, Need, NodeRequirement, uncached_candidates
from pilot.scheduler.placement import NodeSlots, RankPlacement
from pilot.scheduler.resolving import (
    JobRequest,
    Rule,
    TaskGroupRequest,
    parse_geometry,
    resolve_job,
    resolve_task_group,
)

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
    """Per-task consumables of ``g`` that live on nodes, and those in the global pool (with the
    defaults the pool has)."""
    host: dict[str, float] = {}
    glob: dict[str, float] = {}
    pool = res.global_ledger.capacity
    for k, v in g.per_task:
        (glob if k in pool else host)[k] = v
    for k, v in g.per_task_defaults:
        if k in pool:
            glob[k] = v
    return host, glob


def on_node(g: TaskGroupRequest, res: Resources, name: str, host: Mapping[str, float]) -> Mapping[str, float]:
    """What one task of ``g`` takes from node ``name``'s ledger: ``host`` plus the defaults that node has."""
    if not g.per_task_defaults:
        return host
    led = res.ledgers.get(name)
    if led is None:
        return host
    extra = {k: v for k, v in g.per_task_defaults if k in led.capacity and k not in res.global_ledger.capacity}
    return {**host, **extra} if extra else host


def room(g: TaskGroupRequest, name: str, res: Resources, job_id: str, host: Mapping[str, float]) -> int:
    """How many more tasks of ``g`` fit on node ``name`` now."""
    host = on_node(g, res, name, host)
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
                here = on_node(g, res, node, host)
                task_amounts = (
                    g.per_task
                    if here is host
                    else g.per_task + tuple(sorted(i for i in here.items() if i[0] not in host))
                )
                for t in tasks:
                    rank = slot.take(req)
                    if here:
                        res.ledger(node).take(here)
                    taken.append((node, rank, dict(here)))
                    placement.tasks.append(TaskPlacement(gi, t, node, rank.cores, rank.gpus, rank.memory, task_amounts))
                if g.exclusive and slot.exclusive_job is None:
                    slot.exclusive_job = job_id
                    exclusive_marked.append(node)
            if glob:
                res.global_ledger.take(glob, g.task_count)
                glob_taken.append({k: v * g.task_count for k, v in glob.items()})
        if ok:
            ok = self._take_per_job(variant, placement)
        if not ok:
            for node, rank, took in reversed(taken):
                res.slots[node].give_back(rank)
                if took:
                    res.ledger(node).give_back(took)
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
        defaults: dict[str, float] = {}
        for g in variant:
            for k, v in g.per_job:
                wanted[k] = max(wanted.get(k, 0.0), v)
            for k, v in g.per_job_defaults:
                defaults[k] = max(defaults.get(k, 0.0), v)
        first = placement.tasks[0].node if placement.tasks else None
        if defaults:  # taken where the attribute is: the global pool, else the first task's node, else nowhere
            node_led = self.res.ledgers.get(first) if first is not None else None
            for k, v in defaults.items():
                if k in self.res.global_ledger.capacity or (node_led is not None and k in node_led.capacity):
                    wanted.setdefault(k, v)
        if not wanted:
            return True
        glob = {k: v for k, v in wanted.items() if k in self.res.global_ledger.capacity}
        host = {k: v for k, v in wanted.items() if k not in glob}
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
            tasks.append(TaskPlacement(group, t, r.node, r.cores, r.gpus, r.memory, g.per_task + g.per_task_defaults))
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
            if len(cands) < len(matcher.cluster.nodes):  # and why the others are not among them
                reasons += [f"{label}{g.where}: {line}" for line in matcher.explain(g.requirement, g.need)]
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

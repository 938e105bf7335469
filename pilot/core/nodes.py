"""The node book: the agents' view of their nodes, the slots placement takes from, and what
matching sees of each node (typed attributes, features, consumable ledgers).

Whether a request can ever fit is cached per request category while the node sets stay the same;
:meth:`NodeBook.invalidate` is the one place those caches are dropped (a node came or went, an
allocation closes or is released).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import structlog

from pilot import site
from pilot.allocations import AllocationBook, PilotAllocation
from pilot.config import Config
from pilot.core import coallocation
from pilot.core.clock import Clock
from pilot.jobs import JobRecord
from pilot.model.node import NodeConfigured
from pilot.request import Request
from pilot.scheduler import NodeSlots, never_fits
from pilot.scheduler.attributes import ConsumableLedger
from pilot.scheduler.cluster import Cluster, idle_cluster
from pilot.scheduler.distribution import Resources, why_not
from pilot.scheduler.matching import Matcher
from pilot.scheduler.passes import AllocationPass
from pilot.scheduler.placement import SlotTracker

log = structlog.get_logger("pilot.core")


@dataclass(slots=True, eq=False)
class AgentRecord:
    name: str
    node: NodeConfigured
    last_seen: float  # monotonic
    state: str = "active"  # active | lost | stopped
    load: list[float] = field(default_factory=list)
    utilized: dict[str, float] = field(default_factory=dict)  # psutil on the node, from heartbeats
    #: Its outstanding processes: (process job id, slot).
    processes: set[tuple[str, int]] = field(default_factory=set)
    #: Highest TASK_EVENTS sequence number handled: acknowledged (after the journal commit) on heartbeats.
    acked: int = 0
    #: False for an agent recovered from the journal until it registers again with this daemon.
    confirmed: bool = True


@dataclass(slots=True)
class AllocationSlots:
    """One allocation as a scheduling pass sees it (a job runs inside one allocation)."""

    held: PilotAllocation
    nodes: list[NodeSlots]
    resources: Resources


#: Senders' last load values kept (:meth:`NodeBook.measures_of_many`); past this, all are forgotten.
_BEAT_LOADS_KEPT: Final = 4096


class NodeBook:
    def __init__(self, *, config: Config, cluster: Cluster, allocations: AllocationBook, clock: Clock) -> None:
        self.config = config
        self.allocations = allocations
        self.clock = clock
        self.agents: dict[str, AgentRecord] = {}
        self.slots: dict[str, NodeSlots] = {}
        #: What matching sees, and what placement takes from: the same NodeSlots as ``slots``, plus
        #: consumable ledgers per node and for the allocation.
        self.cluster = cluster
        self.matcher = Matcher(cluster)
        self.resources = Resources(self.slots, {}, ConsumableLedger.of(cluster.global_capacity))
        self._fits: dict[Any, list[str]] = {}  # request category -> why it can never fit, per node set
        self._idle: Matcher | None = None  # matching on the nodes as they measure idle, per node set
        #: The usable nodes in registration order, per node set: each scheduling pass starts from them
        #: (rebuilt per pass, ten thousand nodes cost more than the pass itself).
        self._usable: list[NodeSlots] | None = None
        self._tracker: SlotTracker | None = None  # of ``_usable``: where its passes may find room
        #: (sender, num_proc) -> the load values its last combined heartbeat gave its nodes
        #: (:meth:`measures_of_many`: an unchanged load is not compared again for each node).
        self._beat_loads: dict[tuple[str, Any], dict[str, Any]] = {}

    def invalidate(self) -> None:
        """The node sets changed: what can ever fit is judged again."""
        self._fits.clear()
        self._idle = None
        self._usable = None
        if self._tracker is not None:
            self._tracker.detach()
            self._tracker = None

    def register(self, node: NodeConfigured) -> AgentRecord:
        self.invalidate()
        agent = self.agents[node.name] = AgentRecord(name=node.name, node=node, last_seen=self.clock.mono)
        self.slots[node.name] = NodeSlots.from_configured(node)
        self.cluster.add(site.match_node(self.config, self.cluster.registry, node))
        capacity = site.node_capacity(self.config, node.name)
        if capacity:
            self.resources.ledgers[node.name] = ConsumableLedger.of(capacity)
        return agent

    def active_agent(self, name: str) -> AgentRecord | None:
        """The agent registered under ``name`` now, if it is active."""
        agent = self.agents.get(name)
        return agent if agent is not None and agent.state == "active" else None

    def gone(self, agent: AgentRecord, *, state: str) -> None:
        """Its agent was lost or stopped: nothing more is placed on the node."""
        self.invalidate()
        self.cluster.remove(agent.name)
        agent.state = state
        slots = self.slots.get(agent.name)
        if slots is not None:
            slots.usable = False

    def measures(
        self, agent: AgentRecord, *, values: Mapping[str, int | float | str] | None, utilized: dict[str, float] | None
    ) -> None:
        """A heartbeat's load values (SGE load_avg, mem_free, ...) refresh what matching sees; its
        utilization (psutil on the node) is the SSS Node's Utilized category."""
        if values is not None:
            m = self.cluster.nodes.get(agent.name)
            if m is not None:
                before = m.values.version
                m.report_load(self.cluster.registry, values)
                if m.values.version != before:
                    self.cluster.touch()
        if utilized is not None:
            agent.utilized = utilized

    def measures_of_many(
        self,
        agents: list[AgentRecord],
        *,
        sender: str,
        values: Mapping[str, int | float | str] | None,
        utilized: dict[str, float] | None,
    ) -> None:
        """One combined heartbeat's values for the nodes it speaks for (one machine's): parsed once per
        number of processors, not once per node -- ten thousand nodes beat every second. The load
        its ``sender``'s last heartbeat gave is compared with the new one once, not at every node."""
        if values is not None:
            nodes, registry, last = self.cluster.nodes, self.cluster.registry, self._beat_loads
            parsed: dict[Any, tuple[dict[str, Any], dict[str, Any] | None]] = {}
            changed = False
            for agent in agents:
                m = nodes.get(agent.name)
                if m is None:
                    continue
                measured = m.values
                key = measured.facts.get("num_proc")
                hit = parsed.get(key)
                if hit is None:
                    load = m.parsed_load(registry, values)
                    before = last.get((sender, key))
                    if before is not None and before == load:
                        load = before  # unchanged: the nodes that hold it keep it, with no compare
                    elif len(last) >= _BEAT_LOADS_KEPT:
                        last.clear()
                    last[(sender, key)] = load
                    hit = parsed[key] = (load, before if before is not load else None)
                load, before = hit
                # A node holding what the last heartbeat gave, which the new one changed, takes it unread.
                if measured.report_parsed_load(load, differs=measured.load is before):
                    changed = True
            if changed:
                self.cluster.touch()
        if utilized is not None:
            for agent in agents:
                agent.utilized = utilized

    def busy(self, held: PilotAllocation) -> bool:
        for name in held.nodes:
            agent = self.agents.get(name)
            slots = self.slots.get(name)
            if (agent is not None and agent.processes) or (slots is not None and slots.holders):
                return True
        return False

    def none_free(self) -> bool:
        """Known without a look at every node: no node a pass places on has a free core."""
        return self._tracker is not None and not self._tracker.free_nodes  # (no tracker: nodes changed)

    def with_free_cores(self) -> Iterator[tuple[str, int]]:
        """(name, free cores) of each usable node with a free core, in registration order, produced as
        asked: with one allocation, from the first node that may have one, and no further than the
        last (the tracker counts them), so a caller that needs a few looks at a few."""
        tracker = self._tracker
        if tracker is None:
            for name, node in self.slots.items():
                if node.usable and node.free_cores:
                    yield name, len(node.free_cores)
            return
        nodes, left = tracker.nodes, tracker.free_nodes
        i = tracker.first_free()
        while left and i < len(nodes):
            node = nodes[i]
            if node.free_cores:
                left -= 1
                if node.usable:
                    yield node.name, len(node.free_cores)
            i += 1

    def free_cores(self) -> int:
        return sum(len(n.free_cores) for n in self.slots.values() if n.usable)

    def hostnames(self, job: JobRecord) -> list[str]:
        return [self.slots[r.node].hostname for r in job.run.ranks]

    # -- what a job holds ---------------------------------------------------------------------------

    def retake(self, job: JobRecord) -> None:
        """A resumed job's slots (and its tasks' consumables), as the journal says it holds them."""
        run = job.run
        placement = run.placement
        for i, rank in enumerate(run.ranks):
            slots = self.slots.get(rank.node)
            if slots is not None and i < len(run.taken) and run.taken[i]:
                slots.take_exact(rank)
                if placement is not None and rank.node in self.resources.ledgers:
                    pool = self.resources.global_ledger.capacity
                    host = {k: v for k, v in placement.tasks[i].amounts if k not in pool}
                    self.resources.ledgers[rank.node].take(host)
                if job.description.resources.exclusive_node_use:
                    slots.exclusive_job = job.id

    def release_rank(self, job: JobRecord, i: int) -> None:
        run = job.run
        if not (i < len(run.taken) and run.taken[i]):
            return
        assert isinstance(run.taken, list)  # i < len(run.taken): it was placed
        run.taken[i] = False
        rank = run.ranks[i]
        node = self.slots.get(rank.node)
        placement = run.placement
        if placement is not None and i < len(placement.tasks):
            pool = self.resources.global_ledger.capacity
            host = {k: v for k, v in placement.tasks[i].amounts if k not in pool}
            if host and rank.node in self.resources.ledgers:
                self.resources.ledgers[rank.node].give_back(host)
        if node is not None:
            node.give_back(rank)
            if node.exclusive_job == job.id and not any(
                h and r.node == rank.node for h, r in zip(run.taken, run.ranks, strict=True)
            ):
                node.exclusive_job = None

    def release_all(self, job: JobRecord) -> None:
        """Everything the job holds: its per-job consumables (licenses), then every rank's slots."""
        placement = job.run.placement
        if placement is not None:
            for level, amounts in placement.per_job:
                ledger = self.resources.global_ledger if level == "global" else self.resources.ledgers.get(level)
                if ledger is not None:
                    ledger.give_back(dict(amounts))
            placement.per_job = []
        for i in range(len(job.run.ranks)):
            self.release_rank(job, i)

    # -- where jobs may go ----------------------------------------------------------------------------

    def allocation_slots(self) -> list[AllocationSlots]:
        """Where a scheduling pass may place: each usable allocation with its usable nodes (a job runs
        inside one allocation). One allocation: everything, as a single-allocation pilot always did."""
        held = self.allocations.held
        if len(held) == 1:  # (at every pass: without a list of the usable ones first)
            (only,) = held.values()
            if not only.usable:
                return []
            nodes = self._usable
            if nodes is None:
                nodes = self._usable = [n for n in self.slots.values() if n.usable]
                self._tracker = SlotTracker(nodes)
            return [AllocationSlots(only, nodes, self.resources)]
        usable = [h for h in held.values() if h.usable]
        out = []
        for h in usable:
            slots = {n: s for n, s in self.slots.items() if n in h.nodes and s.usable}  # registration order
            if slots:
                res = Resources(slots, self.resources.ledgers, self.resources.global_ledger)
                out.append(AllocationSlots(h, list(slots.values()), res))
        return out

    def passes(self) -> list[tuple[PilotAllocation, AllocationPass]]:
        """A new scheduling pass over each allocation a job may be placed in."""
        matcher = self.matcher
        passes = []
        for g in self.allocation_slots():  # (a loop: a comprehension is one call more, at every pass)
            passes.append((g.held, AllocationPass(nodes=g.nodes, resources=g.resources, matcher=matcher)))
        return passes

    def never_fits(self, request: Request) -> list[str]:
        """Why the request can never run here (empty: it may), judged once per request category while
        the node sets stay the same (per submitted job it would cost O(nodes) on the submit path), on the
        nodes' facts and their load values as an idle node measures them. A job runs inside one
        allocation: it fits if it fits one of them (even idle)."""
        key = request.category
        reasons = self._fits.get(key)
        if reasons is not None:
            return reasons
        slots = request.slots
        if request.targets is not None:
            reasons = self._never_coallocated(request)
            if reasons is None:
                return []  # judged when explained, not refused on a guess
        elif slots is not None:
            per = [never_fits(slots, nodes) for nodes in self._capacities()]
            reasons = [] if not per or None in per else [f"it {per[0]}"]
        else:
            assert request.resolved is not None
            if not self._complete():
                return []  # judged when explained, not refused on a guess
            idle = self._idle_matcher()
            per_allocation = [why_not(request.resolved, idle, g.resources, idle=True) for g in self.allocation_slots()]
            reasons = [] if not per_allocation or not all(per_allocation) else per_allocation[0]
        self._fits[key] = reasons
        return reasons

    def _never_coallocated(self, request: Request) -> list[str] | None:
        """A co-allocated job: a target naming nothing of the pilot, or a task group that fits none of
        the allocations its target admits even idle; None while that cannot be judged yet."""
        unknown = coallocation.unknown_targets(request, self.allocations)
        if unknown:
            return unknown
        if not self._complete():
            return None
        idle = self._idle_matcher()
        slots = {g.held.name: g.resources for g in self.allocation_slots()}
        held = [h for h in self.allocations.held.values() if h.name in slots]
        return coallocation.never_fits(request, held, lambda one, h: why_not(one, idle, slots[h.name], idle=True))

    def co_waits(self, request: Request) -> list[str]:
        """What a queued co-allocated job's task groups wait for now (for explain)."""
        slots = {g.held.name: g.resources for g in self.allocation_slots()}
        held = [h for h in self.allocations.held.values() if h.name in slots]
        return coallocation.waiting(request, held, lambda one, h: why_not(one, self.matcher, slots[h.name]))

    def _idle_matcher(self) -> Matcher:
        """Matching on the nodes as an idle node measures them: a busy node may still take a job later."""
        idle = self._idle
        if idle is None:
            idle = self._idle = Matcher(idle_cluster(self.cluster), idle=True)
        return idle

    def _complete(self) -> bool:
        """Every node of every allocation is in, and no more may come: matching sees the whole pilot."""
        allocations = self.allocations
        return (
            bool(self.cluster.nodes)
            and not any(h.usable and len(h.nodes) < h.allocation.nodes for h in allocations.held.values())
            and not allocations.can_grow()
        )

    def _capacities(self) -> list[list[NodeSlots]]:
        """Per usable allocation: its registered nodes, plus the ones it promises that have not
        registered yet ([] while a batch allocation's shape is unknown: anything may fit). With
        auto-allocation, the sites it may draw from count too (a batch site's shape is unknown)."""
        out: list[list[NodeSlots]] = []
        for held in self.allocations.held.values():
            if not held.usable:
                continue
            nodes = [self.slots[n] for n in held.nodes if n in self.slots and self.slots[n].usable]
            a = held.allocation
            if not a.expected_nodes and len(nodes) < a.nodes:
                return [[]]
            nodes += [NodeSlots.from_configured(n) for n in a.expected_nodes if n.name not in self.slots]
            out.append(nodes)
        if self.allocations.can_grow():
            for s in self.allocations.sites:
                layout = getattr(s.lrm, "node_layout", None)
                if layout is None:
                    return [[]]
                out.append([NodeSlots.from_configured(n) for n in layout(s.settings.nodes)])
        return out

"""Exact placement: a rank owns its cores, GPUs and memory until it exits.

Nothing here does I/O; the daemon owns one :class:`NodeSlots` per registered node and calls
:func:`place` / :func:`release`. The same function answers "can this ever fit" against idle slots.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from dataclasses import dataclass, field

from pilot.model.job_description import ResourceRequest
from pilot.model.node import NodeConfigured


@dataclass(slots=True)
class RankPlacement:
    node: str
    cores: list[int]
    gpus: list[int]
    memory: int
    #: Placed behind the busy cores' current holders: the agent starts it when they are reaped.
    behind: bool = False


@dataclass(slots=True)
class NodeSlots:
    """Free and total consumables of one node. Core and GPU lists are kept sorted (packs low ids first)."""

    name: str
    hostname: str
    cores: list[int]
    gpus: list[int]
    memory: int
    free_cores: list[int] = field(default_factory=list)
    free_gpus: list[int] = field(default_factory=list)
    free_memory: int = 0
    exclusive_job: str | None = None
    #: Busy cores -> how many ranks wait behind their holder (at most the pilot's ``backlog``); a core
    #: is free again only once its holder and every rank behind it gave it back.
    waiting: Counter[int] = field(default_factory=Counter)
    holders: int = 0  # ranks currently placed here
    usable: bool = True
    #: The scheduler's tracker of the node set this node is in (None for copies), and its place there.
    tracker: SlotTracker | None = field(default=None, compare=False, repr=False)
    pos: int = field(default=0, compare=False, repr=False)

    @classmethod
    def from_configured(cls, node: NodeConfigured) -> NodeSlots:
        cores = sorted(node.processors)
        gpus = sorted(node.gpus)
        return cls(
            name=node.name,
            hostname=node.hostname,
            cores=cores,
            gpus=gpus,
            memory=node.memory,
            free_cores=list(cores),
            free_gpus=list(gpus),
            free_memory=node.memory,
        )

    def idle_copy(self) -> NodeSlots:
        return NodeSlots(
            name=self.name,
            hostname=self.hostname,
            cores=self.cores,
            gpus=self.gpus,
            memory=self.memory,
            free_cores=list(self.cores),
            free_gpus=list(self.gpus),
            free_memory=self.memory,
        )

    def capacity(self, req: ResourceRequest) -> int:
        """How many ranks of ``req`` fit here now."""
        if not self.usable or self.exclusive_job is not None:
            return 0
        if req.exclusive_node_use and self.holders:
            return 0
        n = len(self.free_cores) // req.cpu_cores_per_process
        if req.gpu_cores_per_process:
            n = min(n, len(self.free_gpus) // req.gpu_cores_per_process)
        if req.memory_per_process:
            n = min(n, self.free_memory // req.memory_per_process)
        return n

    def take(self, req: ResourceRequest) -> RankPlacement:
        c, g, m = req.cpu_cores_per_process, req.gpu_cores_per_process, req.memory_per_process
        cores, self.free_cores = self.free_cores[:c], self.free_cores[c:]
        gpus: list[int] = []
        if g:
            gpus, self.free_gpus = self.free_gpus[:g], self.free_gpus[g:]
        self.free_memory -= m
        self.holders += 1
        if cores and not self.free_cores and (tracker := self.tracker) is not None:
            tracker.free_nodes -= 1
        return RankPlacement(self.name, cores, gpus, m)

    def take_exact(self, rank: RankPlacement) -> None:
        """Take the slots of a rank placed before a daemon restart (recovered from the journal). A core
        already taken was placed behind its holder (``behind``): it waits for that core again."""
        had_free = bool(self.free_cores)
        for c in rank.cores:
            i = bisect.bisect_left(self.free_cores, c)
            if i < len(self.free_cores) and self.free_cores[i] == c:
                del self.free_cores[i]
            else:
                self.waiting[c] += 1
        for g in rank.gpus:
            i = bisect.bisect_left(self.free_gpus, g)
            if i < len(self.free_gpus) and self.free_gpus[i] == g:
                del self.free_gpus[i]
        self.free_memory -= rank.memory
        self.holders += 1
        if had_free and not self.free_cores and (tracker := self.tracker) is not None:
            tracker.free_nodes -= 1

    def give_back(self, rank: RankPlacement) -> None:
        had_free = bool(self.free_cores)
        for c in rank.cores:
            n = self.waiting.get(c)
            if n:  # the next rank waiting behind takes the core over
                if n == 1:
                    del self.waiting[c]
                else:
                    self.waiting[c] = n - 1
            else:
                bisect.insort(self.free_cores, c)
        for g in rank.gpus:
            bisect.insort(self.free_gpus, g)
        self.free_memory += rank.memory
        self.holders -= 1
        if (tracker := self.tracker) is not None:
            tracker.room.add(self.pos)  # fewer behind one of its cores
            if not had_free and self.free_cores:
                tracker.free_nodes += 1
                if self.pos < tracker.mark:
                    tracker.mark = self.pos


class SlotTracker:
    """Which nodes of one node set (the scheduler's, in registration order) may have room, so that
    placing on a full allocation of thousands of nodes does not cost a look at every node per job.

    ``free_nodes`` counts the nodes with a free core and ``mark`` is a position no node before which
    has one: a pass starts its search for free cores there, and fails at once when none has any.
    ``room`` holds the positions of nodes that may have a busy core with fewer than ``depth`` ranks
    behind it: a search drops a node it finds with no room and no free core (nothing but a release,
    between passes, gives it room again) and every release adds it back. NodeSlots keep both current.
    """

    __slots__ = ("cores", "depth", "free_nodes", "mark", "nodes", "room")

    def __init__(self, nodes: list[NodeSlots]) -> None:
        self.nodes = nodes
        for i, node in enumerate(nodes):
            node.tracker, node.pos = self, i
        self.cores = sum(len(n.cores) for n in nodes)
        self.free_nodes = sum(1 for n in nodes if n.free_cores)
        self.mark = 0
        self.room: set[int] = set(range(len(nodes)))
        self.depth = 0  # the depth ``room`` was judged at (another depth: every node again)

    def detach(self) -> None:
        """The node set changed: its nodes are tracked no more (a new tracker takes the new set)."""
        for node in self.nodes:
            if node.tracker is self:
                node.tracker = None

    def first_free(self) -> int:
        """The position of the first node with a free core (len(nodes) when none has one)."""
        nodes, i = self.nodes, self.mark
        if not self.free_nodes:
            return len(nodes)
        while i < len(nodes) and not nodes[i].free_cores:
            i += 1
        self.mark = i
        return i

    def with_room(self, depth: int) -> list[int]:
        """The positions of the nodes that may have room behind a busy core at ``depth``, in order."""
        if depth != self.depth:
            self.room = set(range(len(self.nodes)))
            self.depth = depth
        return sorted(self.room)


def core_count(nodes: list[NodeSlots]) -> int:
    """How many cores ``nodes`` hold (a tracked set's count is kept: no sum over ten thousand nodes)."""
    tracker = _tracker(nodes)
    return tracker.cores if tracker is not None else sum(len(n.cores) for n in nodes)


def _tracker(nodes: list[NodeSlots]) -> SlotTracker | None:
    """The tracker of exactly this node list, or None (a list built for one pass, idle copies)."""
    tracker = nodes[0].tracker if nodes else None
    return tracker if tracker is not None and tracker.nodes is nodes else None


def place(req: ResourceRequest, nodes: list[NodeSlots], *, job_id: str) -> list[RankPlacement] | None:
    """Take slots for every rank of ``req`` or nothing; None when it does not fit now."""
    shares = _shares(req, nodes)
    if shares is None:
        return None
    ranks: list[RankPlacement] = []
    for node, count in shares:
        for _ in range(count):
            ranks.append(node.take(req))
        if req.exclusive_node_use:
            node.exclusive_job = job_id
    return ranks


def _shares(req: ResourceRequest, nodes: list[NodeSlots]) -> list[tuple[NodeSlots, int]] | None:
    total = req.process_count
    if req.node_count is None and req.processes_per_node is None:
        # Pack: fill nodes in order; a single-rank job takes the first node with room.
        shares: list[tuple[NodeSlots, int]] = []
        left = total
        tracker = _tracker(nodes)
        start = 0 if tracker is None else tracker.first_free()
        for i in range(start, len(nodes)):  # (not islice: it steps over the first ``start`` one by one)
            node = nodes[i]
            if not node.free_cores:
                continue  # full (capacity 0): the nodes filled first are passed over for every job after
            cap = node.capacity(req)
            if cap:
                n = min(cap, left)
                shares.append((node, n))
                left -= n
                if not left:
                    return shares
        return None
    if req.processes_per_node is not None:
        want_nodes = req.node_count or total // req.processes_per_node
    else:
        want_nodes = req.node_count or 1
    if want_nodes > len(nodes):
        # Before the per-node list is built: a request for 2**40 nodes must cost nothing, not 8 TB.
        return None
    if req.processes_per_node is not None:
        per = [req.processes_per_node] * want_nodes
    else:
        base, extra = divmod(total, want_nodes)
        per = [base + 1] * extra + [base] * (want_nodes - extra)
    fitting = [(n.capacity(req), i, n) for i, n in enumerate(nodes)]
    fitting = [f for f in fitting if f[0] >= per[-1]]
    if len(fitting) < want_nodes:
        return None
    # Largest shares on the nodes with the most room; ties keep node order.
    fitting.sort(key=lambda f: (-f[0], f[1]))
    chosen = fitting[:want_nodes]
    if any(cap < share for (cap, _, _), share in zip(chosen, per, strict=True)):
        return None
    pairs = sorted(zip(chosen, per, strict=True), key=lambda p: p[0][1])
    return [(node, share) for (_, _, node), share in pairs]


def can_wait_behind(req: ResourceRequest) -> bool:
    """Only the short-task shape queues behind busy cores: one process, cores only. Anything holding
    GPUs, memory, several processes or whole nodes is placed when its slots are really free."""
    return (
        req.process_count == 1
        and not req.gpu_cores_per_process
        and not req.memory_per_process
        and not req.exclusive_node_use
        and req.node_count is None
    )


class BehindPass:
    """What one scheduling pass keeps for :func:`place_behind` (a new one per pass)."""

    __slots__ = ("at", "least", "order")

    def __init__(self) -> None:
        #: Per node with no free core, a heap of its busy cores by how many ranks wait behind each.
        self.least: dict[str, list[tuple[int, int]]] = {}
        #: A tracked node set's nodes that may have room (SlotTracker.with_room), and how many of them at
        #: its front were found without.
        self.order: list[int] | None = None
        self.at = 0


def place_behind(
    req: ResourceRequest, nodes: list[NodeSlots], *, depth: int = 1, behind: BehindPass | None = None
) -> list[RankPlacement] | None:
    """Place one rank behind busy cores with fewer than ``depth`` ranks waiting (free cores stay free
    for ranks that can start now), the least queued cores first, on the first node in order that has
    them; None when no node has enough.

    With ``behind`` (the pass's), a one-core rank on a node with no free core takes the top of that
    node's heap: O(log cores) per rank, not a sort of its cores. Within a pass ``waiting`` only grows by
    this function (a release comes between passes), so an entry is never below its core's count: the
    heap may hold a core back, never put one past ``depth``. On a tracked node set only the nodes that
    may have room are looked at (:class:`SlotTracker`): a full allocation costs what changed."""
    c = req.cpu_cores_per_process
    tracker = _tracker(nodes) if behind is not None else None
    if tracker is None or behind is None:
        for node in nodes:
            placed, _ = _behind_on(node, c, depth, behind)
            if placed is not None:
                return placed
        return None
    if behind.order is None:
        behind.order = tracker.with_room(depth)
    order, room = behind.order, tracker.room
    for i in range(behind.at, len(order)):
        pos = order[i]
        placed, roomless = _behind_on(nodes[pos], c, depth, behind)
        if roomless:
            room.discard(pos)
            if i == behind.at:
                behind.at += 1
        if placed is not None:
            return placed
    return None


def _behind_on(
    node: NodeSlots, c: int, depth: int, behind: BehindPass | None
) -> tuple[list[RankPlacement] | None, bool]:
    """A rank of ``c`` cores behind busy cores of ``node``, or None; and whether the node has no room
    behind any core at ``depth`` that this pass could still make (none of its cores is free: only a
    release, between passes, gives it room again)."""
    if not node.usable:
        return None, False  # (it comes back without a release: looked at again in every pass)
    if node.exclusive_job is not None:
        return None, True  # (its job's release ends that, through give_back)
    busy = len(node.cores) - len(node.free_cores)
    if busy < c:
        return None, False
    waiting = node.waiting
    if c == 1 and behind is not None and not node.free_cores:
        heap = behind.least.get(node.name)
        if heap is None:
            heap = behind.least[node.name] = [(w, x) for x in node.cores if (w := waiting.get(x, 0)) < depth]
            heapq.heapify(heap)
        if not heap:
            return None, True
        w, x = heap[0]
        if w + 1 < depth:
            heapq.heapreplace(heap, (w + 1, x))
        else:
            heapq.heappop(heap)
        waiting[x] += 1
        node.holders += 1
        return [RankPlacement(node.name, [x], [], 0, behind=True)], False
    free = set(node.free_cores)
    candidates = [x for x in node.cores if x not in free and waiting.get(x, 0) < depth]
    if len(candidates) < c:
        return None, not candidates and not node.free_cores
    candidates.sort(key=lambda x: waiting.get(x, 0))  # stable: low core ids first among equals
    chosen = candidates[:c]
    waiting.update(chosen)
    node.holders += 1
    if behind is not None:
        behind.least.pop(node.name, None)  # its heap no longer counts what waits behind these cores
    return [RankPlacement(node.name, chosen, [], 0, behind=True)], False


def release(ranks: list[RankPlacement], nodes: dict[str, NodeSlots], *, job_id: str) -> None:
    for rank in ranks:
        node = nodes.get(rank.node)
        if node is not None:
            node.give_back(rank)
    for rank in ranks:
        node = nodes.get(rank.node)
        if node is not None and node.exclusive_job == job_id:
            node.exclusive_job = None


def never_fits(req: ResourceRequest, nodes: list[NodeSlots]) -> str | None:
    """Why ``req`` can never be placed on these nodes even when idle, or None if it can."""
    if not nodes:
        return None  # nothing known yet; the allocation may still come
    idle = [n.idle_copy() for n in nodes]
    if _shares(req, idle) is not None:
        return None
    c, g, m = req.cpu_cores_per_process, req.gpu_cores_per_process, req.memory_per_process
    biggest = max(len(n.cores) for n in nodes)
    if c > biggest:
        return f"each process asks for {c} cores but the largest node has {biggest}"
    most_gpus = max(len(n.gpus) for n in nodes)
    if g > most_gpus:
        return f"each process asks for {g} GPUs but the most any node has is {most_gpus}"
    most_mem = max(n.memory for n in nodes)
    if m > most_mem:
        return f"each process asks for {m} bytes of memory but the largest node has {most_mem}"
    if req.node_count is not None and req.node_count > len(nodes):
        return f"asks for {req.node_count} nodes but the allocation has {len(nodes)}"
    fit = sum(n.capacity(req) for n in idle)
    return (
        f"asks for {req.process_count} processes of {c} core(s), {g} GPU(s), {m} bytes each"
        + (f" on {req.node_count} node(s)" if req.node_count else "")
        + (f" with {req.processes_per_node} per node" if req.processes_per_node else "")
        + f", but the whole allocation ({len(nodes)} node(s)) holds at most {fit} such processes"
    )

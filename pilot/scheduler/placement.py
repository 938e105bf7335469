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
        return RankPlacement(self.name, cores, gpus, m)

    def take_exact(self, rank: RankPlacement) -> None:
        """Take the slots of a rank placed before a daemon restart (recovered from the journal). A core
        already taken was placed behind its holder (``behind``): it waits for that core again."""
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

    def give_back(self, rank: RankPlacement) -> None:
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
        for node in nodes:
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


def place_behind(
    req: ResourceRequest,
    nodes: list[NodeSlots],
    *,
    depth: int = 1,
    least: dict[str, list[tuple[int, int]]] | None = None,
) -> list[RankPlacement] | None:
    """Place one rank behind busy cores with fewer than ``depth`` ranks waiting (free cores stay free
    for ranks that can start now), the least queued cores first; None when no node has enough.

    ``least``, one scheduling pass's (empty at its start), keeps per node a heap of its busy cores by
    how many ranks wait behind each: one-core ranks on a node with no free core take its top, so a pass
    filling the backlog of a 128-core node costs O(log cores) per rank, not a sort of its cores. Within a
    pass ``waiting`` only grows by this function (a release comes between passes), so an entry is never
    below its core's count: the heap may hold a core back, never put one past ``depth``."""
    c = req.cpu_cores_per_process
    for node in nodes:
        if not node.usable or node.exclusive_job is not None or len(node.cores) - len(node.free_cores) < c:
            continue
        waiting = node.waiting
        if c == 1 and least is not None and not node.free_cores:
            heap = least.get(node.name)
            if heap is None:
                heap = least[node.name] = [(w, x) for x in node.cores if (w := waiting.get(x, 0)) < depth]
                heapq.heapify(heap)
            if not heap:
                continue
            w, x = heap[0]
            if w + 1 < depth:
                heapq.heapreplace(heap, (w + 1, x))
            else:
                heapq.heappop(heap)
            waiting[x] += 1
            node.holders += 1
            return [RankPlacement(node.name, [x], [], 0, behind=True)]
        free = set(node.free_cores)
        candidates = [x for x in node.cores if x not in free and waiting.get(x, 0) < depth]
        if len(candidates) < c:
            continue
        candidates.sort(key=lambda x: waiting.get(x, 0))  # stable: low core ids first among equals
        chosen = candidates[:c]
        waiting.update(chosen)
        node.holders += 1
        if least is not None:
            least.pop(node.name, None)  # its heap no longer counts what waits behind these cores
        return [RankPlacement(node.name, chosen, [], 0, behind=True)]
    return None


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

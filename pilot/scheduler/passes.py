"""One scheduling pass over one allocation: the scheduler's entry for placing any request.

The request's shape picks the path: alike processes holding slots go to exact slot placement (and,
as short tasks, may wait behind a busy core); task groups with requirements go through matching,
with the category cursors a pass keeps so that a long queue costs no more per job than a short one.
"""

from __future__ import annotations

from pilot.request import Request
from pilot.scheduler.distribution import JobPlacement, JobRequest, Resources, SchedulingPass
from pilot.scheduler.matching import Matcher
from pilot.scheduler.placement import BehindPass, NodeSlots, RankPlacement, can_wait_behind, place, place_behind

#: Where a job was placed: a rank per process slot, and (for task groups) which task holds which.
Placed = tuple[list[RankPlacement], JobPlacement | None]


class AllocationPass:
    """Start a new pass whenever resources were released or nodes changed."""

    __slots__ = ("_behind", "_matching", "matcher", "nodes", "resources")

    def __init__(self, *, nodes: list[NodeSlots], resources: Resources, matcher: Matcher) -> None:
        self.nodes = nodes
        self.resources = resources
        self.matcher = matcher
        self._matching: SchedulingPass | None = None
        self._behind: BehindPass | None = None  # made at the first place_behind (most passes have none)

    def place(self, job_id: str, request: Request) -> Placed | None:
        """Take everything the request needs now, or nothing and None."""
        slots = request.slots
        if slots is not None:
            ranks = place(slots, self.nodes, job_id=job_id)
            return None if ranks is None else (ranks, None)
        assert request.resolved is not None
        return self.place_resolved(job_id, request.resolved)

    def place_resolved(self, job_id: str, resolved: JobRequest) -> Placed | None:
        """Task groups with requirements, through matching: everything or nothing and None."""
        matching = self._matching
        if matching is None:
            matching = self._matching = SchedulingPass(self.matcher, self.resources)
        placement = matching.place(job_id, resolved)
        if placement is None:
            return None
        return [RankPlacement(t.node, t.cores, t.gpus, t.memory) for t in placement.tasks], placement

    def place_behind(self, request: Request, *, depth: int) -> Placed | None:
        """A short task (one process, cores only, no pre/post-launch script) behind a busy core whose
        queue is shorter than ``depth``; None for any other shape or when no core has room."""
        slots = request.slots
        if slots is None or not can_wait_behind(slots):
            return None
        d = request.description
        if d.pre_launch or d.post_launch:
            return None
        behind = self._behind
        if behind is None:
            behind = self._behind = BehindPass()
        ranks = place_behind(slots, self.nodes, depth=depth, behind=behind)
        return None if ranks is None else (ranks, None)


__all__ = ["AllocationPass", "Placed"]

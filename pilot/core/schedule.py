"""One scheduling pass: the queue's category heads, highest priority and oldest first, placed on the
allocations' free slots (or, for the short-task shape, behind a busy core), until a head does not fit.
A head that has not fitted for ``pilot.reserve_after`` seconds holds the queue: nothing behind it starts
until it has (reservation of the head job), so a large job is never starved by smaller ones."""

from __future__ import annotations

from itertools import islice

from pilot.allocations import PilotAllocation, site_fields
from pilot.core.coallocation import co_place, stranded
from pilot.core.lifecycle import Lifecycle
from pilot.core.state import CoreState, Part
from pilot.jobs import JobRecord
from pilot.model.job_state import JobState
from pilot.scheduler.passes import AllocationPass, Placed
from pilot.scheduler.placement import core_count


class Scheduler(Part):
    def __init__(self, state: CoreState, *, lifecycle: Lifecycle) -> None:
        super().__init__(state)
        self.lifecycle = lifecycle
        #: The job the queue holds for (see the module's docstring), as of the last pass; None: none.
        self.reserved: JobRecord | None = None

    def run(self) -> None:
        queue = self.book.queue
        self.reserved = None
        if not len(queue) or not self.nodes.slots or self.allocations.stopping:
            return
        # One pass per allocation (a job runs inside one); its category cursors stay valid for the pass.
        passes = self.nodes.passes()
        # While auto-allocation may still add an allocation, jobs wait in the queue, where they count as
        # demand and can go to the new one, not behind a busy core of an allocation held now.
        behind = 0 if self.allocations.room_to_grow() else self.config.pilot.backlog
        share: int | None = None  # no deeper than this behind one core: its fair share of the queue (_share)
        now = self.clock.wall
        # Every allocation takes every job (no walltime, one batch system): no per-job filtering. (A loop:
        # all() and a set comprehension cost three calls more, at every pass of a lone job's turn.)
        open_ended = True
        kinds = set()
        for held, _ in passes:
            open_ended = open_ended and held.allocation.walltime is None
            kinds.add(held.site.lrm.kind)
        start = self.lifecycle.start
        reserve_after = self.config.pilot.reserve_after
        # With priorities in use: orders already waiting behind busy cores, and the highest priority sent
        # behind them (or left waiting in the queue) by this pass -- lower ones ahead of it are asked back.
        # (A pass only adds to ``behind``, at its end: the first ``earlier`` entries are those from before.)
        earlier = len(self.book.behind) if queue.prioritized else 0
        top: int | None = None
        left: int | None = None  # the highest priority left waiting in the queue by this pass
        for category, _ in queue.heads():
            while (job := queue.peek(category)) is not None:
                request = job.request
                duration = request.description.duration
                needs = request.needs_lrm
                eligible = passes
                if not ((open_ended or duration is None) and (needs is None or kinds == {needs})):
                    eligible = [(h, p) for h, p in passes if h.takes(duration, needs, now=now)]
                d = request.description
                if d.queue_name is not None or d.project_name is not None or d.reservation_id is not None:
                    fields = site_fields(d)  # it runs only where its queue, project or reservation is
                    eligible = [(h, p) for h, p in eligible if h.site.serves(fields)]
                placed: Placed | None = None
                if request.targets is not None:  # each task group in an allocation of its own, all or none
                    placed = co_place(job.id, request, eligible)
                else:
                    for _, p in eligible:
                        if (placed := p.place(job.id, request)) is not None:
                            break
                    else:
                        # No room now in any allocation: a short task may wait behind a busy core, unless a
                        # job of a higher priority waits in the queue (it would start after this one).
                        if behind and (left is None or request.priority >= left):
                            if share is None:
                                share = _share(len(queue), passes)
                            for _, p in eligible:
                                if (placed := p.place_behind(request, depth=min(behind, share))) is not None:
                                    break
                            if placed is not None and earlier and top is None:
                                top = request.priority
                if placed is not None:
                    start(job, placed)
                    continue
                if request.targets is not None and (
                    why := stranded(request, self.allocations, duration=duration, needs=needs, now=now)
                ):
                    self.book.end(job, JobState.FAILED, t=now, message=f"not started: {why}")
                    continue
                if self.allocations.may_run_later(duration, needs=needs, now=now):
                    if left is None:
                        left = request.priority
                    if top is None:
                        top = request.priority
                    if reserve_after and now - job.submitted >= reserve_after:
                        self.reserved = job
                    break
                self._never_starts(job, now=now)
            if self.reserved is not None:
                break
        if earlier and top is not None:
            self.lifecycle.yield_to(top, among=list(islice(self.book.behind, earlier)))

    def _never_starts(self, job: JobRecord, *, now: float) -> None:
        """It cannot finish before any allocation ends, and no later allocation will come."""
        held = self.allocations.held.values()
        duration = job.description.duration
        ends = [e for h in held if h.alive and (e := h.end(earliest=True)) is not None]
        left = max(0.0, max(ends, default=now) - now)
        closing = not any(h.usable for h in held)
        self.book.end(
            job,
            JobState.FAILED,
            t=now,
            message=(
                f"not started: JobAttributes.duration of {duration:g} s{_DEFAULT_NOTE if duration == 600 else ''} "
                f"cannot finish before the allocation's walltime ends in {left:.0f} s, and no later allocation "
                "will come; give it a shorter duration (JobAttributes.duration; pilot run/submit --duration)"
                if duration is not None and not closing
                else f"not started: the allocation's walltime ends in {left:.0f} s"
                if ends
                else "not started: no allocation is left and none can come"
            ),
        )


#: A job with no duration of its own gets PSI/J's default: say so, or 600 s looks like the user's choice.
_DEFAULT_NOTE = " (PSI/J's default of 10 minutes when none is set)"


def _share(queued: int, passes: list[tuple[PilotAllocation, AllocationPass]]) -> int:
    """How deep a pass may queue behind one busy core: its fair share of the queue (at least 1). Orders
    behind busy cores are committed to their node: a backlog the whole queue could fill would stack a
    short queue on the first nodes (they are filled in turn). A node that runs slower than the others
    keeps no more than its share, and what waits behind its cores past ``RECLAIM_AFTER`` while another
    core is free is asked back (``Lifecycle.reclaim``). A shallower depth keeps each node's orders few,
    and its agent then pays its fixed costs per task: each start and exit reported alone."""
    cores = sum(core_count(p.nodes) for _, p in passes)
    return max(1, -(-queued // cores)) if cores else 1

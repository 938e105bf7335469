"""One scheduling pass: the queue's category heads, oldest first, placed on the allocations' free
slots (or, for the short-task shape, behind a busy core), until a head does not fit."""

from __future__ import annotations

from pilot.core.lifecycle import Lifecycle
from pilot.core.state import CoreState, Part
from pilot.jobs import JobRecord
from pilot.launchers import LAUNCHERS
from pilot.model.job_state import JobState
from pilot.scheduler import RankPlacement, can_wait_behind, place, place_behind
from pilot.scheduler.distribution import SchedulingPass


def needs_lrm(job: JobRecord) -> str | None:
    """The batch system a job's launcher needs (srun: Slurm), so it is placed only there."""
    if job.sss is None:
        return LAUNCHERS[job.description.launcher].needs_lrm
    return next((n for g in job.sss.groups if (n := LAUNCHERS[g.launcher].needs_lrm) is not None), None)


class Scheduler(Part):
    def __init__(self, state: CoreState, *, lifecycle: Lifecycle) -> None:
        super().__init__(state)
        self.lifecycle = lifecycle

    def run(self) -> None:
        queue = self.book.queue
        if not len(queue) or not self.nodes.slots or self.allocations.stopping:
            return
        groups = self.nodes.groups()
        # While auto-allocation may still add an allocation, jobs wait in the queue, where they count as
        # demand and can go to the new one, not behind a busy core of an allocation held now.
        behind = 0 if self.allocations.room_to_grow() else self.config.pilot.backlog
        now = self.clock.wall
        sss_passes: dict[str, SchedulingPass] = {}  # one per allocation and pass: category cursors stay valid
        # Every allocation takes every job (no walltime, one batch system): no per-job filtering.
        open_ended = all(g.held.allocation.walltime is None for g in groups)
        kinds = {g.held.site.lrm.kind for g in groups}
        start = self.lifecycle.start
        for key, _ in queue.heads():
            while (job := queue.peek(key)) is not None:
                d = job.description
                needs = needs_lrm(job)
                eligible = groups
                if not ((open_ended or d.duration is None) and (needs is None or kinds == {needs})):
                    eligible = [g for g in groups if g.held.takes(d.duration, needs, now=now)]
                ranks: list[RankPlacement] | None = None
                if job.sss is not None:
                    for g in eligible:
                        sss_pass = sss_passes.get(g.held.name)
                        if sss_pass is None:
                            sss_pass = sss_passes[g.held.name] = SchedulingPass(self.nodes.matcher, g.resources)
                        if (placement := sss_pass.place(job.id, job.sss.request)) is not None:
                            job.sss.placement = placement
                            ranks = [RankPlacement(t.node, t.cores, t.gpus, t.memory) for t in placement.tasks]
                            break
                else:
                    for g in eligible:
                        if (ranks := place(d.resources, g.nodes, job_id=job.id)) is not None:
                            break
                    if (
                        ranks is None
                        and behind
                        and can_wait_behind(d.resources)
                        and not (d.pre_launch or d.post_launch)
                    ):
                        # No free core in any allocation: wait at an agent behind a busy one.
                        for g in eligible:
                            if (ranks := place_behind(d.resources, g.nodes, depth=behind)) is not None:
                                break
                if ranks is not None:
                    start(job, ranks)
                    continue
                if self.allocations.may_run_later(d.duration, needs=needs, now=now):
                    break
                self._never_starts(job, now=now)

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
                f"not started: JobAttributes.duration of {duration:g} s cannot finish before the "
                f"allocation's walltime ends in {left:.0f} s, and no later allocation will come"
                if duration is not None and not closing
                else f"not started: the allocation's walltime ends in {left:.0f} s"
                if ends
                else "not started: no allocation is left and none can come"
            ),
        )

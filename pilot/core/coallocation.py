"""Co-allocation: a job whose task groups name where each runs (JRDL subjobs with a
``resourceManagerContact`` or ``jobManagerType``) starts when every group can start, each inside one
allocation its target admits, or not at all: a group that finds no room gives back what the groups
before it took in the same pass. Once started it is one job: a process that fails stops the others
and the job fails as a whole.

A contact names a site of the pilot (its name in the config: ``main`` for ``[allocation]``) or one of
its allocations (``site/a2``); a job manager names the kind of batch system (``fork``: the local LRM,
``pbs``: a PBS site). What names nothing of the pilot is refused at submit, listing what does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pilot.allocations import AllocationBook, PilotAllocation
from pilot.request import JOB_MANAGER_LRMS, Request, Target
from pilot.scheduler.distribution import JobPlacement, JobRequest, release
from pilot.scheduler.passes import AllocationPass, Placed
from pilot.scheduler.placement import RankPlacement


def admits(target: Target | None, held: PilotAllocation) -> bool:
    """Whether a group with this target may run in allocation ``held``."""
    return target is None or target.admits(site=held.site.name, allocation=held.name, lrm=held.site.lrm.kind)


def group_requests(request: Request) -> list[list[tuple[Target | None, JobRequest]]]:
    """Per variant, each task group as a request of its own, with its target."""
    resolved = request.resolved
    targets = request.targets
    assert resolved is not None and targets is not None, "only a co-allocated job of task groups"
    return [
        [(t, JobRequest(g.where, ((g,),), resolved.duration)) for t, g in zip(targets, variant, strict=True)]
        for variant in resolved.variants
    ]


def co_place(job_id: str, request: Request, passes: Sequence[tuple[PilotAllocation, AllocationPass]]) -> Placed | None:
    """Every task group placed inside one allocation its target admits (the first with room, in the
    order of ``passes``), all of them or none (then nothing stays taken) and None."""
    for index, groups in enumerate(group_requests(request)):
        done: list[tuple[AllocationPass, JobPlacement]] = []
        for target, one in groups:
            for held, p in passes:
                if not admits(target, held):
                    continue
                placed = p.place_resolved(job_id, one)
                if placed is not None:
                    assert placed[1] is not None
                    done.append((p, placed[1]))
                    break
            else:
                for p, placement in reversed(done):
                    release(placement, p.resources, job_id=job_id)
                break
        else:
            tasks = []
            per_job = []
            for group, (_, placement) in enumerate(done):
                for t in placement.tasks:
                    t.group = group
                    tasks.append(t)
                per_job += placement.per_job
            ranks = [RankPlacement(t.node, t.cores, t.gpus, t.memory) for t in tasks]
            return ranks, JobPlacement(tasks, index, per_job)
    return None


def stranded(
    request: Request, book: AllocationBook, *, duration: float | None, needs: str | None, now: float
) -> str | None:
    """Why a co-allocated job can never start (None: it may): a part whose target no usable allocation
    admits (or none that can still finish it), and auto-allocation cannot bring one."""
    for target in dict.fromkeys(t for t in request.targets or () if t is not None):
        if any(h.usable and admits(target, h) and h.takes(duration, needs, now=now) for h in book.held.values()):
            continue
        if (
            target.allocation is None
            and book.can_grow()
            and any(
                target.admits(site=s.name, allocation="", lrm=s.lrm.kind) and s.could_take(duration, needs)
                for s in book.sites
            )
        ):
            continue
        return f"{target.named}: no allocation it may run in is left, and none can come"
    return None


def waiting(
    request: Request,
    held: Sequence[PilotAllocation],
    why_not_now: Callable[[JobRequest, PilotAllocation], list[str]],
) -> list[str]:
    """What each task group of a queued co-allocated job waits for: room in an allocation its target
    admits (a group that fits now waits for the others, since all start together)."""
    lines: list[str] = []
    for target, one in group_requests(request)[0]:
        where = [h for h in held if admits(target, h)]
        per = [(h, why_not_now(one, h)) for h in where]
        fits = [h for h, reasons in per if not reasons]
        if fits:
            lines.append(f"{one.where}: has room now in {_name(fits[0])}; it starts when every part can")
        elif not where:
            lines.append(f"{one.where}: no allocation it may run in is usable now")
        else:
            lines += [f"{one.where}: in {_name(h)}: {r}" for h, reasons in per for r in reasons]
    return lines


def _name(held: PilotAllocation) -> str:
    return f"{held.site.name}/{held.name}"


def contacts(book: AllocationBook) -> list[str]:
    """What a resourceManagerContact may name: each site, and each of its allocations alive now."""
    out = []
    for site in book.sites:
        out.append(site.name)
        out += [f"{site.name}/{h.name}" for h in book.held.values() if h.site is site and h.alive]
    return out


def unknown_targets(request: Request, book: AllocationBook) -> list[str]:
    """Why a target names nothing of this pilot (empty: each names something)."""
    reasons: list[str] = []
    for target in dict.fromkeys(t for t in request.targets or () if t is not None):
        sites = [s for s in book.sites if target.site in (None, s.name)]
        if not sites:
            reasons.append(f"{target.named} names no site or allocation of this pilot; " + _known(book))
            continue
        if target.allocation is not None and not any(
            h.name == target.allocation and h.site in sites and h.alive for h in book.held.values()
        ):
            reasons.append(f"{target.named} names no allocation of this pilot that is alive; " + _known(book))
            continue
        if target.lrm is not None and not any(s.lrm.kind == target.lrm for s in sites):
            kinds = ", ".join(f"{s.name} ({_manager(s.lrm.kind)})" for s in book.sites)
            named = " of that name" if target.site is not None else ""
            what = _manager(target.lrm)
            reasons.append(f"{target.named}: no site of this pilot{named} is a {what} site; its sites: {kinds}")
    return reasons


def never_fits(
    request: Request,
    held: Sequence[PilotAllocation],
    why_not_idle: Callable[[JobRequest, PilotAllocation], list[str]],
) -> list[str]:
    """Why some task group fits none of the allocations its target admits, even idle (empty: each fits
    one). ``held``: the usable allocations; ``why_not_idle``: a group's reasons in one of them."""
    variants = group_requests(request)
    reasons: list[str] = []
    for groups in variants:
        missing: list[str] = []
        for target, one in groups:
            where = [h for h in held if admits(target, h)]
            if not where:
                named = target.named if target is not None else one.where
                missing.append(f"{named}: no allocation it may run in is held now, and none can come")
                continue
            per = [why_not_idle(one, h) for h in where]
            if all(per):
                missing += [f"in {_name(h)}: {r}" for h, rs in zip(where, per, strict=True) for r in rs]
        if not missing:
            return []
        reasons += missing
    return reasons


def _known(book: AllocationBook) -> str:
    return "known: " + ", ".join(contacts(book)) + " (a site's name in the config, or site/allocation)"


def _manager(kind: str) -> str:
    """A batch system kind in jobManagerType's words where it has one (local: fork)."""
    return next((m for m, k in JOB_MANAGER_LRMS.items() if k == kind), kind)


__all__ = [
    "admits",
    "co_place",
    "contacts",
    "group_requests",
    "never_fits",
    "stranded",
    "unknown_targets",
    "waiting",
]

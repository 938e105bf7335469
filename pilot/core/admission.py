"""Admission: a SUBMIT's jobs checked against this pilot (launcher, whether they can ever fit,
dependencies) and accepted into the job book, or refused with a reason that says what to change."""

from __future__ import annotations

from typing import Any

from pilot.allocations import Site, site_fields
from pilot.core.leases import leased_id
from pilot.core.state import CoreState, Part
from pilot.frontends import compile_entry, is_document
from pilot.jobs import JobRecord
from pilot.launchers import LAUNCHERS
from pilot.model.job_description import DescriptionError
from pilot.request import Request

#: Why a job whose client gave up on its submit does not run (refused, or canceled if it was accepted).
ABANDONED = "withdrawn: its client gave up waiting for the pilot's answer to its submit"


def no_room(limit: int) -> dict[str, Any]:
    """The answer to a job the pilot has no room for (``pilot.max_queued``): nothing of it was carried
    out, so its client sends it again (``retry``)."""
    error = f"the pilot holds {limit} unfinished jobs (pilot.max_queued); submit again when some have ended"
    return {"error": error, "transient": True, "retry": True}


class Admission(Part):
    def __init__(self, state: CoreState) -> None:
        super().__init__(state)
        #: 'pilot down --drain': no new jobs; the pilot stops once the accepted ones ended.
        self.draining = False
        #: Set by the shell while its journal cannot take new jobs: what to tell their submitters.
        self.refusing: str | None = None
        #: Submit ids whose client gave up waiting for their answer (:meth:`abandon`): refused from now on.
        self.abandoned: set[str] = set()

    def refusal(self) -> dict[str, Any] | None:
        """Why this pilot takes no new job now (the same answer for every job of a request), or None."""
        if self.refusing is not None:
            return {"error": self.refusing, "transient": True}
        if self.allocations.stopping or self.draining:
            what = "draining ('pilot down --drain')" if self.draining else "stopping"
            return {"error": f"the pilot is {what}; submit to a new one", "transient": True}
        if self.allocations.all_over():
            why = self.allocations.why_over()
            return {
                "error": f"this pilot's last allocation has ended ({why or 'pilot status says why'}); "
                "start a new pilot",
                "transient": True,
            }
        return None

    def submit(
        self,
        ident: bytes,
        jobs: list[Any],
        submit_ids: list[str | None] | None,
        *,
        again: bool = True,
        max_queued: int | None = None,
    ) -> list[dict[str, Any]]:
        """The results of a SUBMIT's jobs, in order: each an id or an error. ``again``: the client may have
        sent these submit ids before (to this daemon or an earlier one), so the journal is asked too.
        ``max_queued``: the most unfinished jobs this pilot holds; the new jobs past it are answered
        :func:`no_room` (a request is taken in part, not whole past the limit)."""
        refusal = self.refusal()
        room = None if max_queued is None else max_queued - self.book.unfinished()
        if submit_ids is not None:
            return self._submit_with_ids(ident, jobs, submit_ids, refusal, again=again, room=room, limit=max_queued)
        if refusal is not None:
            return [refusal] * len(jobs)
        fit: dict[int, Request] = {}
        if room is None or room >= len(jobs):
            return [self._submit_one(ident, raw, fit=fit) for raw in jobs]
        results: list[dict[str, Any]] = []
        for raw in jobs:
            if room <= 0:
                assert max_queued is not None
                results.append(no_room(max_queued))
                continue
            result = self._submit_one(ident, raw, fit=fit)
            room -= _made(result)
            results.append(result)
        return results

    def abandon(self, submit_ids: list[str]) -> dict[str, list[str]]:
        """Submit ids whose client gave up waiting for the pilot's answer and told its caller that the job
        will not run: a SUBMIT with one of them still on its way is refused from now on; returns the jobs
        already accepted under them (submit id -> job ids), which the caller cancels -- both sides agree."""
        self.abandoned.update(submit_ids)
        return self._made_under(submit_ids, journaled=True)

    def _made_under(self, submit_ids: list[str], *, journaled: bool) -> dict[str, list[str]]:
        """The jobs this pilot accepted under these submit ids: submit id -> job ids, oldest first. Those
        committed are looked up in the journal only if ``journaled`` (an indexed query: a submit sent
        the first time need not pay it)."""
        book = self.book
        fresh = book.fresh_by_submit_id
        made = {submit_id: fresh[submit_id] for submit_id in submit_ids if submit_id in fresh}
        rest = [submit_id for submit_id in submit_ids if submit_id not in made] if journaled else None
        if rest and book.history is not None:
            made.update(book.history.jobs_by_submit_id(rest))
        return made

    def _submit_with_ids(
        self,
        ident: bytes,
        jobs: list[Any],
        submit_ids: list[str | None],
        refusal: dict[str, Any] | None,
        *,
        again: bool,
        room: int | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Jobs (or documents) named by the client's submit ids. A submit id this pilot knows is the
        jobs that submit id made before -- its answer was lost with a connection or a daemon, and the
        client sent it again -- which this client now follows, even while new jobs are refused: they
        never run twice. The others are submitted as usual."""
        known = self._made_under([submit_id for submit_id in submit_ids if submit_id is not None], journaled=again)
        fit: dict[int, Request] = {}
        results: list[dict[str, Any]] = []
        for raw, submit_id in zip(jobs, submit_ids, strict=True):
            made = known.get(submit_id) if submit_id is not None else None
            leased = leased_id(submit_id)
            if leased is not None and made is None:
                state = self.book.leases.state(leased)
                if state == "used" or (state == "unknown" and self.book.known(str(leased))):
                    made = [str(leased)]  # it made its job before (its answer was lost): followed
                elif state == "unknown" and leased > self.book.seq:
                    self.book.adopt(leased)  # leased by a predecessor whose journal is gone: nobody else's
                elif state == "unknown":
                    results.append({"error": _not_leased(leased), "unleased": True})
                    continue
            if submit_id is not None and submit_id in self.abandoned:
                results.append({"error": ABANDONED})
            elif made is not None:
                results.append(self._follow_again(ident, raw, made))
            elif refusal is not None:
                results.append(refusal)
            elif room is not None and room <= 0:
                assert limit is not None
                results.append(no_room(limit))
            else:
                result = self._submit_one(ident, raw, submit_id=submit_id, leased=leased, fit=fit)
                if submit_id is not None and ("id" in result or "ids" in result):
                    known[submit_id] = result["ids"] if "ids" in result else [result["id"]]
                if room is not None:
                    room -= _made(result)
                results.append(result)
        return results

    def _follow_again(self, ident: bytes, raw: Any, made: list[str]) -> dict[str, Any]:
        """The answer to a submit sent again whose jobs this pilot made: those jobs, followed by
        ``ident``, each with its status now; a document's answer lists them all, as its first one did."""
        if not is_document(raw):
            return self.attach(ident, made[0])
        answers = [self.attach(ident, job_id) for job_id in made]
        try:
            warnings = compile_entry(raw, cluster=self.nodes.cluster).warnings
        except DescriptionError:
            warnings = []  # it compiled when it was accepted: only the warnings are at stake
        return {"ids": made, "statuses": [answer.get("status") for answer in answers], "warnings": warnings}

    def attach(self, ident: bytes, job_id: str) -> dict[str, Any]:
        """Follow a job: an unfinished one's statuses go to ``ident`` from now on."""
        job = self.book.jobs.get(job_id)
        if job is None:
            history = self.book.history
            found = history.job_status(job_id) if history is not None else None
            if found is None:
                leased = leased_id(job_id)
                if leased is not None and self.book.leases.state(leased) == "free":
                    # Leased to a client whose submit is on its way: the asker may try again shortly.
                    return {"error": f"job {job_id} is not in this pilot yet: its submit has not come", "pending": True}
                return {"error": f"no job {job_id!r} in this pilot"}
            status, name = found  # ended: its final status is all there is to follow
            return {"id": job_id, "status": status, "name": name}
        if ident not in job.subscribers:
            job.subscribers += (ident,)
        return {"id": job_id, "status": job.status(), "name": job.description.name}

    def _submit_one(
        self,
        ident: bytes,
        raw: Any,
        *,
        submit_id: str | None = None,
        leased: int | None = None,
        fit: dict[int, Request],
    ) -> dict[str, Any]:
        """One entry of a SUBMIT request (the pilot takes new jobs: :meth:`refusal` said so), compiled by
        its language's front-end. Every job it holds is checked (launchers, whether it can ever fit,
        dependencies and cycles) before any is accepted: all are accepted or none, every one of them under
        ``submit_id`` if given. ``leased``: the id leased for the job, which it gets (a document's jobs
        cannot have one: the pilot names them). ``fit``: the requests one SUBMIT already passed
        (:meth:`_check`), by id: the jobs of a bulk submit share one request (the front-end's), checked once."""
        book = self.book
        now = self.clock.wall
        try:
            submission = compile_entry(raw, cluster=self.nodes.cluster)
            if leased is not None and submission.document:
                raise DescriptionError(
                    f"submit id {submit_id!r} is a leased job id, which a document's jobs cannot have; "
                    "send the document under a submit id of the client's own"
                )
            records: list[JobRecord] = []
            graphed = False  # jobs without dependencies (or an id to be found by) stay out of the graph
            for i, request in enumerate(submission.requests):
                graphed = graphed or bool(request.dependencies or request.local_id)
                if fit.get(id(request)) is not request:
                    self._check(request)
                    fit[id(request)] = request
                job = JobRecord(
                    id=str(leased) if leased is not None else book.next_id(i),
                    description=request.description,
                    submitted=now,
                    state_time=now,
                    request=request,
                    user_hold=request.hold,
                )
                records.append(job)
            if graphed:
                book.graph.add([job.request.new_job(job.id) for job in records], known=book.known, named=book.named)
        except DescriptionError as exc:  # SssError is one
            return {"error": str(exc)}
        for job, entry in zip(records, submission.entries, strict=True):
            if graphed:
                job.edges = book.graph.edges_of(job.id) or None
                if job.edges is not None:
                    entry = dict(entry, edges=job.edges)
                else:
                    book.graph.forget([job.id])  # was only there to be found by id or name
            if job.user_hold:
                entry = dict(entry, hold=True)
            book.accept(ident, job, entry, submit_id=submit_id)
        if submission.document:
            return {"ids": [job.id for job in records], "warnings": submission.warnings, "time": now}
        return {"id": records[0].id, "time": now}

    def _check(self, request: Request) -> None:
        """DescriptionError unless the request's launchers, sites and shape can ever run here. Depends on
        the request and this pilot's nodes only, which one SUBMIT does not change."""
        for launcher, named_by in request.launchers():
            self._check_launcher(launcher, what=named_by)
        self._check_sites(request)
        never = self.nodes.never_fits(request)
        if never:
            where = request.where or "the job"
            raise DescriptionError(f"{where} can never run in this allocation: " + "; ".join(never))

    def _check_sites(self, request: Request) -> None:
        """A job naming a queue, project or reservation (PSI/J ``queue_name``, ``project_name``,
        ``reservation_id``; SSS <Queue>, <Project>, <Reservation>) runs only in allocations of sites that
        have it; none: refused, saying what each site has."""
        d = request.description
        if d.queue_name is None and d.project_name is None and d.reservation_id is None:
            return
        fields = site_fields(d)
        sites = self.allocations.sites
        if any(site.serves(fields) for site in sites):
            return
        asked = ", ".join(f"JobAttributes.{f} = {v!r}" for f, v in fields)
        have = "; ".join(f"site {site.name!r} ({site.lrm.kind}): " + _offered(site, fields) for site in sites)
        raise DescriptionError(
            f"{asked}: no allocation of this pilot runs there ({have}); leave it unset (the pilot places the job "
            "in its own allocations) or give the pilot a site with it"
        )

    def _check_launcher(self, launcher: str, *, what: str) -> None:
        """A launcher that needs another batch system (srun outside Slurm) is refused at submit."""
        if launcher not in LAUNCHERS:
            raise DescriptionError(
                f"{what} {launcher!r} is not available in this pilot; use one of {', '.join(LAUNCHERS)}"
            )
        needs = LAUNCHERS[launcher].needs_lrm
        if needs is None:
            return
        kinds = sorted({s.lrm.kind for s in self.allocations.sites})
        if needs not in kinds:
            raise DescriptionError(
                f"{what} {launcher!r} needs a {needs.capitalize()} allocation, and this pilot's "
                f"{'are' if len(kinds) > 1 else 'is'} {' and '.join(map(repr, kinds))}; use 'multiple' or 'mpirun'"
            )


def _offered(site: Site, fields: list[tuple[str, str]]) -> str:
    """What a site's allocations have for these job fields, in its batch system's words."""
    parts = []
    for f, _ in fields:
        key = site.lrm.job_fields.get(f)
        value = site.lrm.offers(f)
        if key is None:
            parts.append(f"no {f.split('_')[0]}s")
        elif value is None:
            parts.append(f"no {key} set")
        else:
            parts.append(f"{key} {value!r}")
    return ", ".join(parts)


def _not_leased(job_id: int) -> str:
    return (
        f"job id {job_id} was not leased to a client by this pilot: the pilot was started afresh on this run "
        "directory since the client leased it (its journal lost) and has given the id to another job since; "
        "submit the job again (the client leases new ids)"
    )


def _made(result: dict[str, Any]) -> int:
    """How many jobs an entry's result made (a document's several, a refused entry none)."""
    ids = result.get("ids")
    return len(ids) if isinstance(ids, list) else int("id" in result)

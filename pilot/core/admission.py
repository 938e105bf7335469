"""Admission: a SUBMIT's jobs checked against this pilot (launcher, whether they can ever fit,
dependencies) and accepted into the job book, or refused with a reason that says what to change."""

from __future__ import annotations

import dataclasses
from typing import Any

from pilot.core.state import CoreState, Part
from pilot.jobs import JobRecord
from pilot.launchers import LAUNCHERS
from pilot.model.job_description import DescriptionError, JobDescription
from pilot.scheduler.dag import DEPENDS_ON, NewJob, dependencies_from_custom
from pilot.sss_jobs import SssJob, prepare, read_submission


class Admission(Part):
    def __init__(self, state: CoreState) -> None:
        super().__init__(state)
        #: 'pilot down --drain': no new jobs; the pilot stops once the accepted ones ended.
        self.draining = False

    def refusal(self) -> dict[str, Any] | None:
        """Why this pilot takes no new job now (the same answer for every job of a request), or None."""
        if self.allocations.stopping or self.draining:
            what = "draining ('pilot down --drain')" if self.draining else "stopping"
            return {"error": f"the pilot is {what}; submit to a new one", "transient": True}
        if self.allocations.all_over():
            return {
                "error": "this pilot's last allocation has ended ('pilot status' says why); start a new pilot",
                "transient": True,
            }
        return None

    def submit(self, ident: bytes, jobs: list[Any], keys: list[str | None] | None) -> list[dict[str, Any]]:
        """The results of a SUBMIT's jobs, in order: each an id or an error."""
        refusal = self.refusal()
        if keys is not None:
            return self._submit_keyed(ident, jobs, keys, refusal)
        if refusal is not None:
            return [refusal] * len(jobs)
        return [self._submit_one(ident, raw) for raw in jobs]

    def _submit_keyed(
        self, ident: bytes, jobs: list[Any], keys: list[str | None], refusal: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        """Jobs named by the client's keys (pipelined submits). A key this pilot knows is the job that
        key made before -- its answer was lost with a connection or a daemon, and the client sent it
        again -- which this client now follows, even while new jobs are refused: it never runs twice.
        The others are submitted as usual."""
        book = self.book
        named = [k for k in keys if k is not None]
        known = {k: book.fresh_keys[k] for k in named if k in book.fresh_keys}
        rest = [k for k in named if k not in known]
        if rest and book.history is not None:
            known.update(book.history.jobs_by_key(rest))
        results: list[dict[str, Any]] = []
        for raw, key in zip(jobs, keys, strict=True):
            job_id = known.get(key) if key is not None else None
            if job_id is not None:
                results.append(self.attach(ident, job_id))
            elif refusal is not None:
                results.append(refusal)
            else:
                result = self._submit_one(ident, raw, key=key)
                if key is not None and "id" in result:
                    known[key] = result["id"]
                results.append(result)
        return results

    def attach(self, ident: bytes, job_id: str) -> dict[str, Any]:
        """Follow a job: an unfinished one's statuses go to ``ident`` from now on."""
        job = self.book.jobs.get(job_id)
        if job is None:
            history = self.book.history
            found = history.job_status(job_id) if history is not None else None
            if found is None:
                return {"error": f"no job {job_id!r} in this pilot"}
            status, name = found  # ended: its final status is all there is to follow
            return {"id": job_id, "status": status, "name": name}
        job.subscribers.add(ident)
        return {"id": job_id, "status": job.status(), "name": job.description.name}

    def _submit_one(self, ident: bytes, raw: Any, *, key: str | None = None) -> dict[str, Any]:
        """One job of a SUBMIT request (the pilot takes new jobs: :meth:`refusal` said so)."""
        if isinstance(raw, dict) and "sss" in raw:
            if key is not None:
                return {"error": "an SSS submission carries no key: submit it with submit_sss()"}
            return self._submit_sss(ident, raw)
        book = self.book
        try:
            description = JobDescription.from_wire(raw)
            if description.launcher not in LAUNCHERS:
                raise DescriptionError(
                    f"JobSpec.launcher {description.launcher!r} is not available in this pilot; "
                    f"use one of {', '.join(LAUNCHERS)}"
                )
            self._check_launcher(description.launcher, what="JobSpec.launcher")
            reason = self.nodes.never_fits(description)
            if reason is not None:
                raise DescriptionError(f"the job can never run in this allocation: it {reason}")
            job_id = str(book.seq + 1)
            custom = description.custom_attributes
            deps = dependencies_from_custom(custom) if DEPENDS_ON in custom else []
            if deps:  # a job without dependencies stays out of the graph: nothing to pay on the hot path
                book.graph.add(
                    [NewJob(job_id, description.name, None, tuple(deps), f"job {job_id}")],
                    known=book.known,
                    named=book.named,
                )
        except DescriptionError as exc:
            return {"error": str(exc)}
        job = JobRecord(id=job_id, description=description, submitted=self.clock.wall, state_time=self.clock.wall)
        job.edges = book.graph.edges_of(job_id) or None
        raw = dict(raw, edges=job.edges) if job.edges else raw  # raw: from_wire accepted it
        book.accept(ident, job, raw, key=key)
        return {"id": job.id, "time": job.state_time}

    def _submit_sss(self, ident: bytes, raw: dict[str, Any]) -> dict[str, Any]:
        """An SSS Job or JobGroup: every job checked (model, distribution, matching against this
        allocation, dependencies and cycles) before any is accepted; all are accepted or none."""
        document = raw.get("sss")
        if not isinstance(document, str | bytes):
            return {"error": "an SSS submission carries its XML document as text under 'sss'"}
        book = self.book
        now = self.clock.wall
        try:
            jobs, warnings = read_submission(document)
            batch: list[tuple[JobRecord, SssJob]] = []
            for i, source in enumerate(jobs):
                job_id = str(book.seq + 1 + i)
                sss = prepare(source, self.nodes.cluster)
                for g in sss.groups:
                    self._check_launcher(g.launcher, what=f'{sss.effective.where}: Extension name="Launcher"')
                self.nodes.check_sss(sss)
                description = dataclasses.replace(sss.groups[0].template.description, launcher="single")
                job = JobRecord(id=job_id, description=description, submitted=now, state_time=now)
                job.sss, job.user_hold = sss, sss.hold
                batch.append((job, sss))
            book.graph.add([sss.new_job(job.id) for job, sss in batch], known=book.known, named=book.named)
        except DescriptionError as exc:  # SssError is one
            return {"error": str(exc)}
        for job, sss in batch:
            job.edges = book.graph.edges_of(job.id) or None
            if job.edges is None:  # found by id or name when someone depends on it
                book.graph.forget([job.id])
            entry = {**job.description.to_wire(), "sss": sss.xml, "edges": job.edges, "hold": job.user_hold}
            book.accept(ident, job, entry)
        return {"ids": [job.id for job, _ in batch], "warnings": warnings, "time": now}

    def _check_launcher(self, launcher: str, *, what: str) -> None:
        """A launcher that needs another batch system (srun outside Slurm) is refused at submit."""
        needs = LAUNCHERS[launcher].needs_lrm
        if needs is None:
            return
        kinds = sorted({s.lrm.kind for s in self.allocations.sites})
        if needs not in kinds:
            raise DescriptionError(
                f"{what} {launcher!r} needs a {needs.capitalize()} allocation, and this pilot's "
                f"{'are' if len(kinds) > 1 else 'is'} {' and '.join(map(repr, kinds))}; use 'multiple' or 'mpirun'"
            )

"""The job book: every unfinished job, its phase, the queue, the blocked set and the dependency graph.

:meth:`JobBook.move` is the one place a job's phase changes: it checks the move against the table in
:mod:`pilot.core.phase` and keeps queue membership, the blocked set, the jobs behind busy cores and the
journal's dirty set in step. :meth:`JobBook.set_state` is the one place a PSI/J state changes: it keeps
the per-state counts, the subscribers' statuses and the dependents' verdicts in step.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from pilot.core.clock import Clock
from pilot.core.leases import META as LEASES_META
from pilot.core.leases import MOST, Leases
from pilot.core.outbox import Outbox
from pilot.core.phase import NEXT, IllegalMove, Phase
from pilot.job_ids import CANCELING_META, JOURNALED_RUNS_MOST, JobIds
from pilot.job_ids import META as IDS_META
from pilot.jobs import JobRecord, ProcessResult
from pilot.model.job_state import FINAL_STATES, JobState
from pilot.scheduler.dag import JobGraph, Outcome, Verdict
from pilot.scheduler.queue import JobQueue

#: How many of the latest ends of each final state the book remembers (:meth:`JobBook.latest_ended`).
LATEST_ENDS = 512


class History(Protocol):
    """What the journal knows of jobs that left memory (ended, or from before a restart): read-only."""

    def job_status(self, job_id: str) -> tuple[list[Any], str | None] | None: ...

    def job_record(self, job_id: str) -> tuple[dict[str, Any], list[Any], float, float | None, float | None] | None: ...

    def jobs_by_submit_id(self, submit_ids: list[str]) -> dict[str, list[str]]: ...

    def job_rows(
        self,
        *,
        states: Sequence[str] = (),
        since: float | None = None,
        newest_first: bool = False,
        by_end: bool = False,
    ) -> Iterator[tuple[Any, ...]]: ...


class JobBook:
    def __init__(self, *, clock: Clock, outbox: Outbox, history: History | None) -> None:
        self.clock = clock
        self.outbox = outbox
        self.history = history
        self.jobs: dict[str, JobRecord] = {}
        self.counts: Counter[JobState] = Counter()
        #: How many of :attr:`counts` are of an unfinished state, kept as they change: backpressure
        #: (``Parking.full``) asks at every submit, where a sum over the states costs ten calls.
        self._unfinished = 0
        self.queue: JobQueue[JobRecord] = JobQueue(
            category=lambda j: j.category,
            alive=lambda j: j.phase is Phase.QUEUED and j.cancel_reason is None,
            priority=lambda j: j.request.priority,
            order=lambda j: int(j.id),
        )
        #: Jobs in BLOCKED: waiting for their dependencies or a <Hold> release.
        self.blocked: dict[str, JobRecord] = {}
        #: Unplaced jobs canceled by a request that picked many (their ``cancel_reason`` set, never
        #: placed): ended a bounded number per step (:meth:`end_canceled`), so canceling a deep queue does
        #: not end a million jobs in one turn of the daemon. The journal has their ids as runs (meta
        #: ``CANCELING_META``, one row, not one per job) until the last has ended with its own row.
        self.canceling: deque[JobRecord] = deque()
        self._canceling_ids: JobIds | None = None
        #: Jobs in BEHIND or WITHDRAWING, oldest first: id -> since when (monotonic).
        self.behind: dict[str, float] = {}
        self.graph = JobGraph()
        #: Unstarted jobs with a start time or a start-by bound (JRDL): checked by :meth:`check_times`.
        self.timed: dict[str, JobRecord] = {}
        self.seq = 0  # the last job id given (to a job, or leased to a client)
        #: The id of every job the pilot holds, ended ones and those only the journal keeps too (LIST).
        self.ids = JobIds()
        #: Ids leased to clients that have not all made jobs yet (``pilot/core/leases.py``).
        self.leases = Leases()
        #: Jobs accepted since the last journal commit under a client's submit id: submit id -> job ids
        #: (one for a PSI/J job; every job of a document, which travels under one submit id).
        self.fresh_by_submit_id: dict[str, list[str]] = {}
        self._dirty: set[JobRecord] = set()  # rows changed since the last commit
        self._placed: set[JobRecord] = set()  # ... whose placement changed
        self._results: list[tuple[JobRecord, int, ProcessResult]] = []
        #: Jobs whose attempt was given up since the last seal -> how many results came before (those
        #: are of the old attempt: not written).
        self._forgot: dict[JobRecord, int] = {}
        #: Jobs that ended since the last flush: they leave memory once it sent their final status
        #: (the journal keeps them), so memory follows the unfinished work only.
        self._retired: list[JobRecord] = []
        #: Jobs that ended since the shell last took them (:meth:`take_ended`) for its log, where it writes
        #: their lines all at once, outside the core.
        self._ended: list[JobRecord] = []
        #: The latest jobs to end, per final state, oldest first (kept in memory after they leave
        #: :attr:`jobs`). 'pilot top' asks for them at every refresh; the journal could find them only
        #: by reading past every queued job's row (a deep queue's jobs are the newest).
        self.latest: dict[JobState, deque[JobRecord]] = {s: deque(maxlen=LATEST_ENDS) for s in FINAL_STATES}
        self._alone: dict[bytes, tuple[bytes]] = {}  # see _followers

    # -- the state machine --------------------------------------------------------------------------

    def move(self, job: JobRecord, phase: Phase, *, front: bool = False) -> None:
        """Change a job's phase. ``front``: back to the queue ahead of everything (it keeps its turn)."""
        old = job.phase
        if phase not in NEXT[old]:
            raise IllegalMove(old, phase, job_id=job.id)
        job.phase = phase
        if old is Phase.QUEUED:
            self.queue.drop()  # dead now: discarded when it reaches its category's head
        elif old is Phase.BLOCKED:
            del self.blocked[job.id]
        if phase is Phase.QUEUED:
            self.queue.push_front(job) if front else self.queue.push(job)
        elif phase is Phase.BEHIND:
            self.behind[job.id] = self.clock.mono
        if phase is not Phase.WITHDRAWING and old in (Phase.BEHIND, Phase.WITHDRAWING):
            del self.behind[job.id]
        self._dirty.add(job)

    def set_state(
        self,
        job: JobRecord,
        state: JobState,
        t: float,
        *,
        exit_code: int | None = None,
        message: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.counts[job.state] -= 1
        self.counts[state] += 1
        if job.state.final is not state.final:
            self._unfinished += 1 if job.state.final else -1
        job.state = state
        job.state_time = t
        if state.final:
            job.exit_code = exit_code
            job.message = message
            job.metadata = metadata or {}
            self._retired.append(job)
            self._ended.append(job)
            self.latest[state].append(job)
        self._dirty.add(job)
        status = job.status()
        statuses = self.outbox.statuses
        for ident in job.subscribers:
            statuses[ident][job.id] = status
        if state.final and (job.id in self.graph.jobs or job.id in self.graph.dependents):
            self._settle(job)

    def end(self, job: JobRecord, state: JobState, *, message: str, t: float | None = None) -> None:
        """An unplaced job ends without running (canceled, refused by its dependencies, stranded)."""
        self.move(job, Phase.DONE)
        self.set_state(job, state, self.clock.wall if t is None else t, message=message)

    def cancel_later(self, job: JobRecord, *, reason: str) -> None:
        """An unplaced job canceled among many: it is never placed from now on, and ends in a later step
        (:meth:`end_canceled`)."""
        job.cancel_reason = reason
        self.canceling.append(job)
        if self._canceling_ids is None:
            self._canceling_ids = JobIds()
        self._canceling_ids.add(int(job.id))
        self._canceling_ids.changed = True

    def end_canceled(self, most: int) -> None:
        """End up to ``most`` of the jobs waiting in :attr:`canceling` (those ended meanwhile by another
        way are passed over)."""
        pending = self.canceling
        while pending and most > 0:
            job = pending.popleft()
            if job.phase is Phase.QUEUED or job.phase is Phase.BLOCKED:
                self.end(job, JobState.CANCELED, message=job.cancel_reason or "canceled")
                most -= 1
        if not pending and self._canceling_ids is not None:
            self._canceling_ids = None
            self.outbox.journal.meta(CANCELING_META, [])  # (each has its final row in this batch)

    def changed(self, job: JobRecord, *, placed: bool = False) -> None:
        """The job's row (and with ``placed`` its placement) must be written at the next commit."""
        self._dirty.add(job)
        if placed:
            self._placed.add(job)

    def result(self, job: JobRecord, slot: int, result: ProcessResult) -> None:
        job.run.add_result(slot, result)
        self._results.append((job, slot, result))
        self._dirty.add(job)

    def forget_attempt(self, job: JobRecord) -> None:
        """The job's attempt was given up (it is placed afresh): nothing of it is written any more."""
        self.outbox.journal.job_requeued(job.id)
        self._placed.discard(job)
        self._forgot[job] = len(self._results)  # its results so far are not written (seal)
        self._dirty.add(job)

    # -- admission and dependencies -----------------------------------------------------------------

    def next_id(self, k: int = 0) -> str:
        """The id the (k+1)-th next job the pilot names itself gets."""
        return str(self.seq + 1 + k)

    def lease(self, count: int) -> tuple[int, int]:
        """Ids for a client to give its jobs (:mod:`pilot.core.leases`): first, last."""
        count = max(1, min(count, MOST))
        first = self.seq + 1
        self.seq += count
        self.leases.grant(first, self.seq)
        return first, self.seq

    def give_back(self, first: int, last: int) -> None:
        """Leased ids a client will never use: if they were the last ids given, the next ones are
        given again (ids stay dense); else they are only no longer held for it."""
        was = self.leases.give_back(first, last)
        if was is not None and was == self.seq:
            self.seq = first - 1

    def adopt(self, job_id: int) -> None:
        """A leased id this pilot never gave (a predecessor did, and its journal is gone), above every id
        given: the block a lease can hold from it on is taken as leased to that client (a client's ids come
        from blocks of at most ``MOST``), so its next ids are accepted too and nobody else gets them."""
        last = job_id + MOST - 1
        self.leases.grant(job_id, last)
        self.seq = last

    def _followers(self, ident: bytes) -> tuple[bytes]:
        """One client as a job's subscribers: the same tuple for all its jobs (immutable; a job followed
        by another client too gets a new one), not one per job queued."""
        alone = self._alone.get(ident)
        if alone is None:
            if len(self._alone) >= 4096:
                self._alone.clear()
            alone = self._alone[ident] = (ident,)
        return alone

    def accept(self, ident: bytes, job: JobRecord, raw: Any, *, submit_id: str | None = None) -> None:
        """A job the pilot takes: its id is the next one (:meth:`next_id`) or one leased for it (its
        submit id, checked free by admission)."""
        number = int(job.id)
        if submit_id is not None and job.id == submit_id:
            self.leases.use(number)
        else:
            self.seq += 1
            assert number == self.seq
        self.ids.add(number)
        if not job.subscribers:
            job.subscribers = self._followers(ident)
        elif ident not in job.subscribers:
            job.subscribers += (ident,)
        self.jobs[job.id] = job
        self.outbox.journal.job_accepted(job.id, number, raw, job.submitted, submit_id=submit_id)
        if submit_id is not None:
            made = self.fresh_by_submit_id.get(submit_id)
            if made is None:
                self.fresh_by_submit_id[submit_id] = [job.id]
            else:
                made.append(job.id)
        self.counts[JobState.QUEUED] += 1
        self._unfinished += 1
        self._time(job)
        if job.edges is None and not job.user_hold and not self.early(job):
            self.queue.push(job)
            return
        for edge in job.edges or ():
            for target in edge[4]:
                if target not in self.graph.outcomes and (outcome := self.ended(target)) is not None:
                    self.graph.outcomes[target] = outcome  # it ended before this job came
        job.phase = Phase.BLOCKED
        self.blocked[job.id] = job
        self.unblock(job)

    def restore(self, job: JobRecord) -> None:
        """A job the journal held, into memory; a queued one into the queue or, blocked, the blocked set."""
        self.counts[job.state] += 1
        if not job.state.final:
            self._unfinished += 1
        self.jobs[job.id] = job
        if job.phase in (Phase.BEHIND, Phase.WITHDRAWING):
            self.behind[job.id] = self.clock.mono  # waits behind a core again from now (reclaim's clock)
        if job.phase is not Phase.QUEUED:
            return
        self._time(job)
        if job.edges is None and not job.user_hold and not self.early(job):
            self.queue.push(job)
        else:
            job.phase = Phase.BLOCKED
            self.blocked[job.id] = job

    def unblock(self, job: JobRecord) -> None:
        """A blocked job whose dependencies may be settled: to the queue, or FAILED if they never can be."""
        if job.phase is not Phase.BLOCKED:
            return
        verdict, reasons = self.graph.verdict(job.id)
        if verdict is Verdict.NEVER:
            self.end(job, JobState.FAILED, message="not started: " + "; ".join(reasons))
        elif verdict is Verdict.READY and not job.user_hold and not self.early(job):
            self.move(job, Phase.QUEUED)

    # -- start times ----------------------------------------------------------------------------------

    def early(self, job: JobRecord) -> bool:
        """Its start time (JRDL jobStartTime) is still to come: it waits blocked until then."""
        not_before = job.request.not_before
        return not_before is not None and not_before > self.clock.wall

    def _time(self, job: JobRecord) -> None:
        request = job.request
        if request.not_before is not None or request.start_within is not None:
            self.timed[job.id] = job

    def check_times(self) -> None:
        """Jobs whose start time came go to the queue; those not started within their bound end FAILED."""
        now = self.clock.wall
        for job in list(self.timed.values()):
            if job.phase not in (Phase.QUEUED, Phase.BLOCKED):
                del self.timed[job.id]  # placed (or ended): its start times are behind it
                continue
            within = job.request.start_within
            if job.cancel_reason is not None:  # canceled, and ended as such by end_canceled
                del self.timed[job.id]
            elif within is not None and now >= job.submitted + within:
                del self.timed[job.id]
                self.end(
                    job,
                    JobState.FAILED,
                    message=f"not started: it had to start within {within:g} s of its submission "
                    "(JRDL jobStartBefore), and it could not",
                )
            elif job.phase is Phase.BLOCKED and not self.early(job):
                self.unblock(job)

    def _settle(self, job: JobRecord) -> None:
        """A job ended that others may depend on: their verdicts follow (and theirs, and so on)."""
        settled = self.graph.finish(job.id, Outcome(job.state, job.exit_code, started=job.run.started is not None))
        for dep_id, _, _ in settled:
            dependent = self.blocked.get(dep_id)
            if dependent is not None:
                self.unblock(dependent)
        # Drop what nobody waits for any more: this job, and the ended jobs it waited for.
        node = self.graph.jobs.get(job.id)
        ended = [job.id] + [t for e in (node.edges if node else ()) for t in e.targets if t in self.graph.outcomes]
        self.graph.forget(ended)
        for j in ended:
            if j not in self.graph.jobs and j not in self.graph.dependents:
                self.graph.outcomes.pop(j, None)  # a later dependent gets it from memory or the journal

    def ended(self, job_id: str) -> Outcome | None:
        job = self.jobs.get(job_id)
        if job is not None:
            return Outcome(job.state, job.exit_code, started=job.run.started is not None) if job.final else None
        found = self.history.job_status(job_id) if self.history is not None else None
        if found is None:
            return None
        _, state, _, code, _, metadata = found[0]
        if not JobState(state).final:
            return None
        return Outcome(JobState(state), code, started=bool((metadata or {}).get("processes")))

    def named(self, name: str) -> list[str]:
        """Unfinished jobs called ``name`` (a JobName dependency): a scan, paid only by such submits."""
        return [j.id for j in self.jobs.values() if j.description.name == name and not j.final]

    def known(self, job_id: str) -> bool:
        return job_id in self.jobs or (self.history is not None and self.history.job_status(job_id) is not None)

    def unfinished(self) -> int:
        return self._unfinished

    # -- commit and flush ---------------------------------------------------------------------------

    def seal(self) -> None:
        """Write the changed rows into the outbox's journal batch: the shell commits it next."""
        tx = self.outbox.journal
        if self.leases.changed:
            tx.meta(LEASES_META, self.leases.journal_value())
        if self.ids.changed:
            tx.meta(IDS_META, self.ids.journal_value(most=JOURNALED_RUNS_MOST))
        if self._canceling_ids is not None and self._canceling_ids.changed:
            tx.meta(CANCELING_META, self._canceling_ids.journal_value())
        placed = self._placed
        for job in self._dirty:
            tx.job_update(job, placed=job in placed)
        results, forgot = self._results, self._forgot
        if forgot:
            results = [r for i, r in enumerate(results) if i >= forgot.get(r[0], 0)]
            forgot.clear()
        for job, slot, result in results:
            if not job.final:  # a final job's Delivered is in its row: its process results are not needed
                tx.process_result(job.id, slot, result)
        self._dirty.clear()
        placed.clear()
        self._results.clear()

    def committed(self) -> None:
        self.fresh_by_submit_id.clear()  # the journal has them now

    def latest_ended(self, states: Sequence[JobState], limit: int) -> list[JobRecord] | None:
        """The last ``limit`` jobs to end in one of the (final) ``states``, the latest last; None when
        memory cannot tell: some of them ended before this daemon started, or further back than it
        remembers (:data:`LATEST_ENDS` per state)."""
        picked: list[JobRecord] = []
        for state in dict.fromkeys(states):
            ring = self.latest[state]
            if len(ring) < limit and len(ring) < self.counts[state]:
                return None
            picked += list(ring)[-limit:] if limit else []
        picked.sort(key=_end_time)
        return picked[max(0, len(picked) - limit) :]

    def unflushed_ends(self) -> list[JobRecord]:
        """Jobs that ended since the last flush: the journal's rows of them may not say so yet."""
        return list(self._retired)

    def take_ended(self) -> list[JobRecord]:
        """The jobs that ended since the last take, oldest first (for the 'job ended' log lines)."""
        ended, self._ended = self._ended, []
        return ended

    def retire(self) -> None:
        """After a flush: ended jobs whose final status it sent leave memory."""
        for job in self._retired:
            if job.final and not job.run.processes:
                self.jobs.pop(job.id, None)
        self._retired.clear()


def _end_time(job: JobRecord) -> float:
    return job.state_time

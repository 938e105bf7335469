"""JobExecutor('pilot'): PSI/J's executor backed by a pilot daemon.

``get_instance('pilot', url=...)`` connects to the daemon at ``url`` (an ``ipc://``/``tcp://`` address
or a run directory), else to the running default pilot (``PILOT_HOME``, ``PILOT_NAME``), else starts
an embedded local pilot (``PILOT_CONFIG`` picks its config) that stops when the executor closes.

``request_timeout`` (keyword-only, seconds, default 10) bounds how long ``cancel``, ``list``, ``attach``
and ``pilot_status`` wait for the pilot's answer; they then raise ``SubmitException`` with
``transient=True``. A daemon that is gone is reported at once, not at the timeout. A submit waits for a
live daemon however long it is stopped, and ``request_timeout`` for a gone one to come back on the run
directory; given up, it is withdrawn, so that its answer is definite (``client/_requests.py``). The executor follows
a daemon restarted on the same run directory by itself: jobs it holds that are not final are attached
again, so their callbacks and ``Job.wait()`` resume (or they end FAILED if the new daemon lost them).

``pipelined=True`` (keyword-only, or ``JobExecutorConfig(pipelined=True)``, or ``PILOT_PIPELINED=1`` in
the environment when neither says) makes ``submit`` return as soon as the job is handed to the pilot's
connection, as PSI/J allows ("sent to the underlying implementation"): a stream of ``submit()`` calls
from one thread then runs at the pilot's pace, not one round trip per job. The job turns QUEUED when
the pilot has journaled it, or FAILED with the pilot's reason if it refuses it (a malformed description
included); only what the client checks itself (a spec without an executable, say) raises at once. Jobs
carry submit ids, so one whose answer a lost connection or a restarted daemon swallowed is sent again
without ever running twice (``client/_pipeline.py``).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import getpass
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from client._backend import Backend, Outcome, pipelined_choice
from client._delivery import StatusSink
from client._requests import DEFAULT_REQUEST_TIMEOUT
from client._translate import spec_to_wire
from client.exceptions import InvalidJobException, InvalidStateException, SubmitException
from client.job import Job, JobStatusCallback
from client.job_status import JobStatus
from pilot import __version__, wire
from pilot.model.job_state import JobState
from pilot.wire.messages import StatusReport

PsijError = InvalidJobException | InvalidStateException | SubmitException
#: A state's wire name -> the state: a dict lookup costs less than Enum's call (every status of every job).
_STATES: dict[Any, JobState] = {s.value: s for s in JobState}


class BatchSubmitException(ExceptionGroup[PsijError]):
    """Raised by :meth:`JobExecutor.submit_all` once every other job is submitted: the jobs that were
    not, in ``failed`` as (job, exception) pairs, the exceptions also as the group's ``exceptions``
    (``except* InvalidJobException`` works), each with its job in ``job``."""

    failed: list[tuple[Job, PsijError]]

    def __new__(cls, message: str, failed: Sequence[tuple[Job, PsijError]]) -> BatchSubmitException:
        for job, error in failed:
            setattr(error, "job", job)  # noqa: B010 -- PSI/J's exception classes have no such field
        self = super().__new__(cls, message, [error for _, error in failed])
        self.failed = list(failed)
        return self

    def __init__(self, message: str, failed: Sequence[tuple[Job, PsijError]]) -> None:
        super().__init__(message, [error for _, error in failed])

    def derive(self, excs: Sequence[PsijError]) -> BatchSubmitException:  # type: ignore[override]
        return BatchSubmitException(self.message, [(getattr(e, "job"), e) for e in excs])  # noqa: B009

    @property
    def jobs(self) -> list[Job]:
        """The jobs that were not submitted, in the order they were given."""
        return [job for job, _ in self.failed]


class JobExecutorConfig:
    """Kept for psij-python compatibility; the pilot needs no per-executor configuration."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


class JobExecutor:
    def __init__(
        self,
        url: str | None = None,
        config: JobExecutorConfig | None = None,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        pipelined: bool | None = None,
    ) -> None:
        self.url = url
        self.config = config or JobExecutorConfig()
        pipelined = pipelined_choice(pipelined, self.config)
        self._backend = Backend(url, request_timeout=request_timeout, pipelined=pipelined)
        self._callback: JobStatusCallback | None = None
        if url is not None and self._backend.pipeline is not None:
            # A pilot named by its address is connected to now and the first job ids leased, so that
            # the first submit does not wait for them (the default pilot, which may have to be started,
            # is left to the first use).
            with contextlib.suppress(SubmitException):
                self._backend.pipeline.prefetch()

    @property
    def pipelined(self) -> bool:
        """Whether ``submit`` returns before the pilot's answer (QUEUED or FAILED then follows)."""
        return self._backend.pipeline is not None

    @property
    def request_timeout(self) -> float:
        """Seconds a request waits for the pilot's answer before a transient SubmitException."""
        return self._backend.request_timeout

    @staticmethod
    def get_instance(
        name: str = "pilot",
        version_constraint: str | None = None,
        url: str | None = None,
        config: JobExecutorConfig | None = None,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        pipelined: bool | None = None,
    ) -> JobExecutor:
        if name.lower() != "pilot":
            raise ValueError(f'No such executor "{name}". Available executors: [pilot]')
        return JobExecutor(url=url, config=config, request_timeout=request_timeout, pipelined=pipelined)

    @property
    def name(self) -> str:
        return "pilot"

    @property
    def version(self) -> str:
        return __version__

    # -- PSI/J operations ---------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        if job.status.state is not JobState.NEW or job.executor is not None:
            raise InvalidStateException(f"job {job.id} was already submitted (state {job.status.state})")
        description = spec_to_wire(job.spec)
        pipeline = self._backend.pipeline
        if pipeline is not None:
            job.executor = self
            try:
                job._native_id = pipeline.submit(description, _JobSink(job))
            except BaseException:
                job.executor = None
                raise
            return

        def on_id(native_id: str) -> StatusSink:
            job._native_id = native_id
            return functools.partial(_apply, job)

        job.executor = self
        try:
            t = self._backend.submit(description, on_id)
        except BaseException:
            job.executor = None
            raise
        job._set_status(JobStatus(JobState.QUEUED, time=t))

    def submit_all(self, jobs: Iterable[Job]) -> None:
        """Submit many jobs in a few round trips: PSI/J's bulk submit (the specification's appendix on
        submission performance), for a workflow engine with thousands of jobs at hand. One request
        carries up to 1,000 jobs and the requests are pipelined, so the cost per job is the pilot's work,
        not a round trip. Each job is handled exactly as ``submit(job)`` would handle it alone: when this
        returns, every job is QUEUED with its native id and its callbacks have seen QUEUED. A job that
        ``submit`` would refuse does not stop the others: once all the others are submitted,
        :class:`BatchSubmitException` lists the jobs that were not, each with the exception ``submit``
        would have raised for it (those jobs stay NEW and may be submitted again)."""
        jobs = list(jobs)
        failed: list[tuple[int, Job, PsijError]] = []
        todo: list[tuple[int, Job]] = []  # (index in jobs, job) of each description sent

        def descriptions() -> Iterator[dict[str, Any]]:
            for i, job in enumerate(jobs):
                if job.status.state is not JobState.NEW or job.executor is not None:
                    error = InvalidStateException(f"job {job.id} was already submitted (state {job.status.state})")
                    failed.append((i, job, error))
                    continue
                try:
                    description = spec_to_wire(job.spec)
                except InvalidJobException as exc:
                    failed.append((i, job, exc))
                    continue
                job.executor = self  # also marks a job listed twice: its second copy is refused above
                todo.append((i, job))
                yield description

        def on_id(k: int, native_id: str) -> StatusSink:  # I/O thread, before any status of the job
            sink = _JobSink(todo[k][1])
            sink.followed(native_id)
            return sink

        def on_outcome(k: int, outcome: Outcome) -> None:
            i, job = todo[k]
            if isinstance(outcome, Exception):
                job.executor = None
                failed.append((i, job, outcome))
            else:
                job._set_status(JobStatus(JobState.QUEUED, time=outcome))

        done = 0

        def counted(k: int, outcome: Outcome) -> None:
            nonlocal done
            done = k + 1
            on_outcome(k, outcome)

        try:
            self._backend.submit_many(descriptions(), on_id, counted)
        except SubmitException as exc:  # nothing was sent (e.g. this executor is closed)
            for k in range(done, len(todo)):
                on_outcome(k, SubmitException(exc.message, transient=exc.transient))
        except BaseException:
            for _, job in todo[done:]:
                job.executor = None
            raise
        if failed:
            failed.sort(key=lambda f: f[0])
            first = failed[0][2]
            raise BatchSubmitException(
                f"{len(failed)} of {len(jobs)} jobs were not submitted (the first: {type(first).__name__}: {first})",
                [(job, error) for _, job, error in failed],
            )

    def cancel(self, job: Job) -> None:
        if job.status.final:
            return
        answered = True
        pipeline = self._backend.pipeline
        if job.native_id is not None and pipeline is not None and job.executor is self:
            # Pipelined: the pilot may not have it yet (its submit waits behind others), so the cancel waits
            # for its answer (at most request_timeout); the reader notes it before QUEUED is delivered, which
            # a callback calling this may be holding up.
            answered = pipeline.wait_answered(job.native_id, self.request_timeout)
            if job.status.final:
                return
        if job.native_id is None or not answered:
            if job.executor is self:
                raise SubmitException(
                    f"the pilot has not answered job {job.id}'s submit within {self.request_timeout:g} s "
                    "(request_timeout); cancel it again later",
                    transient=True,
                )
            raise InvalidStateException(f"job {job.id} was never submitted")
        self._backend.cancel(job.native_id)

    def list(self) -> list[str]:
        return self._backend.list()

    def attach(self, job: Job, native_id: str) -> None:
        """PSI/J's attach: ``job`` (NEW, else InvalidJobException) follows the pilot's job ``native_id``
        from now on, its spec discarded. A job the pilot cannot find (never given out, or purged with
        a journal started afresh) moves the Job to FAILED saying so, as the specification asks; only a
        pilot that cannot be reached raises (SubmitException)."""
        if job.status.state is not JobState.NEW:
            raise InvalidJobException(f"job {job.id} is {job.status.state}; attach needs a NEW job")
        job.spec = None  # the specification: whatever the passed Job held is discarded
        job._native_id = str(native_id)
        job.executor = self
        try:
            status = self._backend.attach(str(native_id), lambda s: _apply(job, s))
        except InvalidJobException as exc:
            job._set_status(JobStatus(JobState.FAILED, time=time.time(), message=f"cannot attach: {exc.message}"))
            return
        except BaseException:
            job.executor = None
            job._native_id = None
            raise
        _apply(job, status)

    def set_job_status_callback(self, cb: JobStatusCallback | Any | None) -> None:
        if cb is not None and not callable(cb):
            cb = cb.job_status_changed
        self._callback = cb

    # -- beyond PSI/J -------------------------------------------------------------------------------

    def pilot_status(self) -> dict[str, Any]:
        """The pilot's own status: allocation, nodes, job counts (what ``pilot status`` shows)."""
        return self._backend.status()

    def submit_sss(self, document: str | bytes) -> SubmittedJobs:
        """Submit an SSS Job or JobGroup (XML text): one Job per SSS job, each followed like a submitted
        one (``wait()``, callbacks). Every job is checked first and all are accepted or none: a bad
        document raises InvalidJobException naming the line and element. Like :meth:`submit`, the
        document is made once however its answer is lost (one submit id for all its jobs)."""
        return self._submit_document("sss", document)

    def submit_jrdl(self, document: str | bytes) -> SubmittedJobs:
        """Submit a JRDL document (XML text): one Job per ``<job>``, as :meth:`submit_sss`. Table 1's
        HOME, LOGNAME and CUR_DIRL resolve to this process's (its home, user name and directory)."""
        return self._submit_document("jrdl", document, submitter=jrdl_submitter())

    def submit_document(self, document: str | bytes) -> SubmittedJobs:
        """Submit a job document in whichever language it is written: a ``<jrdl>`` document as
        :meth:`submit_jrdl`, anything else as SSS (:meth:`submit_sss`, whose reader names what is wrong)."""
        from pilot.formats.jrdl import is_jrdl

        text = document.decode("utf-8", "replace") if isinstance(document, bytes) else document
        return self.submit_jrdl(text) if is_jrdl(text) else self.submit_sss(text)

    def _submit_document(self, key: str, document: str | bytes, **extra: Any) -> SubmittedJobs:
        text = document.decode("utf-8") if isinstance(document, bytes) else document
        jobs = SubmittedJobs()

        def on_id(k: int, native_id: str) -> StatusSink:  # I/O thread, before any status of the job
            while len(jobs) <= k:
                job = Job()
                job.executor = self
                jobs.append(job)
            jobs[k]._native_id = native_id
            return functools.partial(_apply, jobs[k])

        result = self._backend.submit_document({key: text, **extra}, on_id)
        t = result.get("time")
        for job in jobs:
            if job.status.state is JobState.NEW:
                job._set_status(JobStatus(JobState.QUEUED, time=t if isinstance(t, int | float) else None))
        warnings = result.get("warnings")
        jobs.warnings = [str(w) for w in warnings] if isinstance(warnings, list) else []
        return jobs

    def explain(self, job: Job | str) -> Sequence[str]:
        """Why the job is still QUEUED (what it waits for, or which requirement no node meets), or how
        it ended (what ``pilot explain`` prints)."""
        return [str(r) for r in self._per_job(wire.Kind.EXPLAIN, job).get("reasons", [])]

    def show_xml(self, job: Job | str) -> str:
        """The job as SSS Job XML: State, times, Delivered and its placed Task elements."""
        return str(self._per_job(wire.Kind.SHOW, job)["xml"])

    def nodes_xml(self) -> str:
        """The pilot's nodes as SSS Node XML: Configured, Available and Utilized (measured by psutil)."""
        return str(self._backend.request(wire.Kind.NODES, {})["xml"])

    def _per_job(self, kind: str, job: Job | str) -> dict[str, Any]:
        native_id = job if isinstance(job, str) else job.native_id
        if native_id is None:
            raise InvalidStateException("the job was never submitted")
        results = self._backend.request(kind, {"ids": [native_id]}).get("results")
        result = results[0] if isinstance(results, list) and results and isinstance(results[0], dict) else {}
        if "error" in result or not result:
            raise InvalidJobException(str(result.get("error", "no answer for the job")))
        return result

    def close(self) -> None:
        """Done with this executor; the last user of an embedded pilot stops it."""
        self._backend.close()

    def __enter__(self) -> JobExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JobExecutor[pilot, {self.url or 'default'}]"


class SubmittedJobs(builtins.list[Job]):
    """The jobs of a submitted document, in its order, and ``warnings``: what the pilot accepted without
    acting on it (elements marked ``awarenessPolicy="Warn"``)."""

    warnings: builtins.list[str]

    def __init__(self) -> None:
        super().__init__()
        self.warnings = []


def _apply(job: Job, report: StatusReport) -> None:
    """A status the pilot reported, to its job (one of a state this client does not know is left out)."""
    state = _STATES.get(report.state)
    if state is not None:
        job._set_status(JobStatus(state, report.time, report.message, report.exit_code, report.metadata))


class _JobSink:
    """A submitted job's end of the connection (``client/_pipeline.py``'s JobSink): one small object per
    job in flight, where a closure and partials cost several for the garbage collector to track."""

    __slots__ = ("job",)

    def __init__(self, job: Job) -> None:
        self.job = job

    def followed(self, native_id: str) -> None:
        self.job._native_id = native_id

    def __call__(self, report: StatusReport) -> None:
        _apply(self.job, report)


def jrdl_submitter() -> dict[str, str]:
    """What a JRDL document's HOME, LOGNAME and CUR_DIRL mean for the submitting process."""
    found = {"HOME": os.path.expanduser("~"), "CUR_DIRL": os.getcwd()}
    try:
        found["LOGNAME"] = getpass.getuser()
    except (KeyError, OSError):
        pass  # no user name: a reference to LOGNAME is refused naming it
    return {k: v for k, v in found.items() if v and v != "~"}

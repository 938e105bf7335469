"""The ``pilot`` executor for psij-python 0.9.11: psij's Job objects, our daemon behind them.

Registered by ``psij-descriptors/pilot_descriptor.py``; psij-python loads ``client/psij_executor.py``
(a shim re-exporting this class) by path. ``get_instance('pilot', url=...)`` takes what our own
``JobExecutor`` takes: an ``ipc://``/``tcp://`` address, a run directory, or nothing (the running
default pilot, else an embedded one configured by ``PILOT_CONFIG``). The keyword-only
``request_timeout`` (seconds, default 10) bounds the wait for the pilot's answers, as for our own
``JobExecutor``; psij's ``get_instance`` cannot pass it, so construct ``PilotJobExecutor`` directly to
change it. A daemon restarted on the same run directory is followed by itself (see
``client/_reader.py``). ``pipelined`` (keyword-only, or a ``pipelined = True`` attribute set on
the ``psij.JobExecutorConfig`` passed to ``get_instance``, or ``PILOT_PIPELINED=1`` in the environment)
makes ``submit`` return before the pilot's answer, as our own ``JobExecutor(pipelined=True)`` does
(``client/_pipeline.py``).

Statuses of one job reach psij from two threads (``submit``/``attach`` in the caller's, the rest on
the connection's delivering worker). psij's ``Job.status`` setter checks and assigns in two separate
critical sections, so concurrent setters could move a job backwards (a late QUEUED over COMPLETED) or
from one final state to another. Every status therefore goes through a per-job feed that one thread
at a time drains in order, with no lock held while psij runs the user's callbacks.
"""

from __future__ import annotations

import builtins
import threading
import weakref
from collections import deque

import psij

from client._backend import Backend, pipelined_choice
from client._delivery import StatusSink
from client._requests import DEFAULT_REQUEST_TIMEOUT
from client._translate import spec_to_wire
from client.exceptions import InvalidJobException, SubmitException
from pilot.wire.messages import StatusReport


class PilotJobExecutor(psij.JobExecutor):
    def __init__(
        self,
        url: str | None = None,
        config: psij.JobExecutorConfig | None = None,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        pipelined: bool | None = None,
    ) -> None:
        super().__init__(url=url, config=config or psij.JobExecutorConfig())
        pipelined = pipelined_choice(pipelined, self.config)
        # Connects on first use: psij's suite builds every executor at collection.
        self._backend = Backend(url, request_timeout=request_timeout, pipelined=pipelined)

    def submit(self, job: psij.Job) -> None:
        spec = self._check_job(job)  # NEW, has a spec, no executor yet; sets job.executor
        try:
            description = spec_to_wire(spec)
            pipeline = self._backend.pipeline
            if pipeline is not None:  # QUEUED (or FAILED, with the pilot's reason) follows as a status
                job._native_id = pipeline.submit(description, _PipelinedJob(self, job))
                return

            def on_id(native_id: str) -> StatusSink:  # on the I/O thread, before any status of the job
                job._native_id = native_id
                return lambda raw: self._apply(job, raw)

            t = self._backend.submit(description, on_id)
        except InvalidJobException as exc:
            job.executor = None
            raise psij.InvalidJobException(exc.message) from None
        except SubmitException as exc:
            job.executor = None
            raise psij.SubmitException(exc.message, transient=exc.transient) from None
        except BaseException:
            job.executor = None
            raise
        self._deliver(job, psij.JobStatus(psij.JobState.QUEUED, time=t, metadata={"nativeId": job.native_id}))

    def cancel(self, job: psij.Job) -> None:
        if job.status.final:
            return
        if job.native_id is None:
            raise psij.SubmitException(f"cannot cancel job {job.id}: it was never submitted")
        pipeline = self._backend.pipeline
        if pipeline is not None and not pipeline.wait_answered(job.native_id, self._backend.request_timeout):
            raise psij.SubmitException(
                f"the pilot has not answered job {job.id}'s submit within {self._backend.request_timeout:g} s "
                "(request_timeout); cancel it again later",
                transient=True,
            )
        if job.status.final:
            return
        try:
            self._backend.cancel(job.native_id)
        except SubmitException as exc:
            raise psij.SubmitException(exc.message, transient=exc.transient) from None

    def list(self) -> builtins.list[str]:
        try:
            return self._backend.list()
        except SubmitException as exc:
            raise psij.SubmitException(exc.message, transient=exc.transient) from None

    def attach(self, job: psij.Job, native_id: str) -> None:
        if job.status.state != psij.JobState.NEW:
            raise psij.InvalidJobException(f"job {job.id} is {job.status.state}; attach needs a NEW job")
        job.executor = self
        job._native_id = str(native_id)
        try:
            status = self._backend.attach(str(native_id), lambda raw: self._apply(job, raw))
        except InvalidJobException as exc:
            # The specification: a job that cannot be attached (unknown id, purged) moves to FAILED.
            self._deliver(job, psij.JobStatus(psij.JobState.FAILED, message=f"cannot attach: {exc.message}"))
            return
        except SubmitException as exc:
            job.executor = None
            job._native_id = None
            raise psij.SubmitException(exc.message, transient=exc.transient) from None
        self._apply(job, status)

    def close(self) -> None:
        """Done with this executor (beyond psij's API): the last user of an embedded pilot stops it."""
        self._backend.close()

    def _apply(self, job: psij.Job, report: StatusReport) -> None:
        try:
            st = psij.JobState[report.state]
        except KeyError:
            return
        status = psij.JobStatus(
            st, time=report.time, message=report.message, exit_code=report.exit_code, metadata=report.metadata
        )
        self._deliver(job, status)

    def _deliver(self, job: psij.Job, status: psij.JobStatus) -> None:
        feed = _feed(job)
        with feed.lock:
            feed.pending.append(status)
            if feed.draining:
                return  # the thread draining this job's feed applies it, in order
            feed.draining = True
        try:
            while True:
                with feed.lock:
                    if not feed.pending:
                        feed.draining = False
                        return
                    nxt = feed.pending.popleft()
                # psij-python lets a final state be overwritten by another one; we must not.
                if not job.status.final:
                    self._set_job_status(job, nxt)
        except BaseException:
            with feed.lock:
                feed.draining = False
            raise


class _Feed:
    __slots__ = ("draining", "lock", "pending")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: deque[psij.JobStatus] = deque()
        self.draining = False


_feeds: weakref.WeakKeyDictionary[psij.Job, _Feed] = weakref.WeakKeyDictionary()
_feeds_lock = threading.Lock()


def _feed(job: psij.Job) -> _Feed:
    with _feeds_lock:
        feed = _feeds.get(job)
        if feed is None:
            feed = _feeds[job] = _Feed()
        return feed


class _PipelinedJob:
    """A pipelined job's end of the connection (``client/_pipeline.py``'s JobSink): one small object per
    job in flight, instead of closures."""

    __slots__ = ("executor", "job")

    def __init__(self, executor: PilotJobExecutor, job: psij.Job) -> None:
        self.executor = executor
        self.job = job

    def followed(self, native_id: str) -> None:
        self.job._native_id = native_id

    def __call__(self, report: StatusReport) -> None:
        self.executor._apply(self.job, report)

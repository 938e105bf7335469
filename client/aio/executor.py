"""AsyncJobExecutor: the pilot's executor for workflow engines written with asyncio, trio or anyio.

It is the sync client underneath (``client/job_executor.py``: its connection, reader thread, submit
ids, pipelining and restart following), so a job is submitted exactly once, refused the same way and
followed across a restarted daemon just as there. What it adds is the bridge: statuses come from the
client's reader thread into the event loop without blocking either (``client/aio/_loop.py``), so
``await job.wait()`` and ``async for ... in ex.events()`` cost no thread; what may block (connecting,
starting an embedded pilot, a submit's round trip, a cancel) runs in anyio's worker threads. Submits
awaited at the same time from many tasks are gathered into one bulk submit (``submit_all`` of the sync
client) run by one of them: a thousand tasks each awaiting ``submit`` cost a few round trips and one
worker thread, not a thread per job.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, NamedTuple

import anyio

from client._requests import DEFAULT_REQUEST_TIMEOUT
from client.aio._loop import LoopCall
from client.aio.job import AsyncJob
from client.exceptions import InvalidJobException, InvalidStateException, SubmitException
from client.job import Job
from client.job_executor import BatchSubmitException, JobExecutor
from client.job_status import JobStatus
from pilot.model.job_state import JobState

PsijError = InvalidJobException | InvalidStateException | SubmitException


class JobEvent(NamedTuple):
    """A state a job entered: ``async for job, status in ex.events()``."""

    job: AsyncJob
    status: JobStatus


class AsyncBatchSubmitException(ExceptionGroup[PsijError]):
    """Raised by :meth:`AsyncJobExecutor.submit_all` once every other job is submitted, as the sync
    client's ``BatchSubmitException``: ``failed`` holds (job, exception) pairs in the order given, the
    exceptions are the group's (``except* InvalidJobException`` works); those jobs stay NEW."""

    failed: list[tuple[AsyncJob, PsijError]]

    def __new__(cls, message: str, failed: Sequence[tuple[AsyncJob, PsijError]]) -> AsyncBatchSubmitException:
        self = super().__new__(cls, message, [error for _, error in failed])
        self.failed = list(failed)
        return self

    def __init__(self, message: str, failed: Sequence[tuple[AsyncJob, PsijError]]) -> None:
        super().__init__(message, [error for _, error in failed])

    def derive(self, excs: Sequence[PsijError]) -> AsyncBatchSubmitException:  # type: ignore[override]
        keep = {id(e) for e in excs}
        return AsyncBatchSubmitException(self.message, [(j, e) for j, e in self.failed if id(e) in keep])

    @property
    def jobs(self) -> list[AsyncJob]:
        return [job for job, _ in self.failed]


class _Entry:
    """One job waiting to be submitted, and what came of it (set by the worker thread)."""

    __slots__ = ("done", "error", "job")

    def __init__(self, job: AsyncJob) -> None:
        self.job = job
        self.done = False
        self.error: PsijError | None = None


class JobEvents:
    """Every state entered by the executor's jobs from the moment ``events()`` was called, in order
    per job, until the executor closes (or this is closed). Unbounded: a consumer that falls behind
    holds the events it has not read, none is dropped."""

    def __init__(self, executor: AsyncJobExecutor) -> None:
        self._executor = executor
        self._events: deque[JobEvent] = deque()
        self._ready: anyio.Event | None = None
        self._ended = False

    def _put(self, event: JobEvent) -> None:
        self._events.append(event)
        self._wake()

    def _end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        ready, self._ready = self._ready, None
        if ready is not None:
            ready.set()

    def __aiter__(self) -> JobEvents:
        return self

    async def __anext__(self) -> JobEvent:
        while not self._events:
            if self._ended:
                raise StopAsyncIteration
            if self._ready is None:
                self._ready = anyio.Event()
            await self._ready.wait()
        return self._events.popleft()

    async def aclose(self) -> None:
        """Stop receiving events (what was received and not read is dropped)."""
        self._executor._streams.discard(self)
        self._events.clear()
        self._end()

    async def __aenter__(self) -> JobEvents:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncJobExecutor:
    """``ex = await AsyncJobExecutor.connect(url)`` (or ``async with AsyncJobExecutor(url) as ex``), then
    ``await ex.submit(job)``, ``await job.wait()``, ``async for job, status in ex.events()``,
    ``await ex.cancel(job)``, ``await ex.close()``. ``url``, ``request_timeout`` and ``pipelined`` mean
    what they mean for :class:`client.JobExecutor`, but ``pipelined`` is False unless asked for: awaiting
    a submit's answer costs no thread here, and submits awaited together travel together, so ``await
    ex.submit(job)`` can return with the job QUEUED (or raise the pilot's refusal) at the pilot's pace.
    Bound to the event loop it was opened in."""

    def __init__(
        self,
        url: str | None = None,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        pipelined: bool = False,
    ) -> None:
        self._sync = JobExecutor(url, request_timeout=request_timeout, pipelined=pipelined)  # lazy: no I/O
        self._calls: LoopCall[tuple[AsyncJob, JobStatus]] | None = None  # made on the loop by _open
        self._pending: list[_Entry] = []  # submits waiting for a worker thread, in the order awaited
        self._leading = False  # a task runs the submits of the others (one at a time)
        self._turn: anyio.Event | None = None  # set when a batch is done or the lead is given up
        self._streams: set[JobEvents] = set()
        self._closed = False

    @classmethod
    async def connect(
        cls,
        url: str | None = None,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        pipelined: bool = False,
    ) -> AsyncJobExecutor:
        """An executor connected to the pilot at ``url`` (else the default one, else an embedded pilot
        started for it): raises SubmitException when none answers within ``request_timeout``."""
        ex = cls(url, request_timeout=request_timeout, pipelined=pipelined)
        await ex._open()
        return ex

    async def _open(self) -> None:
        if self._calls is not None:
            return
        if self._closed:
            raise SubmitException("this executor is closed; create a new one", transient=False)
        self._calls = LoopCall(self._deliver)
        try:
            await anyio.to_thread.run_sync(self._sync.pilot_status)  # connects (or starts the embedded pilot)
        except BaseException:
            await self.close()
            raise

    @property
    def url(self) -> str | None:
        return self._sync.url

    @property
    def pipelined(self) -> bool:
        """Whether ``submit`` returns before the pilot's answer (QUEUED or FAILED then follows)."""
        return self._sync.pipelined

    @property
    def request_timeout(self) -> float:
        return self._sync.request_timeout

    # -- submitting ---------------------------------------------------------------------------------

    async def submit(self, job: AsyncJob) -> None:
        """Submit one job. As the sync ``submit``: on return the job is QUEUED with its native id (or,
        pipelined, handed to the pilot's connection, QUEUED or FAILED following); a job the pilot refuses
        raises InvalidJobException and stays NEW. Cancelling the awaiting task withdraws the job only if
        it had not gone to a worker thread yet; otherwise it is submitted all the same."""
        self._usable()
        _check_job(job)
        if job.status.state is not JobState.NEW or job.executor is not None:
            raise InvalidStateException(f"job {job.id} was already submitted (state {job.status.state})")
        entry = self._claim(job)
        await self._run([entry])
        if entry.error is not None:
            raise entry.error

    async def submit_all(self, jobs: Iterable[AsyncJob]) -> None:
        """Submit many jobs in a few round trips, each as ``submit`` would alone; the jobs that were not
        are raised together, once the others are submitted, in :class:`AsyncBatchSubmitException`."""
        self._usable()
        jobs = list(jobs)
        for job in jobs:
            _check_job(job)
        entries: list[tuple[int, _Entry]] = []
        failed: list[tuple[int, AsyncJob, PsijError]] = []
        for i, job in enumerate(jobs):
            if job.status.state is not JobState.NEW or job.executor is not None:
                error = InvalidStateException(f"job {job.id} was already submitted (state {job.status.state})")
                failed.append((i, job, error))
            else:
                entries.append((i, self._claim(job)))
        await self._run([entry for _, entry in entries])
        failed.extend((i, entry.job, entry.error) for i, entry in entries if entry.error is not None)
        if failed:
            failed.sort(key=lambda f: f[0])
            first = failed[0][2]
            raise AsyncBatchSubmitException(
                f"{len(failed)} of {len(jobs)} jobs were not submitted (the first: {type(first).__name__}: {first})",
                [(job, error) for _, job, error in failed],
            )

    def _claim(self, job: AsyncJob) -> _Entry:
        job.executor = self  # also marks a job given twice: its second copy is refused as submitted
        job._job.set_job_status_callback(functools.partial(self._on_status, job))
        entry = _Entry(job)
        self._pending.append(entry)
        return entry

    async def _run(self, entries: list[_Entry]) -> None:
        """Until ``entries`` are submitted. One task at a time takes every submit waiting and runs them
        in a worker thread (the sync ``submit_all``); the others wait for their turn."""
        try:
            while not all(entry.done for entry in entries):
                if self._leading:
                    if self._turn is None:
                        self._turn = anyio.Event()
                    await self._turn.wait()
                    continue
                if not self._pending:  # cannot be: a job not done is pending or in the leader's batch
                    raise RuntimeError("async submit lost track of its jobs")
                self._leading = True
                batch, self._pending = self._pending, []
                try:
                    await anyio.to_thread.run_sync(self._submit_batch, batch)  # once started, runs to its end
                finally:
                    # Cancelled before the worker started: the batch waits again, in its place.
                    self._pending[:0] = [entry for entry in batch if not entry.done]
                    self._leading = False
                    if self._calls is not None:
                        self._calls.drain()  # the QUEUED of each job submitted: seen on return
                    for entry in batch:
                        if entry.error is not None:
                            entry.job.executor = None
                    turn, self._turn = self._turn, None
                    if turn is not None:
                        turn.set()
        except BaseException:
            for entry in entries:  # cancelled before a worker took them: they were not submitted
                if not entry.done and entry in self._pending:
                    self._pending.remove(entry)
                    entry.job.executor = None
            raise

    def _submit_batch(self, batch: list[_Entry]) -> None:
        """Worker thread: submit ``batch`` with the sync client; every entry is done on return."""
        try:
            if self._sync.pipelined:
                for entry in batch:
                    try:
                        self._sync.submit(entry.job._job)
                    except (InvalidJobException, InvalidStateException, SubmitException) as exc:
                        entry.error = exc
            else:
                try:
                    self._sync.submit_all(entry.job._job for entry in batch)
                except BatchSubmitException as exc:
                    errors: dict[int, PsijError] = {id(job): error for job, error in exc.failed}
                    for entry in batch:
                        entry.error = errors.get(id(entry.job._job))
        except Exception as exc:  # not the client's refusal: every job of the batch says what happened
            for entry in batch:
                if entry.error is None and entry.job._job.status.state is JobState.NEW:
                    error = SubmitException(f"submit failed: {type(exc).__name__}: {exc}")
                    error.__cause__ = exc
                    entry.error = error
        finally:
            for entry in batch:
                entry.done = True

    # -- statuses -----------------------------------------------------------------------------------

    def _on_status(self, job: AsyncJob, _: Job, status: JobStatus) -> None:
        """The sync Job's callback (the client's threads, in order per job): hand it to the loop."""
        calls = self._calls
        if calls is not None:
            calls.put((job, status))

    def _deliver(self, items: list[tuple[AsyncJob, JobStatus]]) -> None:
        """On the loop: each job's next states, to the job and to every events() stream."""
        streams = list(self._streams)
        for job, status in items:
            job._advance(status)
            if streams:
                event = JobEvent(job, status)
                for stream in streams:
                    stream._put(event)

    def events(self) -> JobEvents:
        """Every state entered by this executor's jobs from now on (QUEUED, ACTIVE, ..., final; states
        the pilot skipped filled in, as for the sync callbacks), in order per job: ``async for job,
        status in ex.events()``. It ends when the executor closes; ``async with`` (or ``aclose()``) stops
        it earlier."""
        stream = JobEvents(self)
        if self._closed:
            stream._end()
        else:
            self._streams.add(stream)
        return stream

    # -- other operations ---------------------------------------------------------------------------

    async def cancel(self, job: AsyncJob) -> None:
        """Cancel a submitted job (nothing if it is final): its CANCELED status follows."""
        self._usable()
        _check_job(job)
        await anyio.to_thread.run_sync(self._sync.cancel, job._job)

    async def attach(self, job: AsyncJob, native_id: str) -> None:
        """PSI/J's attach, as :meth:`client.JobExecutor.attach`: the NEW ``job`` follows the pilot's job
        ``native_id`` from now on (its spec discarded); an id the pilot cannot find moves it to FAILED."""
        self._usable()
        _check_job(job)
        if job.status.state is not JobState.NEW or job.executor is not None:
            raise InvalidJobException(f"job {job.id} is {job.status.state}; attach needs a NEW job")
        job.executor = self
        job._job.set_job_status_callback(functools.partial(self._on_status, job))
        try:
            await anyio.to_thread.run_sync(self._sync.attach, job._job, str(native_id))
        except BaseException:
            if job._job.native_id is None:
                job.executor = None
            raise
        finally:
            if self._calls is not None:
                self._calls.drain()  # its current status: seen on return

    async def list(self) -> list[str]:
        """The native ids of the pilot's jobs (``JobExecutor.list``)."""
        self._usable()
        return await anyio.to_thread.run_sync(self._sync.list)

    async def pilot_status(self) -> dict[str, Any]:
        """The pilot's own status: allocation, nodes, job counts (what ``pilot status`` shows)."""
        self._usable()
        return await anyio.to_thread.run_sync(self._sync.pilot_status)

    async def close(self) -> None:
        """Done: pipelined submits get their answers first; the last user of an embedded pilot stops it;
        ``events()`` streams end after the last statuses."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._sync.close)
        if self._calls is not None:
            self._calls.close()
        for stream in list(self._streams):
            stream._end()
        self._streams.clear()

    def _usable(self) -> None:
        if self._closed:
            raise SubmitException("this executor is closed; create a new one", transient=False)
        if self._calls is None:
            raise SubmitException(
                "this executor is not open: use `await AsyncJobExecutor.connect(...)` or "
                "`async with AsyncJobExecutor(...) as ex`",
                transient=False,
            )

    async def __aenter__(self) -> AsyncJobExecutor:
        await self._open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncJobExecutor[pilot, {self.url or 'default'}]"


def _check_job(job: object) -> None:
    if not isinstance(job, AsyncJob):
        raise TypeError(f"the async executor takes AsyncJob objects (client.aio.AsyncJob), not {type(job).__name__}")

"""Pipelined submission: ``submit()`` returns once the job is handed to the pilot's connection.

PSI/J's ``submit()`` promises that the job "has been sent to the underlying implementation" and that
every later change of its status, failures included, comes as a notification. A pipelined executor
keeps that promise without a round trip per call: the job's QUEUED follows as a status once the pilot
has journaled it, or FAILED with the pilot's reason when it refuses the job (one that can never fit
its allocation, say). While ``OUTSTANDING`` requests of a stream are unanswered, the jobs submitted
meanwhile gather in the next one (up to ``GROUP_JOBS``), which leaves with the first answer: a stream
goes out in frames as large as the pilot's pace makes them, and a lone job at once.

Nothing is made twice or lost on the way. Each job carries a submit id, which the pilot journals with
it (this executor's random prefix and a count: unique without a uuid, and its system call, per job). A
connection lost before the answer -- the daemon killed and restarted on the same run directory, say
-- makes the connection send the job again on the next one, and the pilot answers for a submit id it
knows with the job that submit id made, which the client then follows. A job the pilot refuses only for
want of room (``pilot.max_queued``) is sent again shortly after. A live daemon is waited for, however
long it is stopped. A job is given up, FAILED with the reason, only when no pilot is seen alive for
``request_timeout`` (or the executor closes first); one that may have reached a pilot is withdrawn
first, so FAILED is definite: no pilot of the run directory runs it (``client/_requests.py``).

At most ``WINDOW`` jobs wait for their answer; ``submit()`` waits for room beyond that (the pilot's
pace is the caller's pace), up to ``request_timeout``, then raises a transient SubmitException: that
job was not sent.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from client._connection import Connection
from client._delivery import StatusSink
from client._leases import LeasedIds
from client._reader import report
from client._requests import GROUP_JOBS, Ticket
from client.exceptions import SubmitException
from pilot import wire
from pilot.wire.messages import StatusReport

#: Jobs a pipelined executor may have sent and not had answered: a few full frames (GROUP_JOBS).
WINDOW: Final = 4 * GROUP_JOBS
#: Requests of a stream sent and not answered at most (the pilot works on one while the next travels).
OUTSTANDING: Final = 2
#: Seconds before jobs the pilot had no room for are sent again (the reader's look comes within 0.5 s).
RETRY_DELAY: Final = 0.5
_FINAL: Final = ("COMPLETED", "FAILED", "CANCELED")


class JobSink(Protocol):
    """One pipelined job's end of the connection: told the job's native id when the pilot has it (on
    the reader, before any status of the job), and called with each status of the job, or with FAILED
    if the pilot refuses it or it is given up. One object per job, in flight and while followed."""

    def followed(self, native_id: str) -> None: ...

    def __call__(self, status: StatusReport, /) -> None: ...


class _Request:
    """One SUBMIT of pipelined jobs: more join it until the connection sends it (then a new one opens).
    The three lists grow together: under the pipeline's lock while it holds the request, under the
    connection's (``Connection.join``) once it is handed over."""

    __slots__ = ("counted", "descriptions", "jobs", "submit_ids", "ticket")

    def __init__(self) -> None:
        self.descriptions: list[dict[str, Any]] = []
        self.submit_ids: list[str] = []
        self.jobs: list[JobSink] = []
        self.ticket: Ticket | None = None  # None: held by the pipeline, not handed to the connection yet
        self.counted = False  # one of the OUTSTANDING (a retry is not)

    def add(self, description: dict[str, Any], submit_id: str, job: JobSink) -> None:
        self.descriptions.append(description)
        self.submit_ids.append(submit_id)
        self.jobs.append(job)


class Pipeline:
    """The pipelined submits of one executor: their window, their answers and their failures."""

    def __init__(
        self,
        connection: Callable[[], Connection],
        *,
        request_timeout: float,
        window: int = WINDOW,
    ) -> None:
        self._connection = connection
        self._timeout = request_timeout
        self._window = window
        #: Held as a plain lock (C-level ``with``, cheaper than the Condition's own per take or submit);
        #: ``_cond`` is the condition on it that waiters wait on.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._count = 0  # jobs sent (or being sent) and not answered or given up
        self._waiters = 0  # threads waiting in submit() or flush()
        self._open: _Request | None = None  # the request new jobs join while it waits to be sent
        self._held: deque[_Request] = deque()  # requests not handed over yet, in order (the last is _open)
        self._outstanding = 0  # counted requests handed over and not answered
        self._ids = LeasedIds(connection, request_timeout=request_timeout)
        #: Ids of the jobs sent whose answer was not read yet (the pilot may not have them yet).
        self._unanswered: set[str] = set()

    @property
    def in_flight(self) -> int:
        """Jobs submitted and not yet answered by the pilot (nor given up)."""
        return self._count

    def submit(self, description: dict[str, Any], job: JobSink) -> str:
        """Hand one job to the connection. ``job.followed(native_id)`` is called on the connection's reader
        when the pilot has the job, before any of its statuses, which then go to ``job`` (QUEUED first, or
        the job's current status when the pilot had it already); ``job`` gets a FAILED status when the
        pilot refuses the job or it is given up. Raises SubmitException when the job was not
        sent (no room in the window within the timeout, or no pilot to send it to). Returns the job's
        id: leased from the pilot ahead (``client/_leases.py``), it is its native id and its submit id."""
        submit_id = self._ids.take()
        with self._lock:
            if self._count >= self._window:
                self._wait_room()
            self._count += 1
            self._unanswered.add(submit_id)
            try:
                conn = self._connection()
                conn.check_open()  # a pilot known gone is said at once, even to a job that would wait here
                joining = self._open
                if joining is not None and len(joining.jobs) < GROUP_JOBS:
                    if joining.ticket is None:  # held: the next answer hands it over
                        joining.add(description, submit_id, job)
                        return submit_id
                    # (sent already, the common case: no join to ask for)
                    if not joining.ticket[1].sent and conn.join(
                        joining.ticket, functools.partial(joining.add, description, submit_id, job)
                    ):
                        return submit_id
                request = self._open = _Request()
                request.add(description, submit_id, job)
                if self._outstanding < OUTSTANDING:
                    self._hand(conn, request)
                else:
                    self._held.append(request)
                return submit_id
            except BaseException:
                self._count -= 1
                self._unanswered.discard(submit_id)
                self._open = None
                raise

    def give_back(self, conn: Connection, timeout: float) -> None:
        """The executor closes: the pilot may give its unused job ids to the next jobs (ids stay dense)."""
        ranges = self._ids.unused()
        if not ranges:
            return
        answered = threading.Event()
        try:
            conn.ask(
                wire.Kind.LEASE,
                {"count": 0, "give_back": ranges},
                on_reply=lambda _: answered.set(),
                on_lost=lambda _, __: answered.set(),
                timeout=timeout,
            )
        except SubmitException:
            return  # they stay leased to nobody: a gap in the ids, nothing more
        answered.wait(timeout)  # a stopped daemon is not waited for: closing must not hang on it

    def prefetch(self) -> None:
        """Lease the first job ids now (see :class:`LeasedIds`); raises SubmitException if it cannot ask."""
        self._ids.prefetch()

    def wait_answered(self, job_id: str, timeout: float) -> bool:
        """Wait until the pilot's answer for job ``job_id`` is read (or the job was given up): a cancel
        must not overtake its submit. False at the timeout."""
        return self._wait_until(lambda: job_id not in self._unanswered, timeout)

    def flush(self, timeout: float) -> bool:
        """Wait until every job submitted has its answer (or was given up); False at the timeout."""
        return self._wait_until(lambda: not self._count, timeout)

    def _wait_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait on ``_cond`` (notified when answers are read) until ``done()``; False at the timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._waiters += 1
            try:
                while not done():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
            finally:
                self._waiters -= 1
        return True

    def close(self) -> None:
        """The executor closes: jobs still held here (behind ``OUTSTANDING`` unanswered requests) were
        never sent, and end FAILED saying so. Those handed to the connection are its to settle."""
        with self._lock:
            held, self._held = list(self._held), deque()
            self._open = None
            self._count -= sum(len(r.jobs) for r in held)
            for r in held:
                self._unanswered.difference_update(r.submit_ids)
            if self._waiters:
                self._cond.notify_all()
        now = time.time()
        message = "the executor was closed before the job could be sent; it was not sent"
        for request in held:
            for job in request.jobs:
                job(StatusReport(None, "FAILED", now, None, message, None))

    def _wait_room(self) -> None:
        """Under ``_lock``: wait for the window to have room, at most the request timeout."""
        deadline = time.monotonic() + self._timeout
        self._waiters += 1
        try:
            while self._count >= self._window:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SubmitException(
                        f"{self._count} submitted jobs have waited {self._timeout:g} s (request_timeout) for the "
                        "pilot's answer; this job was not sent: submit it again later",
                        transient=True,
                    )
                self._cond.wait(left)
        finally:
            self._waiters -= 1

    def _hand(self, conn: Connection, request: _Request) -> None:
        """Hand a request to the connection, as one of the OUTSTANDING (``_lock`` held)."""
        request.ticket = self._send(conn, request, delay=0.0)
        request.counted = True
        self._outstanding += 1

    def _send(self, conn: Connection, request: _Request, *, delay: float) -> Ticket:
        return conn.submit(
            request.descriptions,
            submit_ids=request.submit_ids,
            on_reply=functools.partial(self._answered, conn, request),
            on_lost=functools.partial(self._lost, conn, request),
            timeout=self._timeout,
            delay=delay,
        )

    def _answered(self, conn: Connection, request: _Request, body: dict[str, Any]) -> None:
        """The pilot's answer (on the connection's reader): follow each job it has, say why for the others."""
        jobs = request.jobs
        results = body.get("results")
        if not isinstance(results, list) or len(results) != len(jobs):
            error = body.get("error") if isinstance(body.get("error"), str) else None
            self._lost(conn, request, error or f"malformed reply from the pilot: {str(body)[:200]}")
            return
        follow: list[tuple[str, StatusSink]] = []
        statuses: list[tuple[StatusReport, StatusSink]] = []
        again: _Request | None = None  # the jobs refused for want of room, if any
        now = time.time()
        for i, (result, job) in enumerate(zip(results, jobs, strict=True)):
            if isinstance(result, dict) and "id" in result:
                native_id = str(result["id"])
                job.followed(native_id)
                raw = result.get("status")
                status = report(raw) if raw is not None else None
                if status is not None:  # the job this submit id made before
                    if status.state not in _FINAL:
                        follow.append((native_id, job))
                    statuses.append((status, job))
                else:
                    follow.append((native_id, job))
                    t = result.get("time")
                    when = float(t) if isinstance(t, int | float) and not isinstance(t, bool) else now
                    statuses.append((StatusReport(native_id, "QUEUED", when, None, None, None), job))
            elif isinstance(result, dict) and result.get("retry"):  # refused for want of room: nothing was done
                if again is None:
                    again = _Request()
                again.add(request.descriptions[i], request.submit_ids[i], job)
            else:
                if isinstance(result, dict) and result.get("unleased"):
                    self._ids.drop()  # this pilot does not know the block: the next jobs get a new one
                error = result.get("error") if isinstance(result, dict) else None
                message = f"the pilot did not accept the job: {error}" if error else "malformed result from the pilot"
                statuses.append((StatusReport(None, "FAILED", now, None, message, None), job))
        conn.subscribe_many(follow)  # before any later frame is read: the jobs' events find their sinks
        for status, sink in statuses:
            conn.emit(status, sink)
        if again is None:  # every job answered for
            self._settled(conn, request, len(jobs), answered=request.submit_ids)
            return
        retrying = set(again.submit_ids)  # a set: a frame of 2,000 refused for want of room is 2,000 lookups
        self._answer_read([sid for sid in request.submit_ids if sid not in retrying])
        retried = 0
        if again.jobs:
            try:
                again.ticket = self._send(conn, again, delay=RETRY_DELAY)
                retried = len(again.jobs)
            except SubmitException as exc:
                self._answer_read(again.submit_ids)
                self._fail_jobs(conn, again.jobs, exc.message)
        self._settled(conn, request, len(jobs) - retried)

    def _answer_read(self, submit_ids: list[str]) -> None:
        with self._lock:
            self._unanswered.difference_update(submit_ids)
            if self._waiters:
                self._cond.notify_all()

    def _lost(self, conn: Connection, request: _Request, message: str) -> None:
        """Given up (on the reader): its jobs end FAILED with the reason."""
        self._answer_read(request.submit_ids)
        self._fail_jobs(conn, request.jobs, message)
        self._settled(conn, request, len(request.jobs))

    def _fail_jobs(self, conn: Connection, jobs: list[JobSink], message: str) -> None:
        now = time.time()
        for job in jobs:
            conn.emit(StatusReport(None, "FAILED", now, None, message, None), job)

    def _settled(self, conn: Connection, request: _Request, count: int, *, answered: Sequence[str] = ()) -> None:
        """``count`` jobs of ``request`` are answered for (and the answers of those ``answered`` read: see
        :meth:`_answer_read`); if it was one of the OUTSTANDING, the requests held meanwhile go now (jobs
        they cannot be handed over for end FAILED)."""
        refused: list[tuple[list[JobSink], str]] = []
        with self._lock:
            if answered:
                self._unanswered.difference_update(answered)
            self._count -= count
            if request.counted:
                request.counted = False
                self._outstanding -= 1
                while self._held and self._outstanding < OUTSTANDING:
                    held = self._held.popleft()
                    try:
                        self._hand(conn, held)
                    except SubmitException as exc:
                        if held is self._open:
                            self._open = None
                        self._count -= len(held.jobs)
                        self._unanswered.difference_update(held.submit_ids)
                        refused.append((held.jobs, exc.message))
            if self._waiters:
                self._cond.notify_all()
        for jobs, message in refused:
            self._fail_jobs(conn, jobs, message)

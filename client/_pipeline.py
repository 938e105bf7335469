"""Pipelined submission: ``submit()`` returns once the job is handed to the pilot's connection.

PSI/J's ``submit()`` promises that the job "has been sent to the underlying implementation" and that
every later change of its status, failures included, comes as a notification. A pipelined executor
keeps that promise without a round trip per call: the job's QUEUED follows as a status once the pilot
has journaled it, or FAILED with the pilot's reason when it refuses the job (one that can never fit
its allocation, say). Jobs submitted while earlier ones are unanswered leave together in one frame.

Nothing is made twice or lost on the way. Each job carries a key, which the pilot journals with it
(this executor's random prefix and a count: unique without a uuid, and its system call, per job). A
connection lost before the answer -- the daemon killed and restarted on the same run directory, say
-- makes the connection send the job again on the next one, and the pilot answers for a key it knows
with the job that key made, which the client then follows. A job the pilot refuses only for want of
room (``pilot.max_queued``) is sent again shortly after. A job is given up, FAILED with the reason,
only when no answer comes within ``request_timeout`` of its sending (or of the pilot's last answer,
while the pilot works through a backlog), or when no pilot comes back within it.

At most ``WINDOW`` jobs wait for their answer; ``submit()`` waits for room beyond that (the pilot's
pace is the caller's pace), up to ``request_timeout``, then raises a transient SubmitException: that
job was not sent.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

from client._connection import GROUP_JOBS, Connection, StatusSink, Ticket
from client.exceptions import SubmitException

#: Jobs a pipelined executor may have sent and not had answered: a few full frames (GROUP_JOBS).
WINDOW: Final = 4 * GROUP_JOBS
#: Seconds before jobs the pilot had no room for are sent again (the reader's look comes within 0.5 s).
RETRY_DELAY: Final = 0.5
_FINAL: Final = ("COMPLETED", "FAILED", "CANCELED")

#: What the answer to one job needs: the sink maker for its native id, and the sink of its failure.
_Job = tuple[Callable[[str], StatusSink], StatusSink]


class _Request:
    """One SUBMIT of pipelined jobs: more join it until the connection sends it (then a new one opens).
    The three lists grow together, under the connection's lock (``Connection.join``)."""

    __slots__ = ("descriptions", "jobs", "keys", "ticket")

    def __init__(self) -> None:
        self.descriptions: list[dict[str, Any]] = []
        self.keys: list[str] = []
        self.jobs: list[_Job] = []
        self.ticket: Ticket | None = None


class Pipeline:
    """The pipelined submits of one executor: their window, their answers and their failures."""

    def __init__(self, connection: Callable[[], Connection], *, request_timeout: float, window: int = WINDOW) -> None:
        self._connection = connection
        self._timeout = request_timeout
        self._window = window
        self._cond = threading.Condition(threading.Lock())
        self._count = 0  # jobs sent (or being sent) and not answered or given up
        self._waiters = 0  # threads waiting in submit() or flush()
        self._open: _Request | None = None  # the request new jobs join while it waits to be sent
        self._prefix = uuid.uuid4().hex[:20] + "-"
        self._serial = itertools.count(1)

    @property
    def in_flight(self) -> int:
        """Jobs submitted and not yet answered by the pilot (nor given up)."""
        return self._count

    def submit(
        self,
        description: dict[str, Any],
        *,
        on_id: Callable[[str], StatusSink],
        on_failed: StatusSink,
    ) -> None:
        """Hand one job to the connection. ``on_id(native_id)`` is called on the connection's reader when
        the pilot has the job, before any of its statuses, and returns the sink they go to (QUEUED first,
        or the job's current status when the pilot had it already); ``on_failed`` gets a FAILED status
        when the pilot refuses the job or it is given up. Raises SubmitException when the job was not
        sent (no room in the window within the timeout, or no pilot to send it to)."""
        key = self._prefix + str(next(self._serial))
        job = (on_id, on_failed)
        with self._cond:
            if self._count >= self._window:
                self._wait_room()
            self._count += 1
            try:
                conn = self._connection()
                joining = self._open
                if joining is not None and joining.ticket is not None and len(joining.jobs) < GROUP_JOBS:

                    def add() -> None:
                        assert joining is not None
                        joining.descriptions.append(description)
                        joining.keys.append(key)
                        joining.jobs.append(job)

                    if conn.join(joining.ticket, add):
                        return
                request = self._open = _Request()
                request.descriptions.append(description)
                request.keys.append(key)
                request.jobs.append(job)
                request.ticket = self._send(conn, request, delay=0.0)
            except BaseException:
                self._count -= 1
                self._open = None
                raise

    def flush(self, timeout: float) -> bool:
        """Wait until every job submitted has its answer (or was given up); False at the timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._waiters += 1
            try:
                while self._count:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
            finally:
                self._waiters -= 1
        return True

    def _wait_room(self) -> None:
        """Under ``_cond``: wait for the window to have room, at most the request timeout."""
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

    def _settled(self, count: int) -> None:
        with self._cond:
            self._count -= count
            if self._waiters:
                self._cond.notify_all()

    def _send(self, conn: Connection, request: _Request, *, delay: float) -> Ticket:
        return conn.submit(
            request.descriptions,
            keys=request.keys,
            on_reply=functools.partial(self._answered, conn, request),
            on_lost=functools.partial(self._failed, conn, request.jobs),
            timeout=self._timeout,
            delay=delay,
        )

    def _answered(self, conn: Connection, request: _Request, body: dict[str, Any]) -> None:
        """The pilot's answer (on the connection's reader): follow each job it has, say why for the others."""
        jobs = request.jobs
        results = body.get("results")
        if not isinstance(results, list) or len(results) != len(jobs):
            error = body.get("error") if isinstance(body.get("error"), str) else None
            self._failed(conn, jobs, error or f"malformed reply from the pilot: {str(body)[:200]}")
            return
        follow: list[tuple[str, StatusSink]] = []
        statuses: list[tuple[list[Any], StatusSink]] = []
        again = _Request()
        now = time.time()
        for i, (result, (on_id, on_failed)) in enumerate(zip(results, jobs, strict=True)):
            if isinstance(result, dict) and "id" in result:
                native_id = str(result["id"])
                sink = on_id(native_id)
                status = result.get("status")
                if isinstance(status, list) and len(status) == 6:  # the job this key made before
                    if status[1] not in _FINAL:
                        follow.append((native_id, sink))
                    statuses.append((status, sink))
                else:
                    follow.append((native_id, sink))
                    t = result.get("time")
                    when = float(t) if isinstance(t, int | float) and not isinstance(t, bool) else now
                    statuses.append(([native_id, "QUEUED", when, None, None, None], sink))
            elif isinstance(result, dict) and result.get("retry"):  # refused for want of room: nothing was done
                again.descriptions.append(request.descriptions[i])
                again.keys.append(request.keys[i])
                again.jobs.append((on_id, on_failed))
            else:
                error = result.get("error") if isinstance(result, dict) else None
                message = f"the pilot did not accept the job: {error}" if error else "malformed result from the pilot"
                statuses.append(([None, "FAILED", now, None, message, None], on_failed))
        conn.subscribe_many(follow)  # before any later frame is read: the jobs' events find their sinks
        for status, sink in statuses:
            conn.emit(status, [sink])
        if again.jobs:
            try:
                self._send(conn, again, delay=RETRY_DELAY)
            except SubmitException as exc:
                self._failed(conn, again.jobs, exc.message)
        self._settled(len(jobs) - len(again.jobs))

    def _failed(self, conn: Connection, jobs: list[_Job], message: str) -> None:
        """Refused, or given up (on the reader): each job ends FAILED with the reason."""
        now = time.time()
        for _, on_failed in jobs:
            conn.emit([None, "FAILED", now, None, message, None], [on_failed])
        self._settled(len(jobs))

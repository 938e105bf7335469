"""Requests to the daemon and the table of those not answered yet.

Shared state, all under ``_lock`` (the table's lock): ``_pending`` (every request not answered nor
given up, by rid), ``_outbox`` (rids not handed to a socket yet, in order), ``_deferred`` and
``_unwaited``. Callers on any thread add to it and take back what they stop waiting for; the I/O thread
hands the outbox to the socket, matches replies and gives requests up. ``_groups`` (the members of each
group frame sent) and ``_last_answer`` are the I/O thread's only. A request's ``Done`` is set once,
by whichever thread takes it out of ``_pending``: its one waiter then reads ``body`` or ``lost``.
SUBMITs that wait in the outbox together are framed as one (group submit, ``client/_connection.py``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import structlog
import zmq

from client.exceptions import SubmitException
from pilot import wire

log = structlog.get_logger("client")

OnReply = Callable[[dict[str, Any]], None]
#: Why a request nobody waits on was given up (on the I/O thread); the message says whether it was sent.
OnLost = Callable[[str], None]
Ticket = tuple[int, "Pending"]  # a queued request: its rid and its state, for Connection.wait

#: How long a request waits for its reply by default (the executors' ``request_timeout``). A daemon
#: that is gone is noticed well before that (socket monitor, run directory); this bounds a live daemon
#: that does not answer, and a request made while the connection is being re-established. Keep it above
#: the few seconds a pilot at ``max_queued`` may hold a submit before refusing it (backpressure):
#: a submit whose caller timed out first may still be accepted afterwards (its message says so).
DEFAULT_REQUEST_TIMEOUT: Final = 10.0

#: Most jobs in one SUBMIT frame when queued submits are sent together: the daemon handles a frame in
#: one step of its loop, so this bounds how long one frame holds up everything else there.
GROUP_JOBS: Final = 2000


class RequestTimeout(SubmitException):
    """The pilot did not answer within the request timeout (transient); the message says whether the
    request was sent."""


class Done:
    """Set once, when a request is answered or lost: a lock held until then. Its one waiter takes and
    gives back the lock; threading.Event's condition costs several times more to make, set and wait."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        self._lock.release()

    def is_set(self) -> bool:
        return not self._lock.locked()

    def wait(self, timeout: float | None = None) -> bool:
        if not self._lock.acquire(timeout=-1 if timeout is None else min(timeout, threading.TIMEOUT_MAX)):
            return False
        self._lock.release()
        return True


class Pending:
    __slots__ = (
        "body",
        "done",
        "frame",
        "internal",
        "jobs",
        "kind",
        "lost",
        "on_lost",
        "on_reply",
        "sent",
        "since",
        "submit_ids",
        "timeout",
        "uncertain",
    )

    def __init__(
        self,
        kind: str,
        frame: bytes,
        on_reply: OnReply | None,
        *,
        internal: bool = False,
        jobs: list[dict[str, Any]] | None = None,
        submit_ids: list[str] | None = None,
        on_lost: OnLost | None = None,
        timeout: float = 0.0,
    ) -> None:
        self.kind = kind
        self.frame = frame  # empty for a submit: its jobs are encoded at send time, with those they travel with
        self.jobs = jobs  # a submit's job descriptions
        #: A submit's job submit ids, if it carries them: the pilot knows a job by its submit id, so the
        #: request is sent again after a lost connection instead of failing (a job it had accepted is not
        #: made twice).
        self.submit_ids = submit_ids
        self.done = Done()
        self.body: dict[str, Any] | None = None
        self.lost: str | None = None  # set instead of body when the request cannot be answered
        self.on_reply = on_reply
        self.sent = False  # handed to a socket: the daemon may have carried it out
        self.uncertain = False  # sent on a connection lost before its answer: the pilot may hold its jobs
        self.internal = internal  # the I/O thread's own (re-attach), nobody waits on it
        #: Nobody waits on the request (a pipelined submit): the I/O thread gives it up ``timeout`` seconds
        #: after ``since`` (or after the last answer, once sent) and tells ``on_lost`` why.
        self.on_lost = on_lost
        self.timeout = timeout
        self.since = time.monotonic() if on_lost is not None else 0.0


class RequestTable:
    """The requests of one connection not answered yet, and how they are framed, failed and given up."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._refused: str | None = None  # why the last handshake failed (a key refused, an impostor), if it did
        self._rids = itertools.count(1)
        self._lock = threading.Lock()
        self._outbox: deque[int] = deque()  # rids not sent yet, in order
        self._pending: dict[int, Pending] = {}
        #: Submits sent together in one frame: the frame's rid -> its members, in order (I/O thread only).
        self._groups: dict[int, list[tuple[int, Pending]]] = {}
        self._unwaited = 0  # requests with an ``on_lost`` not answered yet (under ``_lock``)
        self._deferred: list[tuple[float, int]] = []  # (when, rid) of those not to be queued before then
        self._last_answer = 0.0  # when the reader last read a reply (monotonic)
        self.submit_frames = 0  # SUBMIT frames handed to a socket (several submits may share one)
        self._closed = False  # set once, by close() on any thread; new requests are refused under ``_lock``

    def in_flight(self) -> int:
        """Requests handed to the daemon's socket and not answered yet."""
        with self._lock:
            return sum(1 for p in self._pending.values() if p.sent and not p.internal)

    def unsent(self) -> int:
        """Requests waiting to be handed to a socket (queued, or held back to be sent later)."""
        with self._lock:
            return sum(1 for p in self._pending.values() if not p.sent and not p.internal)

    def _send_outbox(self, sock: zmq.Socket[bytes]) -> bool:
        """Hand the outbox to ``sock`` (the socket lock held), in order, consecutive submits in one frame;
        False when it cannot take more now (what it did not take goes back to the outbox)."""
        units: list[list[tuple[int, Pending]]] = []  # one per frame
        with self._lock:
            jobs = 0
            while self._outbox:
                rid = self._outbox.popleft()
                p = self._pending.get(rid)
                if p is None:  # its caller gave up before it was sent
                    continue
                p.sent = True  # before the send: a caller timing out meanwhile must not say "not sent"
                if p.jobs is None:
                    units.append([(rid, p)])
                    jobs = 0
                    continue
                last = units[-1] if units else None
                if last is not None and last[0][1].jobs is not None and jobs + len(p.jobs) <= GROUP_JOBS:
                    last.append((rid, p))
                    jobs += len(p.jobs)
                else:
                    units.append([(rid, p)])
                    jobs = len(p.jobs)
        for i, unit in enumerate(units):
            frame = self._frame(unit)
            try:
                sock.send(frame, zmq.NOBLOCK)
                if unit[0][1].jobs is not None:
                    self.submit_frames += 1
            except zmq.Again:
                with self._lock:
                    for later in units[i:]:
                        if len(later) > 1:
                            self._groups.pop(_group_rid(later), None)
                    for rid, q in reversed([m for later in units[i:] for m in later]):
                        if rid in self._pending:
                            q.sent = False
                            self._outbox.appendleft(rid)
                return False
        return True

    def _frame(self, unit: list[tuple[int, Pending]]) -> bytes:
        rid, p = unit[0]
        if p.jobs is None:
            return p.frame
        if len(unit) == 1:
            body: dict[str, Any] = {"jobs": p.jobs, "rid": rid}
            if p.submit_ids is not None:
                body["submit_ids"] = p.submit_ids
            return wire.encode(wire.Kind.SUBMIT, body)
        group_rid = _group_rid(unit)
        self._groups[group_rid] = unit
        body = {"jobs": [job for _, q in unit for job in q.jobs or ()], "rid": group_rid}
        if any(q.submit_ids is not None for _, q in unit):
            body["submit_ids"] = [
                submit_id
                for _, q in unit
                for submit_id in (q.submit_ids if q.submit_ids is not None else [None] * len(q.jobs or ()))
            ]
        return wire.encode(wire.Kind.SUBMIT, body)

    def _fail(self, message: Callable[[Pending], str], *, sent_only: bool, keep_with_submit_ids: bool = True) -> None:
        """Fail waiting requests: those sent (the connection that carried them is gone), or all. An
        unsent re-attach is dropped too: the next connection sends its own. Submits with submit ids are
        kept unless ``keep_with_submit_ids`` is False (closing): those sent go back to the outbox, to be
        sent again on the next connection (the pilot answers for the jobs it took with the jobs it made);
        their own timeout, not this, gives them up."""
        self._groups.clear()  # what was sent went with the connection (or the connection is closing)
        now = time.monotonic()
        victims: list[tuple[int, Pending]] = []
        again: list[int] = []
        with self._lock:
            for rid, p in self._pending.items():
                if p.submit_ids is not None and keep_with_submit_ids:
                    if p.sent:
                        p.sent = False
                        p.uncertain = True
                        p.since = now
                        again.append(rid)
                elif p.sent or not sent_only or p.internal:
                    victims.append((rid, p))
            for rid, p in victims:
                del self._pending[rid]
                if p.on_lost is not None:
                    self._unwaited -= 1
            if victims or again:
                self._outbox = deque(sorted(again + [r for r in self._outbox if r in self._pending]))
        for _, p in victims:
            self._lose(p, message(p))

    @staticmethod
    def _lose(p: Pending, message: str) -> None:
        """A request given up (removed from ``_pending`` already): its waiter, or its ``on_lost``, hears why."""
        p.lost = message
        p.done.set()
        if p.on_lost is not None:
            try:
                p.on_lost(message)
            except Exception:
                log.exception("lost-request hook failed")

    def _expire(self, now: float) -> None:
        """Give up the requests nobody waits on whose time is up: not answered within their timeout of
        being sent (or of the last answer read, while the pilot works through a backlog), or not sent
        within it of being queued (no pilot to send them to)."""
        with self._lock:
            if self._deferred:
                due = [rid for when, rid in self._deferred if when <= now and rid in self._pending]
                self._deferred = [(when, rid) for when, rid in self._deferred if when > now and rid in self._pending]
                self._outbox.extend(due)  # sent at the end of this turn, if the link is up
            late = [
                (rid, p)
                for rid, p in self._pending.items()
                if p.on_lost is not None and now >= (max(p.since, self._last_answer) if p.sent else p.since) + p.timeout
            ]
            for rid, _ in late:
                del self._pending[rid]
            self._unwaited -= len(late)
            if late:
                gone = {rid for rid, _ in late}
                self._outbox = deque(r for r in self._outbox if r not in gone)
        for _, p in late:
            self._lose(p, self._timeout_message(p.kind, p.timeout, sent=p.sent or p.uncertain))

    def _timeout_message(self, kind: str, timeout: float, *, sent: bool) -> str:
        if not sent:
            return (
                f"could not reach the pilot at {self.url} within {timeout:g} s (request_timeout); the {kind} "
                "request was not sent. "
                + (
                    f"The handshake failed: {self._refused}. Check the credentials (PILOT_CREDENTIALS)"
                    if self._refused
                    else "Is the pilot running? ('pilot status')"
                )
            )
        if kind == wire.Kind.SUBMIT:
            outcome = "the job may still be accepted: check list() before submitting it again"
        else:
            outcome = f"the {kind} request may still be carried out"
        return f"the pilot at {self.url} did not answer within {timeout:g} s (request_timeout); {outcome}"

    def _lost_message(self, kind: str) -> str:
        if kind == wire.Kind.SUBMIT:
            outcome = (
                "the job may or may not have been accepted: check list() before submitting it again "
                "(it is not resent, so that it cannot run twice)"
            )
        else:
            outcome = f"the {kind} request may or may not have been carried out"
        return f"the connection to the pilot at {self.url} was lost before it answered; {outcome}"


def _group_rid(unit: list[tuple[int, Pending]]) -> int:
    """A group frame's rid: its first member's, negated (rids count up from 1, so it names no request)."""
    return -unit[0][0]


def split_group(group: list[tuple[int, Pending]], body: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """The reply to a group submit, cut into each member's own reply (its results, in order)."""
    results = body.get("results")
    counts = [len(p.jobs or ()) for _, p in group]
    if not isinstance(results, list) or len(results) != sum(counts):
        error = body.get("error") or f"malformed reply from the pilot: {str(body)[:200]}"
        return [(rid, {"error": error, "rid": rid}) for rid, _ in group]
    out = []
    start = 0
    for (rid, _), count in zip(group, counts, strict=True):
        out.append((rid, {"results": results[start : start + count], "rid": rid}))
        start += count
    return out

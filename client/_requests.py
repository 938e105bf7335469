"""Requests to the daemon and the table of those not answered yet.

Shared state, all under ``_lock`` (the table's lock): ``_pending`` (every request not answered nor
given up, by rid), ``_outbox`` (rids not handed to a socket yet, in order), ``_deferred``,
``_unwaited`` and ``_abandoned``. Callers on any thread add to it and take back what they stop waiting
for; the I/O thread hands the outbox to the socket, matches replies and gives requests up. ``_groups``
(the members of each group frame sent) and ``_last_answer`` are the I/O thread's to write;
``_alive_at`` (a float: each write is a time the daemon was seen alive) is written by the I/O thread
and by a caller about to give a submit up, which looks at the run directory itself first. A
request's ``Done`` is set once, by whichever thread takes it out of ``_pending``: its one waiter
then reads ``body`` or ``lost``. SUBMITs that wait in the outbox together are framed as one (group
submit, ``client/_connection.py``).

A submit gets a definite answer, never a guess. Every PSI/J job is submitted under a submit id
(:class:`SubmitIds`). While the daemon lives -- stopped, swapped out or slow -- a submit waits for it,
whatever ``request_timeout`` says: the I/O thread looks at the run directory's pid (a remote client: at
its connection) and keeps ``_alive_at`` fresh. A submit is given up only ``request_timeout`` after the
daemon was last seen alive, or when the executor closes; one that may have reached a pilot is first
withdrawn (:meth:`RequestTable._abandon`): its submit ids go to the run directory's list of abandoned submits
(``RunDir.abandon``), which every daemon of that run directory reads before it takes another request,
refusing those submit ids and cancelling any job it made under one -- so the caller is told that the job will
not run, and it does not. A remote client sends ABANDON on its next connection instead.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import structlog
import zmq

from client.exceptions import SubmitException
from pilot import wire
from pilot.rundir import RunDir

log = structlog.get_logger("client")

OnReply = Callable[[dict[str, Any]], None]
#: Why a request nobody waits on was given up (on the I/O thread); the message says whether it was sent.
OnLost = Callable[[str], None]
Ticket = tuple[int, "Pending"]  # a queued request: its rid and its state, for Connection.wait

#: How long a request waits for its reply by default (the executors' ``request_timeout``). A daemon
#: that is gone is noticed well before that (socket monitor, run directory); this bounds a live daemon
#: that does not answer a request other than a submit, and how long a submit waits for a daemon that
#: is not seen alive to come back (a live one is waited for, however long it is stopped or slow).
DEFAULT_REQUEST_TIMEOUT: Final = 10.0

#: Seconds a sighting of the daemon stays good: the I/O thread looks at least this often while a
#: submit waits (``LIVENESS_INTERVAL`` on a connection, a connection attempt's ``CONNECT_TIMEOUT``).
ALIVE_SLACK: Final = 2.5
#: Requests given up only ``request_timeout`` after their daemon was last seen alive (a lease is asked
#: for by a submit).
WAITS_FOR_A_LIVE_DAEMON: Final = frozenset({wire.Kind.SUBMIT, wire.Kind.LEASE})

#: Most jobs in one SUBMIT frame when queued submits are sent together: the daemon handles a frame in
#: one step of its loop, so this bounds how long one frame holds up everything else there.
GROUP_JOBS: Final = 2000


class RequestTimeout(SubmitException):
    """The pilot did not answer within the request timeout (transient); the message says whether the
    request was sent."""


class SubmitIds:
    """The submit ids of one executor: a random prefix and a count (unique without a uuid per job)."""

    __slots__ = ("_prefix", "_serial")

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:20] + "-"
        self._serial = itertools.count(1)  # next() on it is atomic: callers on any thread

    def take(self, n: int) -> list[str]:
        return [self._prefix + str(next(self._serial)) for _ in range(n)]


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
        #: Set when it is answered or lost, for its one waiter; a request nobody waits on (``on_lost``)
        #: has none (a pipelined submit: one lock made and released per job for nothing).
        self.done: Done | None = Done() if on_lost is None else None
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
        #: Where the daemon's ``pilot.json`` (and the list of abandoned submits) is; None: a remote pilot.
        self.rundir: RunDir | None = None
        #: When the daemon was last seen alive (monotonic, written by the I/O thread): its pid running, or
        #: for a remote pilot its connection up. A submit is not given up while this is recent.
        self._alive_at = time.monotonic()
        #: Keys given up that a remote pilot has not been told of yet (ABANDON on its next connection).
        self._abandoned: list[str] = []

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
            if p.uncertain:
                body["again"] = True  # the pilot may know its submit ids: it looks them up in its journal
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
        if any(q.uncertain for _, q in unit):
            body["again"] = True
        return wire.encode(wire.Kind.SUBMIT, body)

    def _fail(self, message: Callable[[Pending], str], *, sent_only: bool, keep_with_submit_ids: bool = True) -> None:
        """Fail waiting requests: those sent (the connection that carried them is gone), or all. An
        unsent re-attach is dropped too: the next connection sends its own. Submits with submit ids that
        may have reached the pilot (and pipelined ones) are kept unless ``keep_with_submit_ids`` is False
        (closing): those sent go back to the outbox, to be sent again on the next connection (the pilot
        answers for the jobs it took with the jobs it made); their own timeout, not this, gives them up.
        Closing, those are withdrawn first (:meth:`_abandon`), so that what their callers hear is true."""
        self._groups.clear()  # what was sent went with the connection (or the connection is closing)
        now = time.monotonic()
        victims: list[tuple[int, Pending]] = []
        again: list[int] = []
        with self._lock:
            for rid, p in self._pending.items():
                resend = p.sent or p.uncertain or p.on_lost is not None  # else unsent: "not sent" is definite
                if p.submit_ids is not None and keep_with_submit_ids and resend:
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
        withdrawn = [p for _, p in victims if p.submit_ids is not None and (p.sent or p.uncertain)]
        submit_ids = [s for p in withdrawn for s in p.submit_ids or ()]
        failure = self._abandon(submit_ids, closing=not keep_with_submit_ids) if withdrawn else None
        for _, p in victims:
            if p.submit_ids is not None and (p.sent or p.uncertain):
                self._lose(p, f"{message(p)}, and the pilot had not answered; {self._withdrawn(failure)}")
            else:
                self._lose(p, message(p))

    def _abandon(self, submit_ids: list[str], *, closing: bool = False) -> str | None:
        """Withdraw submits that may have reached a pilot: a local one finds their submit ids in the run
        directory's list (read by every daemon of it before it takes another request), a remote one is
        told on this client's next connection (none when ``closing``). Why they could not be, or None."""
        if self.rundir is None:
            if closing:
                return "this client closed its connection to the remote pilot before it could tell it"
            with self._lock:
                self._abandoned.extend(submit_ids)
            return None
        try:
            self.rundir.abandon(submit_ids)
        except OSError as exc:
            log.error("cannot withdraw submits", path=str(self.rundir.abandoned_file), error=str(exc))
            return f"{self.rundir.abandoned_file}: {exc.strerror or exc}"
        return None

    def _withdrawn(self, failure: str | None) -> str:
        """What a withdrawn submit comes to, for its message (``failure``: why it could not be withdrawn)."""
        if failure is not None:
            return f"its withdrawal could not be recorded ({failure}): check list() before submitting it again"
        if self.rundir is None:
            return (
                "it was withdrawn: the pilot refuses it once this client reaches it again, and cancels the job "
                "if it had accepted it"
            )
        return (
            f"it was withdrawn: no pilot of {self.rundir.path} runs it (a daemon refuses the submit, or "
            "cancels the job if it had accepted it)"
        )

    def give_up_at(self, p: Pending, timeout: float, base: float) -> float:
        """When a request waiting since ``base`` (monotonic) is given up: ``timeout`` after it -- and a
        submit, also not before ``timeout`` after the daemon was last seen alive, nor before the I/O
        thread has had time to look (``ALIVE_SLACK``)."""
        if p.kind not in WAITS_FOR_A_LIVE_DAEMON:
            return base + timeout
        return max(base + max(timeout, ALIVE_SLACK), self._alive_at + ALIVE_SLACK + timeout)

    @staticmethod
    def _lose(p: Pending, message: str) -> None:
        """A request given up (removed from ``_pending`` already): its waiter, or its ``on_lost``, hears why."""
        p.lost = message
        if p.done is not None:
            p.done.set()
        if p.on_lost is not None:
            try:
                p.on_lost(message)
            except Exception:
                log.exception("lost-request hook failed")

    def _expire(self, now: float) -> None:
        """Give up the requests nobody waits on whose time is up (:meth:`give_up_at`): not answered
        within their timeout of being sent (or of the last answer read, while the pilot works through a
        backlog) nor of the daemon last seen alive, or not sent within it of being queued (no pilot to
        send them to). One that may have reached a pilot is withdrawn first; if that cannot be recorded
        now, it waits on (and is tried again at the next look)."""
        with self._lock:
            if self._deferred:
                due = [rid for when, rid in self._deferred if when <= now and rid in self._pending]
                self._deferred = [(when, rid) for when, rid in self._deferred if when > now and rid in self._pending]
                self._outbox.extend(due)  # sent at the end of this turn, if the link is up
            late = [
                (rid, p)
                for rid, p in self._pending.items()
                if p.on_lost is not None
                and now >= self.give_up_at(p, p.timeout, max(p.since, self._last_answer) if p.sent else p.since)
            ]
        # Only this thread sends the outbox or reads replies: nothing changes these requests meanwhile.
        withdrawn = [p for _, p in late if p.submit_ids is not None and (p.sent or p.uncertain)]
        if withdrawn and self._abandon([s for p in withdrawn for s in p.submit_ids or ()]) is not None:
            late = [(rid, p) for rid, p in late if p not in withdrawn]
        with self._lock:
            for rid, _ in late:
                del self._pending[rid]
            self._unwaited -= len(late)
            if late:
                gone = {rid for rid, _ in late}
                self._outbox = deque(r for r in self._outbox if r not in gone)
        for _, p in late:
            self._lose(p, self.timeout_message(p, p.timeout))

    def timeout_message(self, p: Pending, timeout: float) -> str:
        """Why ``p`` was given up at its timeout (withdrawn first, if a submit with submit ids that may
        have been received: see :meth:`_abandon`)."""
        sent = p.sent or p.uncertain
        if p.kind != wire.Kind.SUBMIT or not sent:
            return self._timeout_message(p.kind, timeout, sent=sent)
        where = "its daemon is not running" if self.rundir is not None else "no connection to it was up"
        said = f"the pilot at {self.url} did not answer within {timeout:g} s (request_timeout), and {where}"
        if p.submit_ids is None:  # only a hand-made SUBMIT: the client gives every job and document one
            return (
                f"{said}; the submit carried no submit ids, so whether its jobs were accepted is not known: "
                "check list() before submitting it again"
            )
        return f"{said}; {self._withdrawn(None)}"

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
        outcome = f"the {kind} request may still be carried out"
        return f"the pilot at {self.url} did not answer within {timeout:g} s (request_timeout); {outcome}"

    def _lost_message(self, kind: str) -> str:
        if kind == wire.Kind.SUBMIT:  # a hand-made one: the client's carry submit ids, and are sent again
            outcome = (
                "the submit carried no submit ids, so whether its jobs were accepted is not known: check "
                "list() before submitting it again (it is not resent, so that it cannot run twice)"
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

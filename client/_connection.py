"""One connection per process and daemon: a DEALER socket read by one of two worker threads.

Callers on any thread send their request themselves when nothing is waiting to go before it and no
other thread is sending (the socket is used under a lock: a full memory barrier, as ZeroMQ asks of a
socket used from several threads); otherwise they hand it to the reader, the I/O thread of the
moment (a queue plus a self-pipe). Either way they wait on their reply, at most ``timeout`` seconds
(the executor's ``request_timeout``). Only the reader reads: replies, and status batches. Two workers
share the work, leader/follower: the one that read a batch when nobody is delivering hands the
reader's turn to the other and runs the sinks itself (job updates, user callbacks), so a status
reaches its callbacks with no thread hand-off, and a slow callback never stalls the socket; batches
read meanwhile wait for it, in order, and callbacks run one at a time. A lone request costs no thread
hand-off on its way out either.

Group submit: SUBMIT requests that wait in the outbox together (from ``submit_all``'s pipelined
requests, or from several threads calling ``submit()`` while the previous frame is in flight) leave in
one frame of up to ``GROUP_JOBS`` jobs; the reply is cut back into each request's own results, hook
call and errors. Nothing waits to fill a frame: a lone submit leaves at once.

Losing the daemon, and getting it back (a new daemon on the same run directory):

- A socket serves one connection only (``RECONNECT_IVL`` -1) and is watched by a socket monitor. At its
  first disconnect the I/O thread closes it, which drops whatever ZeroMQ still held for it. A request
  already handed to that socket fails at once (``SubmitException``, transient) saying that it may or
  may not have been carried out. It is never sent again: a submit that got no reply must not create a
  second job behind the caller's back. A request not sent yet waits, within its timeout, for the next
  connection.
- While disconnected, the I/O thread reads the run directory's ``pilot.json``. When it names no live
  daemon, waiting requests fail at once (transient, "not sent") and so do new ones, instead of waiting
  out their timeout. When a live daemon is there again (``pilot up`` on the same run directory), a new
  socket connects to it. Without a known run directory (an explicit address), it retries with backoff.
- Once a connection is up, before anything else, the I/O thread sends ATTACH again for every job it
  still follows (those not final). The daemon subscribes the new connection, so status callbacks and
  ``Job.wait()`` resume; the status in the reply is delivered like an event. A job that the daemon says
  it does not know (restarted without it) ends FAILED, with a message saying so, instead of waiting
  forever.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Final

import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from client.exceptions import SubmitException
from pilot import wire
from pilot.rundir import INFO_FILE, RunDir
from pilot.security import Credentials
from pilot.wire.curve import handshake_failure, secure_client

log = structlog.get_logger("client")

StatusSink = Callable[[list[Any]], None]
OnReply = Callable[[dict[str, Any]], None]
#: Why a request nobody waits on was given up (on the I/O thread); the message says whether it was sent.
OnLost = Callable[[str], None]
Ticket = tuple[int, "_Pending"]  # a queued request: its rid and its state, for Connection.wait

#: How long a request waits for its reply by default (the executors' ``request_timeout``). A daemon
#: that is gone is noticed well before that (socket monitor, run directory); this bounds a live daemon
#: that does not answer, and a request made while the connection is being re-established. Keep it above
#: the few seconds a pilot at ``max_queued`` may hold a submit before refusing it (backpressure):
#: a submit whose caller timed out first may still be accepted afterwards (its message says so).
DEFAULT_REQUEST_TIMEOUT: Final = 10.0

_CONNECT_TIMEOUT: Final = 2.0  # one connection attempt, socket created to handshake done
_RETRY_MIN: Final = 0.1  # between looks at the run directory (or connection attempts) while disconnected
_RETRY_MAX: Final = 1.0  # backoff limit for attempts that fail
_LIVENESS_INTERVAL: Final = 0.5  # run directory check while requests wait on a live connection
_REATTACH_BATCH: Final = 5000  # job ids per ATTACH re-sent on reconnect
#: Most jobs in one SUBMIT frame when queued submits are sent together: the daemon handles a frame in
#: one step of its loop, so this bounds how long one frame holds up everything else there.
GROUP_JOBS: Final = 2000
_FINAL: Final = ("COMPLETED", "FAILED", "CANCELED")
_POLLIN: Final = int(zmq.POLLIN)  # plain ints: enum.Flag's operators cost more than the socket option
_POLLOUT: Final = int(zmq.POLLOUT)
_EVENTS: Final = int(zmq.EVENTS)
_DOWN_EVENTS: Final = frozenset(
    {
        zmq.EVENT_DISCONNECTED,
        zmq.EVENT_CLOSED,
        zmq.EVENT_MONITOR_STOPPED,
        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
        zmq.EVENT_HANDSHAKE_FAILED_AUTH,
    }
)


class RequestTimeout(SubmitException):
    """The pilot did not answer within the request timeout (transient); the message says whether the
    request was sent."""


class _Done:
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


class _Pending:
    __slots__ = (
        "body",
        "done",
        "frame",
        "internal",
        "jobs",
        "keys",
        "kind",
        "lost",
        "on_lost",
        "on_reply",
        "sent",
        "since",
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
        keys: list[str] | None = None,
        on_lost: OnLost | None = None,
        timeout: float = 0.0,
    ) -> None:
        self.kind = kind
        self.frame = frame  # empty for a submit: its jobs are encoded at send time, with those they travel with
        self.jobs = jobs  # a submit's job descriptions
        #: A keyed submit's job keys: the pilot knows a job by its key, so the request is sent again after
        #: a lost connection instead of failing (a job it had accepted is not made twice).
        self.keys = keys
        self.done = _Done()
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


class _Link:
    """One socket, one connection: up after the handshake, finished at the first disconnect."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], url: str, credentials: Credentials | None = None) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        if credentials is not None:
            secure_client(self.sock, credentials)  # CURVE, pinning the daemon's key: no impostor gets a frame
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
        self.sock.setsockopt(zmq.RECONNECT_IVL, -1)  # never reconnect this socket: frames queued on it die with it
        self.fd: int = self.sock.getsockopt(zmq.FD)  # type: ignore[assignment]  # polled instead of the socket
        try:
            self.mon = self.sock.get_monitor_socket(zmq.EVENT_ALL)
        except zmq.ZMQError:
            self.sock.close(linger=0)
            raise
        try:
            self.sock.connect(url)
        except zmq.ZMQError:
            self.close()
            raise
        self.up = False
        self.deadline = time.monotonic() + _CONNECT_TIMEOUT

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.mon.close(linger=0)
        self.sock.close(linger=0)


class Connection:
    _instances: ClassVar[dict[str, Connection]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def acquire(cls, url: str, *, rundir: RunDir | None = None, credentials: Credentials | None = None) -> Connection:
        """The process's connection to ``url`` (with these CURVE ``credentials``, for a remote pilot), shared;
        each ``acquire`` needs one :meth:`release`."""
        key = _instance_key(url, credentials)
        with cls._instances_lock:
            conn = cls._instances.get(key)
            if conn is None or conn._closed:
                conn = cls(url, rundir=rundir, credentials=credentials)
                cls._instances[key] = conn
            conn._users += 1
            return conn

    def release(self) -> None:
        """One user is done; the last one closes the connection (and joins its threads)."""
        with Connection._instances_lock:
            self._users -= 1
            if self._users > 0 or self._closed:
                return
            if Connection._instances.get(self._key) is self:
                del Connection._instances[self._key]
        self.close()

    @classmethod
    def close_url(cls, url: str, *, shutdown: bool = False) -> None:
        with cls._instances_lock:
            conn = cls._instances.pop(url, None)
        if conn is not None:
            if shutdown:
                try:
                    conn.request(wire.Kind.SHUTDOWN, {}, timeout=5)
                except SubmitException:
                    pass
            conn.close()

    def __init__(self, url: str, *, rundir: RunDir | None = None, credentials: Credentials | None = None) -> None:
        self.url = url
        self._credentials = credentials
        self._key = _instance_key(url, credentials)
        self._refused: str | None = None  # why the last handshake failed (a key refused, an impostor), if it did
        #: Where the daemon's ``pilot.json`` is, to tell a dead daemon from a slow one; None: unknown.
        self.rundir = rundir if rundir is not None else _rundir_of(url)
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._rids = itertools.count(1)
        self._lock = threading.Lock()
        #: Held for every use of the socket (send, receive, events, close). Taken before ``_lock`` when
        #: both are held. The reader polls the socket's FD, not the socket, so it never uses the
        #: socket without it.
        self._sock_lock = threading.Lock()
        #: The connection a caller may send on directly: up, and its re-attach sent (I/O thread sets it,
        #: under ``_sock_lock``).
        self._live: _Link | None = None
        self._outbox: deque[int] = deque()  # rids not sent yet, in order
        self._pending: dict[int, _Pending] = {}
        #: Submits sent together in one frame: the frame's rid -> its members, in order (I/O thread only).
        self._groups: dict[int, list[tuple[int, _Pending]]] = {}
        self._sinks: dict[str, list[StatusSink]] = {}
        #: Batches of (status, the sinks it goes to) read and not delivered yet, in order (the reader
        #: appends, the worker delivering takes them under ``_lock``).
        self._ready: deque[list[tuple[list[Any], list[StatusSink]]]] = deque()
        #: Statuses the reader routed or its hooks emitted in this turn, in order (the reader's only).
        self._out: list[tuple[list[Any], list[StatusSink]]] = []
        self._unwaited = 0  # requests with an ``on_lost`` not answered yet (under ``_lock``)
        self._deferred: list[tuple[float, int]] = []  # (when, rid) of those not to be queued before then
        self._expire_at = 0.0  # when the reader next looks for such requests past their deadline
        self._last_answer = 0.0  # when the reader last read a reply (monotonic)
        self._delivering = False  # a worker is running callbacks (under ``_lock``)
        #: The reader's turn: held by the worker that reads the socket. Releasing it wakes the other.
        self._reading = threading.Lock()
        self._reader: threading.Thread | None = None
        self._stopped = False  # the reader has closed the socket for good (set with ``_reading`` held)
        self._link: _Link | None = None  # the reader's state from one turn to the next
        self._poller = zmq.Poller()
        self._blocked = False  # the socket refused a send (high-water mark): send again when it can take more
        self._retry_at = 0.0
        self._backoff = _RETRY_MIN
        self._check_at = 0.0
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._wfd, False)
        self._closed = False
        self._users = 0
        self._dead: str | None = None  # why no daemon is running, while the I/O thread finds none
        self.connects = 0  # connections made so far (1 + reconnections)
        self.submit_frames = 0  # SUBMIT frames handed to a socket (several submits may share one)
        self._poller.register(self._rfd, zmq.POLLIN)
        self._workers = tuple(
            threading.Thread(target=self._work, name=f"pilot-client-{i}", daemon=True) for i in (1, 2)
        )
        for worker in self._workers:
            worker.start()

    @property
    def closed(self) -> bool:
        return self._closed

    def in_flight(self) -> int:
        """Requests handed to the daemon's socket and not answered yet."""
        with self._lock:
            return sum(1 for p in self._pending.values() if p.sent and not p.internal)

    def unsent(self) -> int:
        """Requests waiting to be handed to a socket (queued, or held back to be sent later)."""
        with self._lock:
            return sum(1 for p in self._pending.values() if not p.sent and not p.internal)

    # -- caller side --------------------------------------------------------------------------------

    def request(
        self,
        kind: str,
        body: dict[str, Any],
        *,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        on_reply: OnReply | None = None,
    ) -> dict[str, Any]:
        """Send one request and wait for its reply, at most ``timeout`` seconds. Raises a transient
        SubmitException when the daemon is not running, went away before answering, or is silent.
        ``on_reply`` runs on the I/O thread with the reply, before any later frame is read."""
        self._check_open()
        rid = next(self._rids)
        pending = _Pending(kind, wire.encode(kind, {**body, "rid": rid}), on_reply)
        self._enqueue(rid, pending)
        return self.wait((rid, pending), timeout=timeout)

    def submit(
        self,
        jobs: list[dict[str, Any]],
        *,
        on_reply: OnReply | None = None,
        keys: list[str] | None = None,
        on_lost: OnLost | None = None,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        delay: float = 0.0,
    ) -> Ticket:
        """Queue a SUBMIT of ``jobs`` and return at once; :meth:`wait` gets its reply (``results``, one
        per job, in order). Submits queued together, from any threads, travel in one frame (up to
        ``GROUP_JOBS`` jobs): each caller still gets only its own results, its own ``on_reply`` call
        and its own errors, as if it had been sent alone.

        ``keys`` (one per job) name the jobs to the pilot: a request whose connection is lost before its
        answer is sent again on the next one, and the pilot answers for a key it knows with the job it
        made then. With ``on_lost`` nobody waits: the answer goes to ``on_reply`` only, and a request
        not answered within ``timeout`` seconds (of its sending, or of the last answer read, whichever
        is later) or when the connection closes is given up, with the reason, to ``on_lost``; such a
        request may wait ``delay`` seconds (about: the reader's next look, within ``_LIVENESS_INTERVAL``)
        before it is queued."""
        self._check_open()
        rid = next(self._rids)
        pending = _Pending(wire.Kind.SUBMIT, b"", on_reply, jobs=jobs, keys=keys, on_lost=on_lost, timeout=timeout)
        if delay > 0 and on_lost is not None:
            pending.since += delay  # its timeout runs from when it is queued
            with self._lock:
                if self._closed:
                    raise SubmitException("the connection to the pilot is closed", transient=True)
                self._pending[rid] = pending
                self._unwaited += 1
                self._deferred.append((pending.since, rid))
            return rid, pending
        self._enqueue(rid, pending)
        return rid, pending

    def _check_open(self) -> None:
        if self._closed:
            raise SubmitException("the connection to the pilot is closed", transient=True)
        if self._dead is not None and self._daemon_gone():
            raise SubmitException(f"{self._dead}; the request was not sent", transient=True)

    def _enqueue(self, rid: int, pending: _Pending) -> None:
        with self._lock:
            if self._closed:
                raise SubmitException("the connection to the pilot is closed", transient=True)
            self._pending[rid] = pending
            behind = bool(self._outbox)  # the I/O thread has been woken for those already
            if pending.on_lost is not None:
                self._unwaited += 1
            direct = not behind and self._live is not None
            if not direct:
                self._outbox.append(rid)
        if direct:
            if self._send_now(rid, pending):
                return
            with self._lock:
                if self._pending.get(rid) is pending:
                    self._outbox.append(rid)
        elif behind:
            return
        self._wake()

    def _send_now(self, rid: int, pending: _Pending) -> bool:
        """Send a request on the caller's thread, when no other thread uses the socket; False when it
        must go through the outbox instead (socket busy, not up, or full)."""
        if not self._sock_lock.acquire(blocking=False):
            return False  # another thread is sending or reading: it goes with the I/O thread's next send
        try:
            link = self._live
            if link is None:
                return False
            frame = pending.frame if pending.jobs is None else self._frame([(rid, pending)])
            pending.sent = True  # before the send: a caller timing out meanwhile must not say "not sent"
            try:
                link.sock.send(frame, zmq.NOBLOCK)
            except zmq.ZMQError:  # full (the daemon is slow to read) or closing: the I/O thread deals with it
                pending.sent = False
                return False
            if pending.jobs is not None:
                self.submit_frames += 1
            if _events(link) & _POLLIN:
                self._wake()  # the send may have taken the FD's signal of a frame that came meanwhile
            return True
        finally:
            self._sock_lock.release()

    def wait(self, ticket: Ticket, *, timeout: float, since: float | None = None) -> dict[str, Any]:
        """The reply to a queued request, waiting until ``timeout`` seconds after ``since`` (a monotonic
        time, default now) at most. Raises a transient SubmitException (:class:`RequestTimeout` at the
        timeout)."""
        rid, pending = ticket
        kind = pending.kind
        left = timeout if since is None else max(0.0, since + timeout - time.monotonic())
        if not pending.done.wait(left):
            with self._lock:
                mine = self._pending.pop(rid, None) is not None
                sent = pending.sent
                if mine and not sent:
                    try:
                        self._outbox.remove(rid)
                    except ValueError:
                        pass
            if mine:
                raise RequestTimeout(self._timeout_message(kind, timeout, sent=sent), transient=True)
            pending.done.wait()  # the I/O thread took it meanwhile: its reply (or loss) is being delivered
        if pending.lost is not None:
            raise SubmitException(pending.lost, transient=True)
        assert pending.body is not None
        return pending.body

    @staticmethod
    def answered(ticket: Ticket) -> bool:
        """Whether :meth:`wait` on ``ticket`` would return (or raise) at once."""
        return ticket[1].done.is_set()

    def join(self, ticket: Ticket, add: Callable[[], None]) -> bool:
        """Let more jobs join a queued submit: if it has not been handed to a socket yet, call ``add``
        under the connection's lock -- it appends to the lists of jobs (and keys) the request was made
        with -- and return True; else False (make a new request)."""
        rid, pending = ticket
        with self._lock:
            if pending.sent or self._pending.get(rid) is not pending or self._dead is not None:
                return False  # (no pilot running: a new request says so, see _check_open)
            add()
            return True

    def subscribe(self, job_id: str, sink: StatusSink) -> None:
        """Route status updates of ``job_id`` to ``sink`` until its final one, across reconnections.
        Call from an ``on_reply`` hook to win the race with the job's first event."""
        with self._lock:
            self._sinks.setdefault(job_id, []).append(sink)

    def subscribe_many(self, pairs: list[tuple[str, StatusSink]]) -> None:
        """:meth:`subscribe` for many jobs at once."""
        with self._lock:
            sinks = self._sinks
            for job_id, sink in pairs:
                sinks.setdefault(job_id, []).append(sink)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake()
        me = threading.current_thread()
        if self._reader is not me:  # else called from a reply hook: the reader stops after this turn
            for worker in self._workers:
                if worker is not me:  # a callback closing it: its worker goes on delivering, then ends
                    worker.join(timeout=5)
        if self._stopped:
            os.close(self._rfd)
            os.close(self._wfd)

    def _wake(self) -> None:
        try:
            os.write(self._wfd, b"\0")
        except (BlockingIOError, OSError):
            pass

    def _daemon_gone(self) -> bool:
        """The run directory names no live daemon (False when there is no run directory to look at)."""
        return self.rundir is not None and self.rundir.read_info() is None

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

    def _not_running_message(self) -> str:
        where = self.rundir.path if self.rundir is not None else self.url
        return (
            f"no pilot is running in {where} (its daemon exited); start it again with 'pilot up', "
            "and this executor reconnects by itself"
        )

    # -- the workers: one reads, the other delivers -------------------------------------------------

    def _work(self) -> None:
        """One of two workers (leader/follower). The one holding the reader's turn reads the socket; when
        it has read statuses and nobody is delivering, it hands the turn to the other (releasing the
        lock wakes it) and runs the callbacks itself: a status reaches them with no thread hand-off on
        its way, and a slow callback still never stalls the socket."""
        while True:
            with self._reading:
                if self._stopped:
                    return
                self._reader = threading.current_thread()
                try:
                    deliver = self._read()
                finally:
                    self._reader = None
                if not deliver:
                    return
            self._deliver()

    def _read(self) -> bool:
        """Turns of the reader until there are statuses to deliver and nobody delivering (True, this
        worker is now the one delivering), or the connection is closed (False)."""
        try:
            while not self._closed:
                self._turn()
                self._publish()
                if self._ready and not self._delivering and self._claim():
                    return True
        except BaseException:
            self._stop()
            raise
        self._stop()
        return self._claim()  # what the last turns read is still delivered

    def _claim(self) -> bool:
        """Become the worker delivering, if there is something to deliver and nobody delivers it."""
        with self._lock:
            if not self._ready or self._delivering:
                return False
            self._delivering = True
            return True

    def _stop(self) -> None:
        """The reader's last act: close the socket, fail what still waits."""
        link, self._link = self._link, None
        if link is not None:
            with self._sock_lock:
                self._live = None
                link.close()
        self._fail(lambda p: "the connection to the pilot is closed", sent_only=False, keep_keyed=False)
        self._publish()
        self._stopped = True

    def emit(self, status: list[Any], sinks: list[StatusSink]) -> None:
        """Deliver ``status`` to ``sinks`` after every status read before it (from a reply or lost-request
        hook, on the reader: a submit's QUEUED or FAILED goes in order with the events around it)."""
        self._out.append((status, sinks))

    def _publish(self) -> None:
        """Hand this turn's statuses to the delivering worker, as one batch."""
        if self._out:
            self._ready.append(self._out)
            self._out = []

    def _turn(self) -> None:
        """One turn of the reader: (re)connect, wait for input, read, watch the link, send the outbox."""
        poller = self._poller
        link = self._link
        now = time.monotonic()
        if link is None and now >= self._retry_at:
            self._retry_at = now + self._backoff
            if self._daemon_gone():
                self._dead = self._not_running_message()
                self._fail(lambda p: f"{self._dead}; the {p.kind} request was not sent", sent_only=False)
            else:
                try:
                    link = self._link = _Link(self._ctx, self.url, self._credentials)
                except zmq.ZMQError as exc:
                    log.warning("cannot open a socket to the pilot", url=self.url, error=str(exc))
                    self._backoff = min(self._backoff * 2, _RETRY_MAX)
                else:
                    poller.register(link.fd, zmq.POLLIN)
                    poller.register(link.mon, zmq.POLLIN)
        if self._unwaited and now >= self._expire_at:
            self._expire_at = now + _LIVENESS_INTERVAL
            self._expire(now)
        if link is None:
            wait = self._retry_at - now
        elif not link.up:
            wait = link.deadline - now
        else:
            wait = _LIVENESS_INTERVAL if self._pending else 1.0
        if link is not None and self._due(link, blocked=self._blocked):
            wait = 0  # ZeroMQ's FD signals changes only: what is already there must be seen now
        ready = dict(poller.poll(max(0, int(wait * 1000))))
        if self._rfd in ready:
            os.read(self._rfd, 65536)
        if link is None:
            return
        self._receive(link)
        came_up, down = self._link_events(link) if link.mon in ready else (False, False)
        now = time.monotonic()
        if not down and not link.up and now >= link.deadline:
            down = True
        if not down and link.up and self._pending and now >= self._check_at:
            self._check_at = now + _LIVENESS_INTERVAL
            down = self._daemon_gone()  # belt and braces: the monitor normally says so first
        if down:
            self._receive(link)  # what the daemon sent before it went
            was_up = link.up
            poller.unregister(link.fd)
            poller.unregister(link.mon)
            with self._sock_lock:
                self._live = None
                link.close()
            self._link = None
            self._blocked = False
            if was_up:
                log.warning("lost the pilot", url=self.url)
                self._backoff = _RETRY_MIN
                self._retry_at = now  # look at the run directory right away
            else:
                self._backoff = min(self._backoff * 2, _RETRY_MAX)
            self._fail(lambda p: self._lost_message(p.kind), sent_only=True)
            return
        if came_up:
            self._dead = None
            self._backoff = _RETRY_MIN
            self.connects += 1
            if self.connects > 1:
                log.info("reconnected to the pilot", url=self.url)
            self._queue_reattach()
        if link.up and (self._outbox or self._live is not link):  # else nothing to send, nor to set
            self._blocked = not self._send(link)

    def _deliver(self) -> None:
        """Run the sinks of every batch read, in order, until none is left (then another worker may
        deliver). Statuses read meanwhile by the other worker are queued for this one."""
        ready = self._ready
        while True:
            with self._lock:
                if not ready:
                    self._delivering = False
                    return
                batch = ready.popleft()
            for status, sinks in batch:
                for sink in sinks:
                    try:
                        sink(status)
                    except Exception:
                        log.exception("status callback failed", job=status[0])

    def _link_events(self, link: _Link) -> tuple[bool, bool]:
        """(came up, went down) from the link's monitor events."""
        came_up = down = False
        while link.mon.poll(0):
            message = recv_monitor_message(link.mon)
            event = message["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED and not link.up:
                link.up = came_up = True
                self._refused = None
            elif event in _DOWN_EVENTS:
                down = True
                reason = handshake_failure(event, int(message["value"]), server=False)
                if reason is not None and self._refused is None:  # once until a handshake succeeds
                    log.warning("handshake with the pilot failed", url=self.url, reason=reason)
                if reason is not None and (self._refused is None or event != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
                    self._refused = reason  # a precise reason is not replaced by "closed during the handshake"
        return came_up, down

    def _due(self, link: _Link, *, blocked: bool) -> bool:
        """Whether the socket has a frame to read (or, ``blocked``, room to send) right now."""
        with self._sock_lock:
            events = _events(link)
        return bool(events & _POLLIN or (blocked and events & _POLLOUT))

    def _send(self, link: _Link) -> bool:
        """Hand the outbox to the socket, in order; False when it cannot take more now. Consecutive
        submits go in one frame (group submit): callers on several threads share one round trip. Once
        the outbox is empty (the re-attach of a new connection sent first), callers may send directly."""
        with self._sock_lock:
            sent = self._send_outbox(link.sock)
            if sent and link.up:
                with self._lock:
                    self._live = link if not self._outbox else None
            return sent

    def _send_outbox(self, sock: zmq.Socket[bytes]) -> bool:
        units: list[list[tuple[int, _Pending]]] = []  # one per frame
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
                            self._groups.pop(self._group_rid(later), None)
                    for rid, q in reversed([m for later in units[i:] for m in later]):
                        if rid in self._pending:
                            q.sent = False
                            self._outbox.appendleft(rid)
                return False
        return True

    def _frame(self, unit: list[tuple[int, _Pending]]) -> bytes:
        rid, p = unit[0]
        if p.jobs is None:
            return p.frame
        if len(unit) == 1:
            body: dict[str, Any] = {"jobs": p.jobs, "rid": rid}
            if p.keys is not None:
                body["keys"] = p.keys
            return wire.encode(wire.Kind.SUBMIT, body)
        group_rid = self._group_rid(unit)
        self._groups[group_rid] = unit
        body = {"jobs": [job for _, q in unit for job in q.jobs or ()], "rid": group_rid}
        if any(q.keys is not None for _, q in unit):
            body["keys"] = [k for _, q in unit for k in (q.keys if q.keys is not None else [None] * len(q.jobs or ()))]
        return wire.encode(wire.Kind.SUBMIT, body)

    @staticmethod
    def _group_rid(unit: list[tuple[int, _Pending]]) -> int:
        """A group frame's rid: its first member's, negated (rids count up from 1, so it names no request)."""
        return -unit[0][0]

    def _fail(self, message: Callable[[_Pending], str], *, sent_only: bool, keep_keyed: bool = True) -> None:
        """Fail waiting requests: those sent (the connection that carried them is gone), or all. An
        unsent re-attach is dropped too: the next connection sends its own. Keyed submits are kept
        unless ``keep_keyed`` is False (closing): those sent go back to the outbox, to be sent again on
        the next connection (the pilot answers for the jobs it took with the jobs it made); their own
        timeout, not this, gives them up."""
        self._groups.clear()  # what was sent went with the connection (or the connection is closing)
        now = time.monotonic()
        victims: list[tuple[int, _Pending]] = []
        again: list[int] = []
        with self._lock:
            for rid, p in self._pending.items():
                if p.keys is not None and keep_keyed:
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
    def _lose(p: _Pending, message: str) -> None:
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

    def _queue_reattach(self) -> None:
        """ATTACH every followed job again, ahead of anything else this connection sends."""
        with self._lock:
            ids = list(self._sinks)
            rids = []
            for start in range(0, len(ids), _REATTACH_BATCH):
                chunk = ids[start : start + _REATTACH_BATCH]
                rid = next(self._rids)
                frame = wire.encode(wire.Kind.ATTACH, {"ids": chunk, "rid": rid})
                self._pending[rid] = _Pending(
                    wire.Kind.ATTACH, frame, functools.partial(self._reattached, chunk), internal=True
                )
                rids.append(rid)
            self._outbox.extendleft(reversed(rids))
        if ids:
            log.info("following jobs again after reconnecting", url=self.url, jobs=len(ids))

    def _reattached(self, ids: list[str], body: dict[str, Any]) -> None:
        """The daemon's answer to a re-attach (on the I/O thread): each job's current status goes to its
        sinks; a job it does not know ends FAILED. Sinks of jobs that end here are removed now, before
        any later reply is read: a daemon that lost its jobs reuses their ids for new ones."""
        results = body.get("results")
        if not isinstance(results, list) or len(results) != len(ids):
            log.warning("unexpected answer to a re-attach; jobs not followed again", reply=str(body)[:200])
            return
        out = self._out  # in order with the statuses read before this answer
        now = time.time()
        with self._lock:
            for job_id, result in zip(ids, results, strict=True):
                sinks = self._sinks.get(job_id)
                if not sinks or not isinstance(result, dict):
                    continue
                status = result.get("status")
                if "error" in result or not (isinstance(status, list) and len(status) == 6):
                    error = result.get("error", f"malformed status {status!r}")
                    status = [
                        job_id,
                        "FAILED",
                        now,
                        None,
                        (
                            f"lost: the pilot was restarted and no longer knows job {job_id} ({error}); it may "
                            "have run, in part or in full, before the restart. Submit it again if needed"
                        ),
                        None,
                    ]
                    log.warning("job lost by the pilot's restart", job=job_id, error=str(error))
                if status[1] in _FINAL:
                    del self._sinks[job_id]
                out.append((status, list(sinks)))

    def _receive(self, link: _Link) -> None:
        frames: list[bytes] = []
        with self._sock_lock:
            while _events(link) & _POLLIN:  # not a receive until EAGAIN: pyzmq's exception costs more
                try:
                    frames.append(link.sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
        statuses = self._out
        answered = False
        for frame in frames:
            try:
                msg = wire.decode(frame, allowed=wire.TO_CLIENT_KINDS)
            except wire.ProtocolError as exc:
                log.warning("dropped frame from pilot", reason=str(exc))
                continue
            if msg.kind == wire.Kind.EVENTS:
                events = msg.body.get("events")
                if isinstance(events, list):
                    self._route([e for e in events if isinstance(e, list) and len(e) == 6], statuses)
                continue
            rid = msg.body.get("rid")
            if not isinstance(rid, int):
                continue
            group = self._groups.pop(rid, None)
            answers = [(rid, msg.body)] if group is None else _split(group, msg.body)
            answered = True
            for member, body in answers:
                with self._lock:
                    pending = self._pending.pop(member, None)
                    if pending is not None and pending.on_lost is not None:
                        self._unwaited -= 1
                if pending is None:  # unknown, or its caller gave up waiting
                    continue
                if pending.on_reply is not None:  # what it emits goes after the statuses read before it
                    try:
                        pending.on_reply(body)
                    except Exception:
                        log.exception("reply hook failed")
                pending.body = body
                pending.done.set()
        if answered:
            self._last_answer = time.monotonic()

    def _route(self, events: list[list[Any]], out: list[tuple[list[Any], list[StatusSink]]]) -> None:
        """Pair each status with its job's sinks now, on the I/O thread: the sinks a job has when its
        event is read (a hook subscribed them before), not whichever hold its id when it is dispatched."""
        with self._lock:
            for status in events:
                job_id = status[0]
                sinks = self._sinks.get(job_id) if isinstance(job_id, str) else None
                if not sinks:
                    continue
                if status[1] in _FINAL:
                    del self._sinks[job_id]
                out.append((status, list(sinks)))


def _events(link: _Link) -> int:
    """The socket's ZMQ_EVENTS (the socket lock held); also clears its FD's signal."""
    events: int = link.sock.getsockopt(_EVENTS)  # type: ignore[assignment]
    return events


def _split(group: list[tuple[int, _Pending]], body: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
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


def _instance_key(url: str, credentials: Credentials | None) -> str:
    """One shared connection per address and credentials (public keys only: no secret in a dict key)."""
    if credentials is None:
        return url
    return f"{url}#{credentials.server_public.decode()}#{credentials.keys.public.decode()}"


def _rundir_of(url: str) -> RunDir | None:
    """The run directory of an ``ipc://`` address in one (where ``pilot.json`` sits next to the socket)."""
    if not url.startswith("ipc://"):
        return None
    parent = Path(url.removeprefix("ipc://")).parent
    return RunDir(parent) if (parent / INFO_FILE).exists() else None

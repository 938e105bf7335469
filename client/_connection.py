"""One connection per process and daemon: a DEALER socket read by one of two worker threads.

This is the callers' side, on any thread. A caller sends its request itself when nothing is waiting to
go before it and no other thread is using the socket (it takes ``_sock_lock`` without blocking: a full
memory barrier, as ZeroMQ asks of a socket used from several threads); otherwise it puts the request in
the outbox and wakes the reader, the I/O thread of the moment (``client/_reader.py``). Either way it
waits on its reply, at most ``timeout`` seconds (the executor's ``request_timeout``): a lone request
costs no thread hand-off on its way out. The request table it adds to is shared under ``_lock``
(``client/_requests.py``); only the reader reads the socket, and the worker that read a batch of
statuses delivers it to the jobs' sinks (``client/_delivery.py``). The registry of shared connections
(``_instances``, ``_users``) is under the class's ``_instances_lock``.

Group submit: SUBMIT requests that wait in the outbox together (from ``submit_all``'s pipelined
requests, or from several threads calling ``submit()`` while the previous frame is in flight) leave in
one frame of up to ``GROUP_JOBS`` jobs; the reply is cut back into each request's own results, hook
call and errors. Nothing waits to fill a frame: a lone submit leaves at once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import zmq

from client._link import POLLIN, socket_events
from client._reader import LIVENESS_INTERVAL, Reader
from client._requests import (
    DEFAULT_REQUEST_TIMEOUT,
    WAITS_FOR_A_LIVE_DAEMON,
    OnLost,
    OnReply,
    Pending,
    RequestTimeout,
    Ticket,
)
from client.exceptions import SubmitException
from pilot import wire
from pilot.rundir import INFO_FILE, RunDir
from pilot.security import Credentials


class Connection(Reader):
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
        super().__init__(url, rundir=rundir if rundir is not None else _rundir_of(url), credentials=credentials)
        self._key = _instance_key(url, credentials)
        self._users = 0
        self._workers = tuple(
            threading.Thread(target=self._work, name=f"pilot-client-{i}", daemon=True) for i in (1, 2)
        )
        for worker in self._workers:
            worker.start()

    @property
    def closed(self) -> bool:
        return self._closed

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
        pending = Pending(kind, wire.encode(kind, {**body, "rid": rid}), on_reply)
        self._enqueue(rid, pending)
        return self.wait((rid, pending), timeout=timeout)

    def ask(
        self,
        kind: str,
        body: dict[str, Any],
        *,
        on_reply: OnReply,
        on_lost: Callable[[str, bool], None],
        timeout: float,
    ) -> None:
        """Send one request and return at once: its reply goes to ``on_reply``, or why it was given up
        (no answer within ``timeout`` seconds, the connection lost or closed) to ``on_lost``, with
        whether it had been sent, both on the I/O thread. Raises a transient SubmitException when it
        cannot be queued."""
        self._check_open()
        rid = next(self._rids)
        pending = Pending(kind, wire.encode(kind, {**body, "rid": rid}), on_reply, timeout=timeout)
        pending.on_lost = lambda message: on_lost(message, pending.sent or pending.uncertain)
        pending.since = time.monotonic()
        self._enqueue(rid, pending)

    def submit(
        self,
        jobs: list[dict[str, Any]],
        *,
        on_reply: OnReply | None = None,
        submit_ids: list[str] | None = None,
        on_lost: OnLost | None = None,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        delay: float = 0.0,
    ) -> Ticket:
        """Queue a SUBMIT of ``jobs`` and return at once; :meth:`wait` gets its reply (``results``, one
        per job, in order). Submits queued together, from any threads, travel in one frame (up to
        ``GROUP_JOBS`` jobs): each caller still gets only its own results, its own ``on_reply`` call
        and its own errors, as if it had been sent alone.

        ``submit_ids`` (one per job) name the jobs to the pilot: a request whose connection is lost
        before its answer is sent again on the next one, and the pilot answers for a submit id it knows
        with the job it made then. With ``on_lost`` nobody waits: the answer goes to ``on_reply`` only,
        and a request not answered within ``timeout`` seconds (of its sending, or of the last answer
        read, whichever is later) or when the connection closes is given up, with the reason, to
        ``on_lost``; such a request may wait ``delay`` seconds (about: the reader's next look, within
        ``LIVENESS_INTERVAL``) before it is queued."""
        self._check_open()
        rid = next(self._rids)
        pending = Pending(
            wire.Kind.SUBMIT, b"", on_reply, jobs=jobs, submit_ids=submit_ids, on_lost=on_lost, timeout=timeout
        )
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

    def check_open(self) -> None:
        """Raise a transient SubmitException if a request could not be sent now (closed, or the pilot gone)."""
        self._check_open()

    def _check_open(self) -> None:
        if self._closed:
            raise SubmitException("the connection to the pilot is closed", transient=True)
        if self._dead is not None and self._daemon_gone():
            raise SubmitException(f"{self._dead}; the request was not sent", transient=True)

    def _enqueue(self, rid: int, pending: Pending) -> None:
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

    def _send_now(self, rid: int, pending: Pending) -> bool:
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
            if socket_events(link) & POLLIN:
                self._wake()  # the send may have taken the FD's signal of a frame that came meanwhile
            return True
        finally:
            self._sock_lock.release()

    def wait(self, ticket: Ticket, *, timeout: float, since: float | None = None) -> dict[str, Any]:
        """The reply to a queued request, waiting until ``timeout`` seconds after ``since`` (a monotonic
        time, default now) at most -- a submit, as long as its daemon is seen alive and then ``timeout``
        more (:meth:`give_up_at`). Raises a transient SubmitException (:class:`RequestTimeout` at the
        timeout; a submit with submit ids is withdrawn first, so that its message is a definite answer)."""
        rid, pending = ticket
        done = pending.done
        if done is None:
            raise ValueError("a request given an on_lost hook is not waited on: its answer goes to its hooks")
        base = time.monotonic() if since is None else since
        while not done.wait(max(0.0, self.give_up_at(pending, timeout, base) - time.monotonic())):
            if time.monotonic() < self.give_up_at(pending, timeout, base):
                continue  # the daemon was seen alive meanwhile: wait on
            if pending.kind in WAITS_FOR_A_LIVE_DAEMON and self.rundir is not None and not self._daemon_gone():
                # The I/O thread, busy (a flood of statuses), has not looked for a while: looked here.
                self._alive_at = time.monotonic()
                continue
            # Withdrawn before it is taken out: whether it reaches the pilot after this or never, the pilot
            # does not run it (a submit id never sent costs one line in the run directory).
            if pending.submit_ids is not None and self._abandon(list(pending.submit_ids)) is not None:
                done.wait(LIVENESS_INTERVAL)  # cannot be recorded now: it waits on, tried again
                continue
            with self._lock:
                mine = self._pending.pop(rid, None) is not None
                if mine and not pending.sent:
                    try:
                        self._outbox.remove(rid)
                    except ValueError:
                        pass
            if mine:
                raise RequestTimeout(self.timeout_message(pending, timeout), transient=True)
            done.wait()  # the I/O thread took it meanwhile: its reply (or loss) is being delivered
            break
        if pending.lost is not None:
            raise SubmitException(pending.lost, transient=True)
        assert pending.body is not None
        return pending.body

    @staticmethod
    def answered(ticket: Ticket) -> bool:
        """Whether :meth:`wait` on ``ticket`` would return (or raise) at once."""
        done = ticket[1].done
        return done is None or done.is_set()

    def join(self, ticket: Ticket, add: Callable[[], None]) -> bool:
        """Let more jobs join a queued submit: if it has not been handed to a socket yet, call ``add``
        under the connection's lock -- it appends to the lists of jobs (and submit ids) the request was
        made with -- and return True; else False (make a new request)."""
        rid, pending = ticket
        with self._lock:
            if pending.sent or self._pending.get(rid) is not pending or self._dead is not None:
                return False  # (no pilot running: a new request says so, see _check_open)
            add()
            return True

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

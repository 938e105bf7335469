"""The reader's turn: (re)connecting, reading, sending the outbox, and following jobs again after a
reconnection.

All of this is the I/O thread's (the worker holding the reader's turn, see ``client/_delivery.py``):
the link and its poller, the backoff, ``_dead``, ``connects``. The socket is used under ``_sock_lock``
(taken before the table's ``_lock`` when both are held); ``_live``, the link a caller may send on
directly (up, and its re-attach sent), is set by the I/O thread under ``_sock_lock``. Callers wake the
reader through the self-pipe (``_wake``).

Losing the daemon, and getting it back (a new daemon on the same run directory):

- A socket serves one connection only and is watched by its monitor (``client/_link.py``). At its first
  disconnect the I/O thread closes it, which drops whatever ZeroMQ still held for it. A submit already
  handed to that socket carries submit ids (every job, every document): it is sent again on the next
  connection, where the pilot answers for a submit id it knows with what that id made, so nothing is
  made twice (``client/_requests.py``). Any other request already handed to it fails at once
  (``SubmitException``, transient) saying that it may or may not have been carried out (a cancel, an
  attach: asking again is safe). A request not sent yet waits, within its timeout, for the next
  connection.
- While disconnected, the I/O thread reads the run directory's ``pilot.json``. When it names no live
  daemon, waiting requests fail at once (transient, "not sent") and so do new ones, instead of waiting
  out their timeout. When a live daemon is there again (``pilot up`` on the same run directory), a new
  socket connects to it. Without a known run directory (an explicit address), it retries with backoff.
- While a submit waits, the I/O thread looks every ``LIVENESS_INTERVAL`` whether its daemon lives (the
  run directory's pid; without a run directory, whether the connection is up) and notes when it last
  did (``_alive_at``): a submit waits for a live daemon, however long it is stopped (see
  ``client/_requests.py``).
- Once a connection is up, before anything else, the I/O thread tells a remote pilot the submit ids
  of the submits it gave up on (ABANDON), then sends ATTACH again for every job it still follows (those not
  final). The daemon subscribes the new connection, so status callbacks and
  ``Job.wait()`` resume; the status in the reply is delivered like an event. A job that the daemon says
  it does not know (restarted without it) ends FAILED, with a message saying so, instead of waiting
  forever.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any, Final

import structlog
import zmq

from client._delivery import FINAL, Delivery
from client._link import POLLIN, POLLOUT, Link, socket_events
from client._requests import Pending, split_group
from pilot import wire
from pilot.rundir import RunDir
from pilot.security import Credentials
from pilot.wire.messages import StatusReport
from pilot.wire.to_client import decode_to_client

log = structlog.get_logger("client")

_RETRY_MIN: Final = 0.1  # between looks at the run directory (or connection attempts) while disconnected
_RETRY_MAX: Final = 1.0  # backoff limit for attempts that fail
LIVENESS_INTERVAL: Final = 0.5  # run directory check while requests wait on a live connection
_REATTACH_BATCH: Final = 5000  # job ids per ATTACH re-sent on reconnect


class Reader(Delivery):
    """The I/O thread's work on the socket, turn after turn."""

    def __init__(self, url: str, *, rundir: RunDir | None, credentials: Credentials | None) -> None:
        super().__init__(url)
        self._credentials = credentials
        #: Where the daemon's ``pilot.json`` is, to tell a dead daemon from a slow one; None: unknown.
        self.rundir = rundir
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        #: Held for every use of the socket (send, receive, events, close). Taken before ``_lock`` when
        #: both are held. The reader polls the socket's FD, not the socket, so it never uses the
        #: socket without it.
        self._sock_lock = threading.Lock()
        #: The connection a caller may send on directly: up, and its re-attach sent (I/O thread sets it,
        #: under ``_sock_lock``).
        self._live: Link | None = None
        self._link: Link | None = None  # the reader's state from one turn to the next
        self._poller = zmq.Poller()
        self._blocked = False  # the socket refused a send (high-water mark): send again when it can take more
        #: The reader's last use of the socket read its events and found no frame: a frame that comes
        #: later signals its FD, so the poll needs no look at the events first. A caller's send, which
        #: may take that signal, looks itself and wakes the reader (``Connection._send_now``).
        self._drained = False
        self._retry_at = 0.0
        self._backoff = _RETRY_MIN
        self._check_at = 0.0
        self._look_at = 0.0  # when the reader next looks whether the daemon lives, while submits wait
        self._expire_at = 0.0  # when the reader next looks for requests nobody waits on past their deadline
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._wfd, False)
        self._dead: str | None = None  # why no daemon is running, while the I/O thread finds none
        self.connects = 0  # connections made so far (1 + reconnections)
        self._poller.register(self._rfd, zmq.POLLIN)

    def _wake(self) -> None:
        try:
            os.write(self._wfd, b"\0")
        except (BlockingIOError, OSError):
            pass

    def _daemon_gone(self) -> bool:
        """The run directory names no live daemon (False when there is no run directory to look at)."""
        return self.rundir is not None and self.rundir.read_info() is None

    def _not_running_message(self) -> str:
        where = self.rundir.path if self.rundir is not None else self.url
        return (
            f"no pilot is running in {where} (its daemon exited); start it again with 'pilot up', "
            "and this executor reconnects by itself"
        )

    def _stop(self) -> None:
        """The reader's last act: close the socket, fail what still waits."""
        link, self._link = self._link, None
        if link is not None:
            with self._sock_lock:
                self._live = None
                link.close()
        self._fail(
            lambda p: "the connection to the pilot is closed" + ("" if p.sent or p.uncertain else "; it was not sent"),
            sent_only=False,
            keep_with_submit_ids=False,
        )
        self._publish()
        self._stopped = True

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
                    link = self._link = Link(self._ctx, self.url, self._credentials)
                    self._drained = False
                except zmq.ZMQError as exc:
                    log.warning("cannot open a socket to the pilot", url=self.url, error=str(exc))
                    self._backoff = min(self._backoff * 2, _RETRY_MAX)
                else:
                    poller.register(link.fd, zmq.POLLIN)
                    poller.register(link.mon, zmq.POLLIN)
        if self._pending and now >= self._look_at:
            self._look_at = now + LIVENESS_INTERVAL
            alive = (link is not None and link.up) if self.rundir is None else not self._daemon_gone()
            if alive:
                self._alive_at = now
        if self._unwaited and now >= self._expire_at:
            self._expire_at = now + LIVENESS_INTERVAL
            self._expire(now)
        if link is None:
            wait = self._retry_at - now
        elif not link.up:
            wait = link.deadline - now
        else:
            wait = LIVENESS_INTERVAL if self._pending else 1.0
        if link is not None and (self._blocked or not self._drained) and self._due(link, blocked=self._blocked):
            wait = 0  # ZeroMQ's FD signals changes only: what is already there must be seen now
        ready = dict(poller.poll(max(0, int(wait * 1000))))
        if self._rfd in ready:
            os.read(self._rfd, 65536)
        if link is None:
            return
        self._receive(link)
        came_up = down = False
        if link.mon in ready:
            came_up, down, self._refused = link.monitor(self.url, self._refused)
        now = time.monotonic()
        if not down and not link.up and now >= link.deadline:
            down = True
        if not down and link.up and self._pending and now >= self._check_at:
            self._check_at = now + LIVENESS_INTERVAL
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
        if self._abandoned and link.up:
            self._tell_abandoned()
        if link.up and (self._outbox or self._live is not link):  # else nothing to send, nor to set
            self._drained = False
            self._blocked = not self._send(link)

    def _due(self, link: Link, *, blocked: bool) -> bool:
        """Whether the socket has a frame to read (or, ``blocked``, room to send) right now."""
        with self._sock_lock:
            events = socket_events(link)
        self._drained = not events & POLLIN
        return bool(events & POLLIN or (blocked and events & POLLOUT))

    def _send(self, link: Link) -> bool:
        """Hand the outbox to the socket, in order; False when it cannot take more now. Consecutive
        submits go in one frame (group submit): callers on several threads share one round trip. Once
        the outbox is empty (the re-attach of a new connection sent first), callers may send directly."""
        with self._sock_lock:
            sent = self._send_outbox(link.sock)
            if sent and link.up:
                with self._lock:
                    self._live = link if not self._outbox else None
            return sent

    def _receive(self, link: Link) -> None:
        frames: list[bytes] = []
        with self._sock_lock:
            while socket_events(link) & POLLIN:  # not a receive until EAGAIN: pyzmq's exception costs more
                try:
                    frames.append(link.sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    self._drained = False
                    break
            else:
                self._drained = True
        if frames and self.rundir is not None:
            self._alive_at = time.monotonic()  # what the daemon sent is a sighting of it too
        statuses = self._out
        answered = False
        for frame in frames:
            try:
                read = decode_to_client(frame)
            except wire.ProtocolError as exc:
                log.warning("dropped frame from pilot", reason=str(exc))
                continue
            if isinstance(read, tuple):  # an EVENTS frame's
                for reason in read[1]:
                    log.warning("dropped a malformed job status from the pilot", reason=reason)
                self._route(read[0], statuses)
                continue
            rid = read.get("rid")
            if not isinstance(rid, int):
                continue
            group = self._groups.pop(rid, None)
            answers = [(rid, read)] if group is None else split_group(group, read)
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
                if pending.done is not None:
                    pending.done.set()
        if answered:
            self._last_answer = time.monotonic()

    def _tell_abandoned(self) -> None:
        """Tell a remote pilot the submit ids of the submits given up, ahead of anything else this connection
        sends (unless that is under way)."""
        with self._lock:
            if not self._abandoned or any(p.kind == wire.Kind.ABANDON for p in self._pending.values()):
                return
            submit_ids = list(self._abandoned)
            rid = next(self._rids)
            frame = wire.encode(wire.Kind.ABANDON, {"submit_ids": submit_ids, "rid": rid})
            told = functools.partial(self._told_abandoned, submit_ids)
            self._pending[rid] = Pending(wire.Kind.ABANDON, frame, told, internal=True)
            self._outbox.appendleft(rid)

    def _queue_reattach(self) -> None:
        """ATTACH every followed job again, ahead of anything else this connection sends."""
        with self._lock:
            ids = list(self._sinks)
            rids = []
            for start in range(0, len(ids), _REATTACH_BATCH):
                chunk = ids[start : start + _REATTACH_BATCH]
                rid = next(self._rids)
                frame = wire.encode(wire.Kind.ATTACH, {"ids": chunk, "rid": rid})
                self._pending[rid] = Pending(
                    wire.Kind.ATTACH, frame, functools.partial(self._reattached, chunk), internal=True
                )
                rids.append(rid)
            self._outbox.extendleft(reversed(rids))
        if ids:
            log.info("following jobs again after reconnecting", url=self.url, jobs=len(ids))

    def _told_abandoned(self, submit_ids: list[str], body: dict[str, Any]) -> None:
        """The pilot has the submit ids given up (on the I/O thread): they need not be told again."""
        if "results" not in body:
            log.warning("unexpected answer to an abandon; told again next time", reply=str(body)[:200])
            return
        told = set(submit_ids)
        with self._lock:
            self._abandoned = [k for k in self._abandoned if k not in told]

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
                status = report(result.get("status")) if "error" not in result else None
                if status is None:
                    error = result.get("error", f"malformed status {result.get('status')!r}")
                    status = StatusReport(
                        job_id,
                        "FAILED",
                        now,
                        None,
                        (
                            f"lost: the pilot was restarted and no longer knows job {job_id} ({error}); it may "
                            "have run, in part or in full, before the restart. Submit it again if needed"
                        ),
                        None,
                    )
                    log.warning("job lost by the pilot's restart", job=job_id, error=str(error))
                if status.state in FINAL:
                    del self._sinks[job_id]
                for sink in sinks:
                    out.append((status, sink))


def report(raw: Any) -> StatusReport | None:
    """A job status from the pilot, checked once here; None (and a warning) for a malformed one."""
    try:
        return StatusReport.from_wire(raw)
    except wire.ProtocolError as exc:
        log.warning("dropped a malformed job status from the pilot", reason=str(exc))
        return None

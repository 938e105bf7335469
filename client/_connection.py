"""One connection per process and daemon: a DEALER socket owned by an I/O thread.

Callers on any thread hand requests to the I/O thread (a list plus a self-pipe) and wait on their
reply; status batches go to a dispatch thread that updates jobs and runs user callbacks, so a slow
callback never stalls the socket.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from client.exceptions import SubmitException
from pilot import wire

log = structlog.get_logger("client")

StatusSink = Callable[[list[Any]], None]
OnReply = Callable[[dict[str, Any]], None]

#: After the daemon's socket goes away, how long a reconnect may take before requests fail (transient).
RECONNECT_GRACE = 2.0


class _Pending:
    __slots__ = ("body", "done", "lost", "on_reply")

    def __init__(self, on_reply: OnReply | None) -> None:
        self.done = threading.Event()
        self.body: dict[str, Any] | None = None
        self.lost: str | None = None  # set instead of body when the daemon went away
        self.on_reply = on_reply


class Connection:
    _instances: ClassVar[dict[str, Connection]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def get(cls, url: str) -> Connection:
        with cls._instances_lock:
            conn = cls._instances.get(url)
            if conn is None or conn._closed:
                conn = cls(url)
                cls._instances[url] = conn
            return conn

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

    def __init__(self, url: str) -> None:
        self.url = url
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._rids = itertools.count(1)
        self._lock = threading.Lock()
        self._outbox: list[bytes] = []
        self._pending: dict[int, _Pending] = {}
        self._sinks: dict[str, list[StatusSink]] = {}
        self._statuses: queue.SimpleQueue[list[list[Any]] | None] = queue.SimpleQueue()
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._wfd, False)
        self._closed = False
        self._io = threading.Thread(target=self._io_loop, name="pilot-client-io", daemon=True)
        self._dispatch = threading.Thread(target=self._dispatch_loop, name="pilot-client-callbacks", daemon=True)
        self._io.start()
        self._dispatch.start()

    # -- caller side --------------------------------------------------------------------------------

    def request(
        self, kind: str, body: dict[str, Any], *, timeout: float = 30.0, on_reply: OnReply | None = None
    ) -> dict[str, Any]:
        """Send one request and wait for its reply; SubmitException(transient) when the daemon is silent."""
        if self._closed:
            raise SubmitException("the connection to the pilot is closed", transient=True)
        rid = next(self._rids)
        pending = _Pending(on_reply)
        frame = wire.encode(kind, {**body, "rid": rid})
        with self._lock:
            self._pending[rid] = pending
            self._outbox.append(frame)
        self._wake()
        if not pending.done.wait(timeout):
            with self._lock:
                self._pending.pop(rid, None)
            raise SubmitException(
                f"the pilot at {self.url} did not answer within {timeout:g} s; is it running? ('pilot status')",
                transient=True,
            )
        if pending.lost is not None:
            raise SubmitException(pending.lost, transient=True)
        assert pending.body is not None
        return pending.body

    def subscribe(self, job_id: str, sink: StatusSink) -> None:
        """Route status updates of ``job_id`` to ``sink``. Call from an ``on_reply`` hook to win the race
        with the job's first event."""
        self._sinks.setdefault(job_id, []).append(sink)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake()
        self._io.join(timeout=5)
        self._statuses.put(None)
        if threading.current_thread() is not self._dispatch:
            self._dispatch.join(timeout=5)
        os.close(self._rfd)
        os.close(self._wfd)

    def _wake(self) -> None:
        try:
            os.write(self._wfd, b"\0")
        except (BlockingIOError, OSError):
            pass

    # -- I/O thread ---------------------------------------------------------------------------------

    def _io_loop(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
        # Watch the connection: a daemon that is gone fails pending requests fast instead of at their timeout.
        mon = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sock.connect(self.url)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._rfd, zmq.POLLIN)
        poller.register(mon, zmq.POLLIN)
        down_since: float | None = None
        try:
            while not self._closed:
                ready = dict(poller.poll(1000 if down_since is None else 100))
                if mon in ready:
                    while mon.poll(0):
                        event = recv_monitor_message(mon)["event"]
                        if event == zmq.EVENT_CONNECTED:
                            down_since = None
                        elif event == zmq.EVENT_DISCONNECTED and down_since is None:
                            down_since = time.monotonic()
                if down_since is not None and time.monotonic() - down_since > RECONNECT_GRACE:
                    self._fail_pending(f"the pilot at {self.url} went away; is it running? ('pilot status')")
                if self._rfd in ready:
                    os.read(self._rfd, 65536)
                    with self._lock:
                        out, self._outbox = self._outbox, []
                    for frame in out:
                        sock.send(frame)
                if sock in ready:
                    self._receive(sock)
        finally:
            sock.disable_monitor()
            mon.close(linger=0)
            sock.close(linger=0)

    def _fail_pending(self, message: str) -> None:
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
            self._outbox = []  # not sent: a daemon that comes back must not run what the caller saw fail
        for p in pending:
            p.lost = message
            p.done.set()

    def _receive(self, sock: zmq.Socket[bytes]) -> None:
        statuses: list[list[Any]] = []
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                msg = wire.decode(frame, allowed=wire.TO_CLIENT_KINDS)
            except wire.ProtocolError as exc:
                log.warning("dropped frame from pilot", reason=str(exc))
                continue
            if msg.kind == wire.Kind.EVENTS:
                events = msg.body.get("events")
                if isinstance(events, list):
                    statuses.extend(e for e in events if isinstance(e, list) and len(e) == 6)
                continue
            rid = msg.body.get("rid")
            with self._lock:
                pending = self._pending.pop(rid, None) if isinstance(rid, int) else None
            if pending is None:
                continue
            if pending.on_reply is not None:
                try:
                    pending.on_reply(msg.body)
                except Exception:
                    log.exception("reply hook failed")
            pending.body = msg.body
            pending.done.set()
        if statuses:
            self._statuses.put(statuses)

    # -- dispatch thread ----------------------------------------------------------------------------

    def _dispatch_loop(self) -> None:
        while True:
            batch = self._statuses.get()
            if batch is None:
                return
            for status in batch:
                job_id = status[0]
                sinks = self._sinks.get(job_id) if isinstance(job_id, str) else None
                if not sinks:
                    continue
                if status[1] in ("COMPLETED", "FAILED", "CANCELED"):
                    self._sinks.pop(job_id, None)
                for sink in sinks:
                    try:
                        sink(status)
                    except Exception:
                        log.exception("status callback failed", job=job_id)

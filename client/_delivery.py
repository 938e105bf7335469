"""The two worker threads, leader/follower, and the delivery of statuses to their jobs' sinks.

The worker holding ``_reading`` (the reader's turn) is the I/O thread: only it reads the socket, and
``_out`` (the statuses its turn routed or its hooks emitted, in order) is its own. When it has read
statuses and nobody is delivering, it releases the turn (waking the other worker) and runs the sinks
itself: a status reaches its callbacks with no thread hand-off, and a slow callback never stalls the
socket. Shared under the table's ``_lock``: ``_ready`` (batches read and not delivered yet, in order:
the reader appends, the worker delivering takes), ``_delivering`` (a worker runs callbacks, one batch
at a time, in order) and ``_sinks`` (each followed job's sinks, a tuple replaced, never changed, so the
reader pairs each status with them without a copy: callers subscribe, the reader drops them at a job's
final status).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Final

import structlog

from client._requests import RequestTable
from pilot.thread_names import name_os_thread
from pilot.wire.messages import StatusReport

log = structlog.get_logger("client")

StatusSink = Callable[[StatusReport], None]
#: A batch of statuses to deliver, in order: each with one sink it goes to.
Batch = list[tuple[StatusReport, StatusSink]]
FINAL: Final = ("COMPLETED", "FAILED", "CANCELED")


class Delivery(RequestTable):
    """The reader's turn, taken by two workers in turn, and the sinks it feeds."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._sinks: dict[str, tuple[StatusSink, ...]] = {}
        #: Batches read and not delivered yet, in order (the reader appends, the worker delivering takes
        #: them under ``_lock``).
        self._ready: deque[Batch] = deque()
        #: Statuses the reader routed or its hooks emitted in this turn, in order (the reader's only).
        self._out: Batch = []
        self._delivering = False  # a worker is running callbacks (under ``_lock``)
        #: The reader's turn: held by the worker that reads the socket. Releasing it wakes the other.
        self._reading = threading.Lock()
        self._reader: threading.Thread | None = None
        self._stopped = False  # the reader has closed the socket for good (set with ``_reading`` held)

    def subscribe(self, job_id: str, sink: StatusSink) -> None:
        """Route status updates of ``job_id`` to ``sink`` until its final one, across reconnections.
        Call from an ``on_reply`` hook to win the race with the job's first event."""
        with self._lock:
            self._sinks[job_id] = (*self._sinks.get(job_id, ()), sink)

    def subscribe_many(self, pairs: list[tuple[str, StatusSink]]) -> None:
        """:meth:`subscribe` for many jobs at once."""
        with self._lock:
            sinks = self._sinks
            for job_id, sink in pairs:
                known = sinks.get(job_id)
                sinks[job_id] = (sink,) if known is None else (*known, sink)

    def emit(self, status: StatusReport, sink: StatusSink) -> None:
        """Deliver ``status`` to ``sink`` after every status read before it (from a reply or lost-request
        hook, on the reader: a submit's QUEUED or FAILED goes in order with the events around it)."""
        self._out.append((status, sink))

    def _turn(self) -> None:
        """One turn of the reader (the I/O thread's work: see ``client/_reader.py``)."""
        raise NotImplementedError

    def _stop(self) -> None:
        """The reader's last act: close the socket, fail what still waits."""
        raise NotImplementedError

    def _work(self) -> None:
        """One of two workers (leader/follower). The one holding the reader's turn reads the socket; when
        it has read statuses and nobody is delivering, it hands the turn to the other (releasing the
        lock wakes it) and runs the callbacks itself: a status reaches them with no thread hand-off on
        its way, and a slow callback still never stalls the socket."""
        name_os_thread()
        me = threading.current_thread()
        while True:
            with self._reading:
                if self._stopped:
                    return
                self._reader = me
                try:
                    batch = self._read()
                finally:
                    self._reader = None
                if batch is None:
                    return
            self._deliver(batch)

    def _read(self) -> Batch | None:
        """Turns of the reader until there are statuses to deliver and nobody delivering (this worker is
        now the one delivering: the first batch to deliver), or the connection is closed (None)."""
        ready = self._ready
        try:
            while not self._closed:
                self._turn()
                if self._out:  # (_publish, written out: once per frame read)
                    ready.append(self._out)
                    self._out = []
                if ready and not self._delivering:
                    batch = self._claim()
                    if batch is not None:
                        return batch
        except BaseException:
            self._stop()
            raise
        self._stop()
        return self._claim()  # what the last turns read is still delivered

    def _claim(self) -> Batch | None:
        """Become the worker delivering, if there is something to deliver and nobody delivers it: the
        first batch to deliver (taken with the same lock)."""
        with self._lock:
            if not self._ready or self._delivering:
                return None
            self._delivering = True
            return self._ready.popleft()

    def _publish(self) -> None:
        """Hand this turn's statuses to the delivering worker, as one batch."""
        if self._out:
            self._ready.append(self._out)
            self._out = []

    def _deliver(self, batch: Batch) -> None:
        """Run the sinks of ``batch``, then of every batch read meanwhile, in order, until none is left
        (then another worker may deliver). Statuses read meanwhile by the other worker are queued for
        this one."""
        ready = self._ready
        while True:
            for status, sink in batch:
                try:
                    sink(status)
                except Exception:
                    log.exception("status callback failed", job=status.job_id)
            with self._lock:
                if not ready:
                    self._delivering = False
                    return
                batch = ready.popleft()

    def _route(self, events: list[StatusReport], out: Batch) -> None:
        """Pair each status with its job's sinks now, on the I/O thread: the sinks a job has when its
        event is read (a hook subscribed them before), not whichever hold its id when it is dispatched."""
        with self._lock:
            for status in events:
                job_id = status.job_id
                if job_id is None:
                    continue
                sinks = self._sinks.get(job_id)
                if not sinks:
                    continue
                if status.state in FINAL:
                    del self._sinks[job_id]
                for sink in sinks:
                    out.append((status, sink))

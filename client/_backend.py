"""The executor operations on the wire, shared by our JobExecutor and the psij-python plugin.

Connecting is lazy: creating an executor costs nothing until its first request (psij-python builds
one of every registered executor at test collection). A request waits at most ``request_timeout``
seconds for its answer; a daemon that is gone is reported sooner (see ``client/_reader.py``), and
the connection follows a daemon restarted on the same run directory by itself. A submit is the
exception: every job goes under a submit id, and waits for a live daemon however long it is stopped,
is sent again to a daemon restarted on the run directory, and is withdrawn when given up, so that its
answer is always definite (``client/_requests.py``).
"""

from __future__ import annotations

import builtins
import functools
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import structlog

from client import _embedded
from client._connection import Connection
from client._delivery import StatusSink
from client._pipeline import RETRY_DELAY, Pipeline
from client._reader import report
from client._requests import DEFAULT_REQUEST_TIMEOUT, SubmitIds, Ticket
from client.exceptions import InvalidJobException, SubmitException
from pilot import job_ids, wire
from pilot.rundir import RunDir
from pilot.security import ENV_CLIENT_ACCESS, Credentials, SecurityError, read_client_access
from pilot.wire.messages import StatusReport

log = structlog.get_logger("client")

_FINAL = ("COMPLETED", "FAILED", "CANCELED")
#: What submitting one job came to: the time the pilot queued it (None if it did not say), or why not.
Outcome = float | SubmitException | InvalidJobException | None
#: Jobs per SUBMIT request of a batch (``submit_many``); the connection may send several in one frame.
SUBMIT_CHUNK = 1000
#: Jobs in a batch's first request; each next one is twice as large, up to ``SUBMIT_CHUNK``. A large
#: batch's first tasks then start after a few jobs are encoded, journaled and placed, not a thousand.
SUBMIT_FIRST = 16
#: Requests of one batch in flight at most: enough to keep the pilot busy between replies, few enough
#: that it never holds a large backlog of unanswered jobs (its memory high-water mark grows with that).
SUBMIT_WINDOW = 4
#: Seconds between asking again to attach a job whose submit has not reached the pilot yet.
ATTACH_RETRY = 0.05


#: Environment variable that says whether executors are pipelined unless they are told otherwise (tools
#: built on psij-python cannot pass the keyword): 1/true/yes (the default) or 0/false/no.
ENV_PIPELINED = "PILOT_PIPELINED"
_YES = ("", "1", "true", "yes", "on")
_NO = ("0", "false", "no", "off")


def pipelined_choice(explicit: bool | None, config: object) -> bool:
    """Whether an executor submits pipelined: the keyword if given, else the config's ``pipelined``
    attribute, else ``PILOT_PIPELINED``, else yes: the fast path is the default."""
    choice: object = explicit
    if choice is None:
        choice = getattr(config, "pipelined", None)
    if choice is None:
        value = os.environ.get(ENV_PIPELINED, "").strip().lower()
        if value not in _YES + _NO:
            raise ValueError(f"{ENV_PIPELINED}={os.environ[ENV_PIPELINED]!r}: use 1 (pipelined submits) or 0")
        choice = value in _YES
    if not isinstance(choice, bool):
        raise TypeError(f"pipelined must be True or False, not {choice!r}")
    return choice


def check_timeout(request_timeout: float) -> float:
    if isinstance(request_timeout, bool) or not isinstance(request_timeout, int | float):
        raise TypeError(f"request_timeout must be a number of seconds, not {type(request_timeout).__name__}")
    if not (request_timeout > 0 and math.isfinite(request_timeout)):
        raise ValueError(f"request_timeout must be a positive number of seconds, not {request_timeout!r}")
    return float(request_timeout)


class Backend:
    def __init__(
        self, url: str | None, *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT, pipelined: bool = False
    ) -> None:
        self._url = url
        self.request_timeout = check_timeout(request_timeout)
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._embedded = False
        self._closed = False
        self.submit_ids = SubmitIds()  # every job's submit id
        #: Pipelined submits (see ``client/_pipeline.py``), or None: each submit waits for its answer.
        self.pipeline = Pipeline(lambda: self.connection, request_timeout=self.request_timeout) if pipelined else None

    @property
    def connection(self) -> Connection:
        if self._closed:
            raise SubmitException("this executor is closed; create a new one", transient=False)
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        with self._lock:
            if self._closed:
                raise SubmitException("this executor is closed; create a new one", transient=False)
            if self._conn is None or self._conn.closed:
                address, embedded, rundir, credentials = _locate(self._url)
                if embedded and self._embedded:
                    _embedded.release()
                self._embedded = embedded
                if self._conn is not None:
                    self._conn.release()
                self._conn = Connection.acquire(address, rundir=rundir, credentials=credentials)
            return self._conn

    def request(
        self, kind: str, body: dict[str, Any], *, on_reply: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any]:
        return self.connection.request(kind, body, timeout=self.request_timeout, on_reply=on_reply)

    def submit(self, description: dict[str, Any], on_id: Callable[[str], StatusSink]) -> float | None:
        """Submit one job. ``on_id`` gets its native id on the connection's reader, before any status of
        the job can arrive, and returns the sink its statuses go to. Returns the time the pilot queued
        it. It waits for a live daemon; one given up raises a transient SubmitException that says whether
        it was sent, and if so that it was withdrawn (the pilot does not run it). Concurrent calls from
        several threads share frames (see ``Connection.submit``)."""
        conn = self.connection  # a lone job: submit_many's batching, without its machinery
        hook = functools.partial(_subscribe, conn, lambda _, native_id: on_id(native_id), 0)
        ticket = conn.submit([description], on_reply=hook, submit_ids=self.submit_ids.take(1))
        body = conn.wait(ticket, timeout=self.request_timeout)
        (outcome,) = _outcomes(body, 1)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def submit_document(self, entry: dict[str, Any], on_id: Callable[[int, str], StatusSink]) -> dict[str, Any]:
        """Submit one document (``{"sss": text}``, or another language's key): all its jobs are accepted or
        none, under one submit id, so it is made once however its answer is lost (sent again to a restarted
        daemon, or withdrawn when given up, as :meth:`submit`). ``on_id(k, native_id)`` is called for its
        k-th job before any status of it is read. Returns the pilot's result (``ids``, ``warnings``)."""
        conn = self.connection
        hook = functools.partial(_subscribe, conn, on_id, 0)
        ticket = conn.submit([entry], on_reply=hook, submit_ids=self.submit_ids.take(1))
        result = _first(conn.wait(ticket, timeout=self.request_timeout))
        if "error" in result:
            raise (SubmitException if result.get("transient") else InvalidJobException)(str(result["error"]))
        if not isinstance(result.get("ids"), list):
            raise SubmitException(f"malformed result from the pilot: {str(result)[:200]}")
        return result

    def submit_many(
        self,
        descriptions: Iterable[dict[str, Any]],
        on_id: Callable[[int, str], StatusSink],
        on_outcome: Callable[[int, Outcome], None],
    ) -> None:
        """Submit jobs in requests of at most ``SUBMIT_CHUNK`` (the first ``SUBMIT_FIRST``, each next one
        twice the last), each queued as soon as it is full (pipelined: the pilot works on one while the
        next is built). For the k-th description,
        ``on_id(k, native_id)`` is called as for :meth:`submit`, then ``on_outcome(k, outcome)`` on this
        thread with the time the pilot queued it or the exception ``submit`` would have raised for it
        alone. A request waits for a live daemon, and ``request_timeout`` from the later of its queuing,
        the previous answer and the last sight of the daemon: a live pilot working through a large
        batch, or stopped, is not cut off, and a gone one is reported within the timeout."""
        conn = self.connection
        # Each request in flight: the positions of its jobs in the batch, their descriptions and submit
        # ids, the request, and when it was queued.
        queued: deque[
            tuple[
                range | builtins.list[int],
                builtins.list[dict[str, Any]],
                builtins.list[str],
                Ticket | SubmitException,
                float,
            ]
        ] = deque()
        last_answer = 0.0

        def settle() -> None:
            nonlocal last_answer
            ks, chunk, submit_ids, ticket, when = queued.popleft()
            try:
                if isinstance(ticket, SubmitException):
                    raise ticket
                body = conn.wait(ticket, timeout=self.request_timeout, since=max(when, last_answer))
            except SubmitException as exc:
                for k in ks:
                    on_outcome(k, type(exc)(exc.message, transient=exc.transient))
                return
            last_answer = time.monotonic()
            again: builtins.list[int] = []  # jobs the pilot had no room for (pilot.max_queued): nothing was done
            for i, (k, outcome) in enumerate(zip(ks, _outcomes(body, len(ks)), strict=True)):
                if isinstance(outcome, SubmitException) and _retry(body, i):
                    again.append(i)
                else:
                    on_outcome(k, outcome)
            if again:  # sent again under the same submit ids; the pilot holds the request until it has room
                if len(again) == len(ks):  # none taken: a pilot refusing at once is not asked again at once
                    time.sleep(max(0.0, when + RETRY_DELAY - time.monotonic()))
                send([ks[i] for i in again], [chunk[i] for i in again], [submit_ids[i] for i in again])

        def send(
            ks: range | builtins.list[int], chunk: builtins.list[dict[str, Any]], submit_ids: builtins.list[str]
        ) -> None:
            hook = functools.partial(_subscribe, conn, lambda i, native_id: on_id(ks[i], native_id), 0)
            try:
                request: Ticket | SubmitException = conn.submit(chunk, on_reply=hook, submit_ids=submit_ids)
            except SubmitException as exc:
                request = exc
            queued.append((ks, chunk, submit_ids, request, time.monotonic()))

        chunk: builtins.list[dict[str, Any]] = []
        sent = 0
        size = min(SUBMIT_FIRST, SUBMIT_CHUNK)
        for description in descriptions:
            chunk.append(description)
            if len(chunk) == size:
                send(range(sent, sent + len(chunk)), chunk, self.submit_ids.take(len(chunk)))
                sent += len(chunk)
                chunk = []
                size = min(2 * size, SUBMIT_CHUNK)
                while queued and (
                    len(queued) >= SUBMIT_WINDOW
                    or isinstance(queued[0][3], SubmitException)
                    or conn.answered(queued[0][3])
                ):
                    settle()  # outcomes in (or too many requests out): hand them over, the pilot works on
        if chunk:
            send(range(sent, sent + len(chunk)), chunk, self.submit_ids.take(len(chunk)))
        while queued:
            settle()

    def cancel(self, native_id: str) -> None:
        result = _first(self.request(wire.Kind.CANCEL, {"ids": [native_id]}))
        if "error" in result:
            raise SubmitException(str(result["error"]))

    def list(self) -> builtins.list[str]:
        body = self.request(wire.Kind.LIST, {"ranges": True})
        if "error" in body:
            raise SubmitException(f"cannot list the pilot's jobs: {body['error']}")
        try:
            if "ranges" in body:
                return job_ids.from_wire(body["ranges"])
            ids = body.get("ids")  # (a pilot from before ranges)
            if not isinstance(ids, builtins.list):
                raise ValueError(f"'ids' must be a list, not {type(ids).__name__}")
            return [str(i) for i in ids]
        except ValueError as exc:
            raise SubmitException(f"malformed job list from the pilot: {exc}") from None

    def status(self) -> dict[str, Any]:
        return self.request(wire.Kind.STATUS, {})

    def attach(self, native_id: str, sink: StatusSink) -> StatusReport:
        """Follow an existing job; returns its current status."""
        conn = self.connection

        def on_reply(body: dict[str, Any]) -> None:
            results = body.get("results")
            if isinstance(results, list) and results and isinstance(results[0], dict) and "status" in results[0]:
                status = report(results[0]["status"])
                if status is None or status.state in _FINAL:
                    return  # no event will follow: a sink would never be removed
                conn.subscribe(native_id, sink)

        deadline = time.monotonic() + self.request_timeout
        while True:
            result = _first(
                conn.request(wire.Kind.ATTACH, {"ids": [native_id]}, timeout=self.request_timeout, on_reply=on_reply)
            )
            # An id leased to a client whose submit has not reached the pilot yet: it comes within moments.
            if not (result.get("pending") and time.monotonic() < deadline):
                break
            time.sleep(ATTACH_RETRY)
        if "error" in result:
            raise InvalidJobException(str(result["error"]))
        status = report(result["status"])
        if status is None:
            raise SubmitException(f"malformed status from the pilot: {result['status']!r}")
        return status

    def close(self) -> None:
        """Done: the last user of an embedded pilot stops it, the last user of a connection closes it.
        Pipelined submits still unanswered get their answers first (at most ``request_timeout``)."""
        if self.pipeline is not None and not self._closed and not self.pipeline.flush(self.request_timeout):
            log.warning("closing with submitted jobs unanswered", jobs=self.pipeline.in_flight)
            self.pipeline.close()
        if self.pipeline is not None and not self._closed and self._conn is not None and not self._conn.closed:
            self.pipeline.give_back(self._conn, min(1.0, self.request_timeout))
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conn, self._conn = self._conn, None
            if self._embedded:
                _embedded.release()
        if conn is not None:
            conn.release()


def _subscribe(conn: Connection, on_id: Callable[[int, str], StatusSink], start: int, body: dict[str, Any]) -> None:
    """A submit's reply hook (the connection's reader): follow each accepted job before any of its
    statuses is read (a document's result names several). A job its submit id had made before (the
    submit sent again to a restarted daemon) comes with its status, delivered as an event (and not
    followed if final: no event would end it)."""
    results = body.get("results")
    if not isinstance(results, list):
        return
    follow: builtins.list[tuple[str, StatusSink]] = []
    known: builtins.list[tuple[StatusReport, StatusSink]] = []
    for i, result in enumerate(results):
        if not isinstance(result, dict):
            continue
        if "id" in result:
            _follow(follow, known, on_id(start + i, str(result["id"])), str(result["id"]), result.get("status"))
        ids, statuses = result.get("ids"), result.get("statuses")
        if isinstance(ids, list):
            if not isinstance(statuses, list) or len(statuses) != len(ids):
                statuses = [None] * len(ids)
            for k, (native_id, raw) in enumerate(zip(ids, statuses, strict=True)):
                _follow(follow, known, on_id(k, str(native_id)), str(native_id), raw)
    conn.subscribe_many(follow)  # one lock for the whole reply, not one per job
    for status, sink in known:
        conn.emit(status, sink)


def _follow(
    follow: builtins.list[tuple[str, StatusSink]],
    known: builtins.list[tuple[StatusReport, StatusSink]],
    sink: StatusSink,
    native_id: str,
    raw: Any,
) -> None:
    """Note a job to follow (unless its known status is final) and its known status to deliver."""
    status = report(raw) if raw is not None else None
    if status is None or status.state not in _FINAL:
        follow.append((native_id, sink))
    if status is not None:
        known.append((status, sink))


def _outcomes(body: dict[str, Any], count: int) -> builtins.list[Outcome]:
    """The outcome of each of the ``count`` jobs of a SUBMIT from its reply; a malformed reply or a
    refused request is every job's error."""
    results = body.get("results")
    if isinstance(results, list) and len(results) == count:
        return [_outcome(result) for result in results]
    error = body.get("error") if "results" not in body else None
    message = str(error) if error else f"malformed reply from the pilot: {str(body)[:200]}"
    return [SubmitException(message) for _ in range(count)]


def _retry(body: dict[str, Any], i: int) -> bool:
    """Whether the pilot answered the i-th job of a request 'no room, nothing done: send it again'."""
    results = body.get("results")
    result = results[i] if isinstance(results, list) and i < len(results) else None
    return isinstance(result, dict) and result.get("retry") is True


def _outcome(result: Any) -> Outcome:
    if not isinstance(result, dict):
        return SubmitException(f"malformed result from the pilot: {str(result)[:200]}")
    if "error" in result:
        if result.get("transient"):
            return SubmitException(str(result["error"]), transient=True)
        return InvalidJobException(str(result["error"]))
    if "id" not in result:
        return SubmitException(f"malformed result from the pilot: {str(result)[:200]}")
    t = result.get("time")
    return float(t) if isinstance(t, int | float) else None


def _first(body: dict[str, Any]) -> dict[str, Any]:
    if "error" in body and "results" not in body:
        raise SubmitException(str(body["error"]))
    results = body.get("results")
    if not isinstance(results, list) or not results or not isinstance(results[0], dict):
        raise SubmitException(f"malformed reply from the pilot: {body!r}")
    return results[0]


def _locate(url: str | None) -> tuple[str, bool, RunDir | None, Credentials | None]:
    """The pilot's address, whether it is this process's embedded one, its run directory if known, and the
    CURVE credentials for it. A remote pilot is named by its access file (``pilot credentials --client``):
    the url itself, or ``PILOT_CREDENTIALS`` when the url is none or a ``tcp://`` address."""
    named = os.environ.get(ENV_CLIENT_ACCESS)
    path: Path | None = None
    if url and not url.startswith(("ipc://", "tcp://")) and Path(url).expanduser().is_file():
        path = Path(url).expanduser()
    elif named and (not url or url.startswith("tcp://")):
        path = Path(named).expanduser()
    if path is None:
        address, embedded, rundir = _embedded.resolve(url)
        return address, embedded, rundir, None
    try:
        access = read_client_access(path)
    except SecurityError as exc:
        raise SubmitException(f"cannot use the pilot's access file: {exc}", transient=False) from None
    return (url if url and url.startswith("tcp://") else access.endpoint), False, None, access.credentials

"""The executor operations on the wire, shared by our JobExecutor and the psij-python plugin.

Connecting is lazy: creating an executor costs nothing until its first request (psij-python builds
one of every registered executor at test collection). Every request waits at most ``request_timeout``
seconds for its answer; a daemon that is gone is reported sooner (see ``client/_connection.py``), and
the connection follows a daemon restarted on the same run directory by itself.
"""

from __future__ import annotations

import builtins
import math
import threading
from collections.abc import Callable
from typing import Any

from client import _embedded
from client._connection import DEFAULT_REQUEST_TIMEOUT, Connection, StatusSink
from client.exceptions import InvalidJobException, SubmitException
from pilot import wire

_FINAL = ("COMPLETED", "FAILED", "CANCELED")


def check_timeout(request_timeout: float) -> float:
    if isinstance(request_timeout, bool) or not isinstance(request_timeout, int | float):
        raise TypeError(f"request_timeout must be a number of seconds, not {type(request_timeout).__name__}")
    if not (request_timeout > 0 and math.isfinite(request_timeout)):
        raise ValueError(f"request_timeout must be a positive number of seconds, not {request_timeout!r}")
    return float(request_timeout)


class Backend:
    def __init__(self, url: str | None, *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> None:
        self._url = url
        self.request_timeout = check_timeout(request_timeout)
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._embedded = False
        self._closed = False

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
                address, embedded, rundir = _embedded.resolve(self._url)
                if embedded and self._embedded:
                    _embedded.release()
                self._embedded = embedded
                if self._conn is not None:
                    self._conn.release()
                self._conn = Connection.acquire(address, rundir=rundir)
            return self._conn

    def request(
        self, kind: str, body: dict[str, Any], *, on_reply: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any]:
        return self.connection.request(kind, body, timeout=self.request_timeout, on_reply=on_reply)

    def submit(self, description: dict[str, Any], on_id: Callable[[str], StatusSink]) -> float | None:
        """Submit one job. ``on_id`` gets its native id on the I/O thread, before any status of the job
        can arrive, and returns the sink its statuses go to. Returns the time the pilot queued it.
        A submit that got no answer raises a transient SubmitException and is never sent again."""
        conn = self.connection

        def on_reply(body: dict[str, Any]) -> None:
            results = body.get("results")
            if isinstance(results, list) and results and isinstance(results[0], dict) and "id" in results[0]:
                native_id = str(results[0]["id"])
                conn.subscribe(native_id, on_id(native_id))

        result = _first(
            conn.request(wire.Kind.SUBMIT, {"jobs": [description]}, timeout=self.request_timeout, on_reply=on_reply)
        )
        if "error" in result:
            if result.get("transient"):
                raise SubmitException(str(result["error"]), transient=True)
            raise InvalidJobException(str(result["error"]))
        t = result.get("time")
        return float(t) if isinstance(t, int | float) else None

    def cancel(self, native_id: str) -> None:
        result = _first(self.request(wire.Kind.CANCEL, {"ids": [native_id]}))
        if "error" in result:
            raise SubmitException(str(result["error"]))

    def list(self) -> builtins.list[str]:
        body = self.request(wire.Kind.LIST, {})
        return [str(i) for i in body.get("ids", [])]

    def status(self) -> dict[str, Any]:
        return self.request(wire.Kind.STATUS, {})

    def attach(self, native_id: str, sink: StatusSink) -> builtins.list[Any]:
        """Follow an existing job; returns its current status (wire form)."""
        conn = self.connection

        def on_reply(body: dict[str, Any]) -> None:
            results = body.get("results")
            if isinstance(results, list) and results and isinstance(results[0], dict) and "status" in results[0]:
                status = results[0]["status"]
                if isinstance(status, list) and len(status) > 1 and status[1] in _FINAL:
                    return  # no event will follow: a sink would never be removed
                conn.subscribe(native_id, sink)

        result = _first(
            conn.request(wire.Kind.ATTACH, {"ids": [native_id]}, timeout=self.request_timeout, on_reply=on_reply)
        )
        if "error" in result:
            raise InvalidJobException(str(result["error"]))
        status = result["status"]
        if not isinstance(status, list) or len(status) != 6:
            raise SubmitException(f"malformed status from the pilot: {status!r}")
        return status

    def close(self) -> None:
        """Done: the last user of an embedded pilot stops it, the last user of a connection closes it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conn, self._conn = self._conn, None
            if self._embedded:
                _embedded.release()
        if conn is not None:
            conn.release()


def _first(body: dict[str, Any]) -> dict[str, Any]:
    if "error" in body and "results" not in body:
        raise SubmitException(str(body["error"]))
    results = body.get("results")
    if not isinstance(results, list) or not results or not isinstance(results[0], dict):
        raise SubmitException(f"malformed reply from the pilot: {body!r}")
    return results[0]

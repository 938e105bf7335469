"""The executor operations on the wire, shared by our JobExecutor and the psij-python plugin.

Connecting is lazy: creating an executor costs nothing until its first request (psij-python builds
one of every registered executor at test collection).
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable
from typing import Any

from client import _embedded
from client._connection import Connection, StatusSink
from client.exceptions import InvalidJobException, SubmitException
from pilot import wire

_FINAL = ("COMPLETED", "FAILED", "CANCELED")


class Backend:
    def __init__(self, url: str | None) -> None:
        self._url = url
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._embedded = False
        self._closed = False

    @property
    def connection(self) -> Connection:
        if self._closed:
            raise SubmitException("this executor is closed; create a new one", transient=False)
        conn = self._conn
        if conn is not None and not conn._closed:
            return conn
        with self._lock:
            if self._conn is None or self._conn._closed:
                address, embedded = _embedded.resolve(self._url)
                if embedded and self._embedded:
                    _embedded.release()
                self._embedded = embedded
                self._conn = Connection.get(address)
            return self._conn

    def submit(self, description: dict[str, Any], on_id: Callable[[str], None]) -> float | None:
        """Submit one job; ``on_id`` runs on the I/O thread before any status of the job can arrive.
        Returns the time the pilot queued it."""
        conn = self.connection

        def on_reply(body: dict[str, Any]) -> None:
            results = body.get("results")
            if isinstance(results, list) and results and isinstance(results[0], dict) and "id" in results[0]:
                on_id(str(results[0]["id"]))

        result = _first(conn.request(wire.Kind.SUBMIT, {"jobs": [description]}, on_reply=on_reply))
        if "error" in result:
            if result.get("transient"):
                raise SubmitException(str(result["error"]), transient=True)
            raise InvalidJobException(str(result["error"]))
        t = result.get("time")
        return float(t) if isinstance(t, int | float) else None

    def cancel(self, native_id: str) -> None:
        result = _first(self.connection.request(wire.Kind.CANCEL, {"ids": [native_id]}))
        if "error" in result:
            raise SubmitException(str(result["error"]))

    def list(self) -> builtins.list[str]:
        body = self.connection.request(wire.Kind.LIST, {})
        return [str(i) for i in body.get("ids", [])]

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

        result = _first(conn.request(wire.Kind.ATTACH, {"ids": [native_id]}, on_reply=on_reply))
        if "error" in result:
            raise InvalidJobException(str(result["error"]))
        status = result["status"]
        if not isinstance(status, list) or len(status) != 6:
            raise SubmitException(f"malformed status from the pilot: {status!r}")
        return status

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._embedded:
                _embedded.release()


def _first(body: dict[str, Any]) -> dict[str, Any]:
    if "error" in body and "results" not in body:
        raise SubmitException(str(body["error"]))
    results = body.get("results")
    if not isinstance(results, list) or not results or not isinstance(results[0], dict):
        raise SubmitException(f"malformed reply from the pilot: {body!r}")
    return results[0]

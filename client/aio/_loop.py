"""Hand items from the client's threads to one event loop without ever blocking those threads.

The sync client's statuses arrive on its reader thread (and QUEUED on the thread that submitted). That
thread must never wait for the event loop: a busy loop would then stall the socket, and with it every
job. So a thread only appends to a list and, if no drain is scheduled yet, schedules one with the
loop's own thread-safe call (asyncio's ``call_soon_threadsafe``, trio's ``run_sync_soon``): one wake-up
per burst of statuses, not one per status, and items reach the loop in the order they were put.
anyio has no non-blocking call into a loop from a foreign thread (``anyio.from_thread`` waits for the
result), hence the two lines per backend here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import structlog

log = structlog.get_logger("client")

T = TypeVar("T")


def _call_soon() -> Callable[[Callable[[], object]], object]:
    """The running loop's thread-safe, non-blocking "run this soon" (called on the loop)."""
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        pass
    try:
        import trio
    except ImportError:
        trio = None  # type: ignore[assignment]
    if trio is not None:
        try:
            return trio.lowlevel.current_trio_token().run_sync_soon
        except RuntimeError:
            pass
    raise RuntimeError("the async client runs in an asyncio or trio event loop (anyio's backends); none is running")


class LoopCall(Generic[T]):
    """Items put from any thread, handed to ``handle`` on the loop in batches, in order."""

    def __init__(self, handle: Callable[[list[T]], None]) -> None:
        self._handle = handle
        self._call_soon = _call_soon()  # on the loop: the constructor runs there
        self._lock = threading.Lock()
        self._items: list[T] = []
        self._scheduled = False
        self._closed = False

    def put(self, item: T) -> None:
        """Any thread: queue ``item``; the loop handles it soon. Never blocks on the loop."""
        with self._lock:
            if self._closed:
                return
            self._items.append(item)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._call_soon(self.drain)
        except Exception:  # the loop has ended (asyncio: closed; trio: RunFinishedError): nobody to tell
            log.debug("async client: event loop gone, status dropped")

    def drain(self) -> None:
        """On the loop: handle everything queued so far (also called directly, to catch up at once)."""
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        if not items:
            return
        try:
            self._handle(items)
        except Exception:  # a loop callback must not raise (trio would end the run with TrioInternalError)
            log.exception("async client: delivering statuses failed")

    def close(self) -> None:
        """On the loop: handle what is left; later puts are dropped."""
        self.drain()
        with self._lock:
            self._closed = True
            self._items = []

"""Job ids an executor gives its jobs itself, leased from the pilot in blocks.

PSI/J's ``submit()`` returns with the job's native id set. Asking the pilot for it would cost a round
trip per job; instead the executor leases a block of ids (LEASE, journaled by the pilot before it
answers: ``pilot/core/leases.py``) and hands the next one to each job it sends, as the job's native id
and its submit id both. The next block is asked for while half of the current one is left, so a stream
of submits does not wait for it; blocks double from ``FIRST`` up to ``MOST`` as they are used up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Final

from client._connection import Connection
from client.exceptions import SubmitException
from pilot import wire

#: The first block's size, and the largest block asked for.
FIRST: Final = 256
MOST: Final = 8192
#: Seconds between asking again for a block whose request was lost with its connection.
RETRY_PAUSE: Final = 0.1


class LeasedIds:
    """The job ids of one executor: ``take()`` from any thread."""

    def __init__(self, connection: Callable[[], Connection], *, request_timeout: float) -> None:
        self._connection = connection
        self._timeout = request_timeout
        #: Held as a plain lock (C-level ``with``, cheaper than the Condition's own per take or submit);
        #: ``_cond`` is the condition on it that waiters wait on.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._next = 0  # the next id of the current block; _last: its last (empty when _next > _last)
        self._last = -1
        self._ahead: tuple[int, int] | None = None  # the block asked for ahead, once granted
        self._block = 0  # the current block's length: the next is asked for once half of it is used
        self._size = FIRST  # the length of the next block asked for
        self._asking = False
        self._failure: str | None = None  # why the last request for a block was given up
        self._sent_lost = False  # ... and whether it had been sent (the daemon died before it answered)

    def take(self) -> str:
        """The next job id. Waits for a block only when none is left (the first submit, or a stream
        faster than the pilot answers), as long as a submit would wait (a live pilot, however slow; one
        whose connection was lost while it was asked, for the next daemon within the request timeout);
        raises a transient SubmitException when none comes (the job was not sent)."""
        start = time.monotonic()
        lost = False  # a request for a block was lost with its connection: the next daemon is waited for
        with self._lock:
            while True:
                if self._next > self._last and self._ahead is not None:
                    (self._next, self._last), self._ahead = self._ahead, None
                    self._block = self._last - self._next + 1
                if self._next <= self._last:
                    job_id = self._next
                    self._next += 1
                    left = self._last - self._next + 1
                    if self._ahead is None and not self._asking and left * 2 < self._block:
                        self._ask()
                    return str(job_id)
                if self._failure is not None:
                    failure, self._failure = self._failure, None
                    lost = lost or self._sent_lost
                    if not lost or time.monotonic() - start >= self._timeout:
                        raise SubmitException(
                            f"the pilot gave no job ids: {failure}; the job was not sent: submit it again later",
                            transient=True,
                        )
                    self._cond.wait(RETRY_PAUSE)  # asked again, of the next daemon
                    continue
                if not self._asking:
                    try:
                        self._ask()
                    except SubmitException:
                        if not lost:
                            raise  # no pilot to ask: said at once, as a submit says it
                        continue  # the next daemon may not be up yet: asked again within the timeout
                self._cond.wait()

    def prefetch(self) -> None:
        """Ask for the first block now, so that the first submit need not wait for it."""
        with self._lock:
            if self._next > self._last and self._ahead is None and not self._asking:
                self._ask()

    def unused(self) -> list[list[int]]:
        """The ids leased and never handed out ([first, last] ranges), which the pilot may take back:
        this executor closes. After this call none is handed out."""
        with self._lock:
            ranges = [[self._next, self._last]] if self._next <= self._last else []
            if self._ahead is not None:
                ranges.append(list(self._ahead))
            self._next, self._last, self._ahead = 0, -1, None
            return ranges

    def drop(self) -> None:
        """The pilot does not know the ids of these blocks (it was started afresh and gave them to others):
        the next job gets an id of a new block."""
        with self._lock:
            self._next, self._last, self._ahead = 0, -1, None
            self._size = FIRST

    def _ask(self) -> None:
        """Ask for the next block (``_lock`` held)."""
        self._asking = True
        count = self._size
        self._size = min(MOST, self._size * 2)
        try:
            self._connection().ask(
                wire.Kind.LEASE,
                {"count": count},
                on_reply=self._granted,
                on_lost=self._lost,
                timeout=self._timeout,
            )
        except SubmitException:
            self._asking = False
            raise

    def _granted(self, body: dict[str, Any]) -> None:
        first, last = body.get("first"), body.get("last")
        with self._lock:
            self._asking = False
            if type(first) is int and type(last) is int and 0 < first <= last:
                self._ahead = (first, last)
            else:
                self._failure = str(body.get("error") or f"malformed lease from the pilot: {str(body)[:200]}")
            self._cond.notify_all()

    def _lost(self, message: str, sent: bool) -> None:
        with self._lock:
            self._asking = False
            self._failure = message
            self._sent_lost = sent
            self._cond.notify_all()

"""Backpressure: SUBMIT frames held while the pilot has ``max_queued`` unfinished jobs (a frame served
with less room than it has jobs is taken in part: admission answers the rest ``no_room``).

The client's submit() waits for the reply, so it slows down to the pace jobs end; held bytes are
bounded. A frame held longer than ``PARK_SECONDS`` is answered with a transient refusal before the
client's own timeout, so it is never accepted after the client has given up on it (which would make a
duplicate when the client submits it again).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pilot import wire
from pilot.core.admission import no_room

PARK_SECONDS = 5.0  # well within a client's request timeout
PARK_BYTES = 256 << 20  # held submit frames, in total
_SUBMIT_HEAD = wire.encode(wire.Kind.SUBMIT, {})[:-1]  # msgpack of [version, "submit", ...] up to the body


def is_submit(payload: bytes) -> bool:
    """Whether a client frame is a SUBMIT, without decoding it."""
    return payload.startswith(_SUBMIT_HEAD)


class Parking:
    def __init__(
        self,
        *,
        limit: int,
        unfinished: Callable[[], int],
        serve: Callable[[bytes, bytes], None],
        reply: Callable[[bytes, dict[str, Any]], None],
    ) -> None:
        self.limit = limit
        self._unfinished = unfinished
        self._serve = serve
        self._reply = reply
        #: Held frames, in the order they came: (since when (monotonic), ident, payload).
        self._held: deque[tuple[float, bytes, bytes]] = deque()
        self._bytes = 0

    def __bool__(self) -> bool:
        return bool(self._held)

    def full(self) -> bool:
        """A new SUBMIT must be held: the pilot is at its limit, or others are held before it."""
        return bool(self._held) or self._unfinished() >= self.limit

    def hold(self, ident: bytes, payload: bytes) -> None:
        if self._bytes + len(payload) > PARK_BYTES:
            self._refuse(ident, payload)
            return
        self._held.append((time.monotonic(), ident, payload))
        self._bytes += len(payload)

    def release(self) -> None:
        """Serve held submits as room frees up, in order; refuse those held too long."""
        now = time.monotonic()
        while self._held:
            t, ident, payload = self._held[0]
            if self._unfinished() < self.limit:
                self._pop()
                self._serve(ident, payload)
            elif now - t > PARK_SECONDS:
                self._pop()
                self._refuse(ident, payload)
            else:
                break

    def _pop(self) -> None:
        _, _, payload = self._held.popleft()
        self._bytes -= len(payload)

    def _refuse(self, ident: bytes, payload: bytes) -> None:
        try:
            body = wire.decode(payload, allowed=wire.CLIENT_KINDS).body
            rid = wire.field(body, "rid", int)
            count = len(wire.field(body, "jobs", list))
        except wire.ProtocolError:
            return  # garbage that only looked like a submit: dropped, as an unparsable frame is
        self._reply(ident, {"rid": rid, "results": [no_room(self.limit)] * count})

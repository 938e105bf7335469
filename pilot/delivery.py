"""Sending to peers through a ROUTER that never blocks, and what is held for clients that do not read.

Replies go in order per client. One that meets a client's high-water mark (a client with more requests
in flight than its socket queues) waits for the next flush, and so do the replies and statuses behind
it: a dropped SUBMIT reply would leave the client unsure whether jobs the journal holds were accepted,
and the statuses of jobs it never heard of unread. Statuses held for a slow client are coalesced (the
newest per job). A client gone or not reading for ``HOLD_SECONDS``: what was held for it is dropped.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import structlog
import zmq

from pilot import wire
from pilot.wire.transport import send_parts

log = structlog.get_logger("pilot.daemon")

HOLD_SECONDS = 300.0


def send(sock: zmq.Socket[bytes], frames: list[bytes]) -> bool | None:
    """ROUTER sends never block. True: sent; False: the peer is past its high-water mark (not reading);
    None: no such peer (gone). The caller decides what a message that was not sent means."""
    try:
        send_parts(sock, frames)
        return True
    except zmq.Again:
        log.warning("peer not reading; message held or dropped", size=sum(len(f) for f in frames))
        return False
    except zmq.ZMQError as exc:
        if exc.errno == zmq.EHOSTUNREACH:
            return None
        raise


def send_waiting(
    sock: zmq.Socket[bytes],
    ident: bytes,
    waiting: deque[tuple[float, bytes]],
    *,
    now: float,
    hold: float,
    gone_waits: bool,
    dropped: str,
) -> None:
    """Send the frames that wait for peer ``ident`` (each with when it was first held), in order, until
    the peer refuses one; those waiting past ``hold`` seconds are dropped, logged as ``dropped``.
    ``gone_waits``: a peer the ROUTER does not know may still be connecting (an agent's node), so what
    it refuses waits too; else a peer gone takes its frames with it (a client)."""
    while waiting:
        since, frame = waiting[0]
        if now - since > hold:
            log.warning(dropped, peer=ident.decode(errors="replace"), frames=len(waiting))
            waiting.clear()
            return
        sent = send(sock, [ident, frame])
        if sent is False or (sent is None and gone_waits):
            return
        waiting.popleft()


class ClientDelivery:
    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        self.sock = sock
        #: Replies a client's socket had no room for, in order, each with when it was first held.
        self._replies: dict[bytes, deque[tuple[float, bytes]]] = {}
        #: Statuses a slow client could not take yet: ident -> (held since, job id -> newest status).
        self._statuses: dict[bytes, tuple[float, dict[str, Any]]] = {}

    def flush(self, replies: list[tuple[bytes, dict[str, Any]]], statuses: dict[bytes, dict[str, list[Any]]]) -> None:
        if replies or self._replies:
            self._send_replies(replies)
        waiting_since = self._merge_waiting(statuses) if self._statuses else {}
        for ident, evs in statuses.items():
            if ident in self._replies:
                sent: bool | None = False  # behind its replies: a job's statuses never overtake its SUBMIT reply
            else:
                sent = send(self.sock, [ident, wire.encode(wire.Kind.EVENTS, {"events": list(evs.values())})])
            if sent is False:
                # The client is not reading fast enough: keep its statuses, one per job (the newest), and
                # send them with the next flush -- coalesced, never lost, never more than one per job.
                self._statuses[ident] = (waiting_since.get(ident, time.monotonic()), evs)

    def _send_replies(self, replies: list[tuple[bytes, dict[str, Any]]]) -> None:
        held = self._replies
        now = time.monotonic()
        for ident in list(held):
            waiting = held[ident]
            send_waiting(
                self.sock,
                ident,
                waiting,
                now=now,
                hold=HOLD_SECONDS,
                gone_waits=False,
                dropped="client not reading its replies; dropped them",
            )
            if not waiting:
                del held[ident]
        for ident, body in replies:
            frame = wire.encode(wire.Kind.REPLY, body)
            behind = held.get(ident)
            if behind is not None:
                behind.append((now, frame))
            elif send(self.sock, [ident, frame]) is False:
                held[ident] = deque([(now, frame)])

    def _merge_waiting(self, statuses: dict[bytes, dict[str, Any]]) -> dict[bytes, float]:
        """Put the statuses held for slow clients back in front of this flush's (a newer status of the
        same job wins); returns since when each client's were held. Held too long: dropped."""
        held, self._statuses = self._statuses, {}
        now = time.monotonic()
        since: dict[bytes, float] = {}
        for ident, (t, evs) in held.items():
            if now - t > HOLD_SECONDS:
                log.warning("client not reading its job statuses; dropped them", jobs=len(evs), seconds=HOLD_SECONDS)
                continue
            statuses[ident] = evs | statuses.get(ident, {})
            since[ident] = t
        return since

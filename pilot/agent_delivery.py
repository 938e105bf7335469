"""Frames to agents through the daemon's ROUTER, held for a node whose socket cannot take them yet.

A node's socket may not be connected when the daemon first writes to it: the virtual nodes one agent
process hosts register in a batch sent on one of their sockets (agent.hosting), and each is answered
on its own, which may still be connecting. A ROUTER drops a frame to a peer it does not know (here it
says so: ROUTER_MANDATORY); a dropped REGISTERED leaves its node out of its process's heartbeats until
it registers again, seconds later, and the daemon declares it lost meanwhile; a dropped LAUNCH leaves
its orders unrun. So such frames wait, in order, and go at the next flushes -- to the agent they were
written for only: once the daemon has declared that node's agent gone, or another registers under its
name, they are dropped (orders meant for an agent declared lost must never reach the next one).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Final

import structlog
import zmq

from pilot.delivery import send, send_waiting

log = structlog.get_logger("pilot.daemon")

#: The longest a frame waits for its node's socket; the node is declared lost well before.
HOLD_SECONDS: Final = 60.0


class AgentDelivery:
    """``current(node)``: the daemon's record of the agent now registered under that name, if it is
    active (a frame held for it goes only while the same one is)."""

    def __init__(self, sock: zmq.Socket[bytes], *, current: Callable[[str], object | None]) -> None:
        self.sock = sock
        self._current = current
        #: node -> (the agent record the frames were written for, [(when first held, frame)]), in order.
        self._held: dict[str, tuple[object, deque[tuple[float, bytes]]]] = {}

    @property
    def holding(self) -> int:
        """How many frames wait for their nodes' sockets."""
        return sum(len(frames) for _, frames in self._held.values())

    def send(self, node: str, frame: bytes) -> None:
        """``frame`` to ``node`` now, or behind what waits for it."""
        held = self._held.get(node)
        if held is not None:
            held[1].append((time.monotonic(), frame))
        elif not send(self.sock, [node.encode(), frame]):
            agent = self._current(node)
            if agent is not None:
                self._held[node] = (agent, deque([(time.monotonic(), frame)]))

    def retry(self) -> None:
        """What waits, in order per node, until a node's socket refuses again; dropped for a node whose
        agent is no longer the one it was written for, or after ``HOLD_SECONDS``."""
        if not self._held:
            return
        now = time.monotonic()
        for node in list(self._held):
            agent, waiting = self._held[node]
            if self._current(node) is not agent:
                log.info("frames for an agent no longer active dropped", node=node, frames=len(waiting))
                del self._held[node]
                continue
            send_waiting(
                self.sock,
                node.encode(),
                waiting,
                now=now,
                hold=HOLD_SECONDS,
                gone_waits=True,
                dropped="frames for a node that never took them dropped",
            )
            if not waiting:
                del self._held[node]

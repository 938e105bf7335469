"""The virtual nodes one agent process hosts (null launches, ``nodes_per_agent``): one HEARTBEAT per
process, REGISTERs in batches.

Each hosted node stays an agent of its own to the daemon (its socket, identity, orders, kills and
events); only what would cost the daemon a message per node per second is combined. A HEARTBEAT leaves
on one hosted node's socket and names the other registered ones (the same machine's load holds for
each); the daemon's reply acknowledges each one's events, or names the ones it does not know (they
register again). REGISTERs gathered within a moment go as one, each answered on its own node's socket.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING

import anyio
import structlog

from pilot.wire.messages import Body, Heartbeat, HeartbeatReply, Register

if TYPE_CHECKING:
    from agent.agent import Agent

log = structlog.get_logger("agent")

#: Most REGISTERs in one frame (a node of 128 cores is about 1 KB).
REGISTER_BATCH = 500
#: How long the first REGISTER waits for others to go with it.
_GATHER = 0.05
#: The heartbeat interval until the daemon says its own.
_FIRST_INTERVAL = 0.5


class Host:
    def __init__(self) -> None:
        self.agents: dict[str, Agent] = {}
        self._registering: dict[str, Register] = {}
        self._wake: anyio.Event | None = None  # made in run(): an event belongs to its loop
        self._next_beat = 0.0
        #: Agents whose socket could not take what the host sent yet (not connected yet, or full): it
        #: is tried again every moment, not left for their own next turn, seconds away.
        self._unsent: set[Agent] = set()

    def add(self, agent: Agent) -> None:
        self.agents[agent.node.name] = agent

    def remove(self, agent: Agent) -> None:
        self.agents.pop(agent.node.name, None)
        self._unsent.discard(agent)
        self._registering.pop(agent.node.name, None)

    def register(self, agent: Agent, msg: Register) -> None:
        """``agent``'s REGISTER goes with the next batch (a newer one replaces one not sent yet)."""
        self._registering[agent.node.name] = msg
        if self._wake is not None:
            self._wake.set()

    def heard(self, reply: HeartbeatReply) -> None:
        """The daemon's reply to a combined heartbeat: each node's acknowledgement, or its order to register."""
        now = time.monotonic()
        agents = self.agents
        for name, acked in (reply.acks or {}).items():
            agent = agents.get(name)
            if agent is not None:
                agent.heard(now, acked)
        for name in reply.unknown:
            agent = agents.get(name)
            if agent is not None:
                agent.unknown()

    async def run(self) -> None:
        """Until cancelled: send the REGISTERs gathered, and the heartbeat when it is due."""
        while True:
            wake = self._wake = anyio.Event()
            if not self._registering:
                wait = max(0.0, self._next_beat - time.monotonic())
                with anyio.move_on_after(min(wait, _GATHER) if self._unsent else wait):
                    await wake.wait()
            if self._unsent:
                self._unsent = {a for a in self._unsent if not a.send_out()}
            if self._registering:
                await anyio.sleep(_GATHER)
                self._send_registers()
            now = time.monotonic()
            if now >= self._next_beat:
                self._beat(now)

    def _send_registers(self) -> None:
        pending = [(self.agents.get(name), msg) for name, msg in self._registering.items()]
        self._registering.clear()
        batch = [(a, msg) for a, msg in pending if a is not None]
        for i in range(0, len(batch), REGISTER_BATCH):
            chunk = batch[i : i + REGISTER_BATCH]
            sender, first = chunk[0]
            self._send(sender, dataclasses.replace(first, more=tuple(msg for _, msg in chunk[1:])))

    def _send(self, agent: Agent, msg: Body) -> None:
        if not agent.send(msg):
            self._unsent.add(agent)

    def _beat(self, now: float) -> None:
        names = [name for name, a in self.agents.items() if a.registered]
        if not names:
            self._next_beat = now + _FIRST_INTERVAL
            return
        sender = self.agents[names[0]]
        values, utilized = sender.measure(now)
        self._send(sender, Heartbeat(os.getloadavg(), values, utilized, tuple(names[1:])))
        self._next_beat = now + sender.heartbeat_interval

"""What the core decided must happen, collected during one step and carried out by the daemon's shell.

The core writes here and never sends: the shell commits ``journal`` first, then sends the agents'
messages, then the clients'. Everything is grouped per peer so that each flush sends one message per
peer and kind (batching on every hop), and a job's newest status replaces an older one of the same flush.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from pilot.store_batch import Batch
from pilot.wire.messages import Body


@dataclass(frozen=True, slots=True)
class NodeLost:
    """Tell the allocation's batch system that one of its nodes was lost (it may drain or replace it)."""

    allocation: str
    node: str


@dataclass(frozen=True, slots=True)
class CancelAllocation:
    """Give an allocation back to its batch system."""

    allocation: str


Effect = NodeLost | CancelAllocation


@dataclass(slots=True)
class Outbox:
    #: Process orders per node, in their wire form (what the journal keeps too).
    orders: defaultdict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    #: Kills per node and reason: [[process job id, slot], ...].
    kills: defaultdict[str, defaultdict[str, list[list[Any]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    #: Orders asked back per node (not started, behind a busy core): [[process job id, slot], ...].
    withdraws: defaultdict[str, list[list[Any]]] = field(default_factory=lambda: defaultdict(list))
    #: Direct answers to agents (registered, heartbeat replies, stop): (node, message), in order.
    to_agents: list[tuple[str, Body]] = field(default_factory=list)
    #: Job statuses per subscribed client: ident -> job id -> newest status.
    statuses: defaultdict[bytes, dict[str, list[Any]]] = field(default_factory=lambda: defaultdict(dict))
    #: Replies to client requests: (ident, body), in order.
    replies: list[tuple[bytes, dict[str, Any]]] = field(default_factory=list)
    #: I/O the shell performs on the core's behalf (batch system calls).
    effects: list[Effect] = field(default_factory=list)
    #: The journal's share of this step: committed before anything above leaves.
    journal: Batch = field(default_factory=Batch)

    def to_agent(self, node: str, msg: Body) -> None:
        self.to_agents.append((node, msg))

    def take(self) -> Outbox:
        """Everything to send written so far, leaving this outbox empty for the next step. The journal's
        batch stays: the shell takes it with :meth:`take_journal` to commit it before anything is sent."""
        taken = Outbox(
            self.orders, self.kills, self.withdraws, self.to_agents, self.statuses, self.replies, self.effects
        )
        self.orders = defaultdict(list)
        self.kills = defaultdict(lambda: defaultdict(list))
        self.withdraws = defaultdict(list)
        self.to_agents = []
        self.statuses = defaultdict(dict)
        self.replies = []
        self.effects = []
        return taken

    def take_journal(self) -> Batch:
        tx, self.journal = self.journal, Batch()
        return tx

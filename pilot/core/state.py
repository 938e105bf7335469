"""The core's shared state, handed whole to each of its parts: one place that says what they all work on."""

from __future__ import annotations

from dataclasses import dataclass

from pilot.allocations import AllocationBook
from pilot.config import Config
from pilot.core.clock import Clock
from pilot.core.jobs import JobBook
from pilot.core.nodes import NodeBook
from pilot.core.outbox import Outbox


@dataclass(frozen=True, slots=True)
class CoreState:
    config: Config
    clock: Clock
    outbox: Outbox
    book: JobBook
    nodes: NodeBook
    allocations: AllocationBook


class Part:
    """A part of the core (admission, lifecycle, scheduling, agents): it reads and changes the shared
    state, each under the name it has here."""

    def __init__(self, state: CoreState) -> None:
        self.config = state.config
        self.clock = state.clock
        self.outbox = state.outbox
        self.book = state.book
        self.nodes = state.nodes
        self.allocations = state.allocations

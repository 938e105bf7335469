"""Placement of ranks on node slots, and the queue that feeds it."""

from __future__ import annotations

from pilot.scheduler.placement import (
    NodeSlots,
    RankPlacement,
    can_wait_behind,
    never_fits,
    place,
    place_behind,
    release,
)
from pilot.scheduler.queue import JobQueue

__all__ = [
    "JobQueue",
    "NodeSlots",
    "RankPlacement",
    "can_wait_behind",
    "never_fits",
    "place",
    "place_behind",
    "release",
]

"""Placement of ranks on node slots, and the queue that feeds it."""

from __future__ import annotations

from pilot.scheduler.placement import NodeSlots, RankPlacement, never_fits, place, release
from pilot.scheduler.queue import JobQueue

__all__ = ["JobQueue", "NodeSlots", "RankPlacement", "never_fits", "place", "release"]

"""Time as the core sees it: passed in by the shell before each step, never read from the system."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Clock:
    #: Seconds since the epoch: what users see (state times, walltime ends, allocations' start).
    wall: float = 0.0
    #: A monotonic reading: what durations between two events are measured with (heartbeats, waits).
    mono: float = 0.0

    def set(self, *, wall: float, mono: float) -> None:
        self.wall, self.mono = wall, mono

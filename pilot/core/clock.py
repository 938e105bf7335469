"""Time as the core sees it: passed in by the shell before each step, never read from the system.

The shell also says when the daemon itself did not run (:meth:`Clock.paused`: the process stopped,
swapped out, starved of CPU): an agent's silence is measured in the time the daemon was awake to hear
it (:meth:`Clock.awake`), so a daemon never blames an agent for its own pause.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

#: Pauses remembered, newest last: more than an agent stays silent across before it is declared lost.
_PAUSES: Final = 64


@dataclass(slots=True)
class Clock:
    #: Seconds since the epoch: what users see (state times, walltime ends, allocations' start).
    wall: float = 0.0
    #: A monotonic reading: what durations between two events are measured with (heartbeats, waits).
    mono: float = 0.0
    #: The daemon's own pauses, as monotonic (since, until), disjoint and in order.
    pauses: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=_PAUSES))

    def set(self, *, wall: float, mono: float) -> None:
        self.wall, self.mono = wall, mono

    def paused(self, since: float, until: float) -> None:
        """The daemon did not run from ``since`` to ``until`` (monotonic)."""
        if until <= since:
            return
        if self.pauses and since <= self.pauses[-1][1]:
            start, end = self.pauses.pop()
            since, until = min(since, start), max(until, end)
        self.pauses.append((since, until))

    def awake(self, since: float) -> float:
        """Seconds from ``since`` to now (monotonic) in which the daemon ran: its pauses left out."""
        now = self.mono
        total = now - since
        for start, end in reversed(self.pauses):
            if end <= since:
                break  # older ones end earlier still
            total -= max(0.0, min(end, now) - max(start, since))
        return total

"""The daemon's own stalls, measured: a beat every ``BEAT`` seconds on the daemon's event loop, and a
gap between two beats far beyond that is time the daemon did not run (the process stopped by SIGSTOP,
swapped out, starved of CPU, or a step that held the loop). The shell hands each such pause to the core
(:meth:`pilot.core.reactor.Core.on_paused`), whose rule is that nobody is blamed for silence inside it.

The monitor beats too, with the time it is about to tick with: whichever task the loop runs first after
a pause, the pause is known before the core judges an agent's silence.
"""

from __future__ import annotations

from typing import Final

#: Seconds between two beats of the watch task.
BEAT: Final = 0.1
#: A gap between beats longer than this is a pause (well above the beat, and the loop's own jitter).
LIMIT: Final = 1.0


class StallMeter:
    """The last beat, and the pause a new beat reveals."""

    __slots__ = ("_last", "limit")

    def __init__(self, now: float, *, limit: float = LIMIT) -> None:
        self._last = now
        self.limit = limit

    def beat(self, now: float) -> tuple[float, float] | None:
        """A beat at ``now`` (monotonic): the pause since the last beat, (since, until), if there was one."""
        last = self._last
        if now <= last:
            return None
        self._last = now
        return (last, now) if now - last > self.limit else None

"""Python's cyclic garbage collector, tuned for the daemon and the agents (never a client's process).

Both hold many long-lived objects (jobs, orders, their records) and make many short-lived ones per
job. With the default thresholds a young-generation collection runs every 700 allocations and older
ones scan everything held, which cost a third of the daemon's CPU per job on the submit and
placement paths. What was built at start-up (modules, configuration) is frozen out of every scan;
collections run every 50,000 allocations. Our objects hold few cycles; reference counting frees the
rest at once, so memory stays where it was.

A young collection scans what was allocated since the last one and is still alive. A burst of
submits keeps every job's objects alive until it ends (~12 per queued job), so at a fixed threshold
each collection of the burst scans ~4,000 live jobs, and every job in it is scanned once or twice (a
young and an older collection) for nothing: ~4-10 us per task of the 100,000-job null row. The
daemon therefore keeps the young threshold at least :data:`PER_JOB` allocations per unfinished job
(:class:`YoungThreshold`, fitted before a SUBMIT of several jobs is admitted and on each tick): a burst
outgrows it no more, its jobs end before a collection reaches them, and the garbage a collection waits
for stays in proportion to what the daemon holds anyway.
"""

from __future__ import annotations

import gc
from typing import Final

THRESHOLDS: Final = (50_000, 20, 10)
#: Young-collection threshold per unfinished job: above the objects a queued job keeps alive (~12).
PER_JOB: Final = 24

_tuned = False


def collect_rarely() -> None:
    global _tuned
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    _tuned = True


#: Below this many unfinished jobs the base threshold is PER_JOB per job already: one band for them all
#: (a lone job's turns, one job or none unfinished, never refit).
_FIRST_BAND: Final = 1 << ((THRESHOLDS[0] // PER_JOB).bit_length() - 1)


class YoungThreshold:
    """The young threshold, refitted when the unfinished jobs leave their power-of-two band: it stays
    between PER_JOB and 2 x PER_JOB allocations per job (never under THRESHOLDS[0]). Only in a process
    :func:`collect_rarely` tuned (a daemon in a test's process leaves its collector alone)."""

    __slots__ = ("_high", "_low")

    def __init__(self) -> None:
        self._low = self._high = 0  # the band of job counts the threshold is set for: [low, high)

    def fit(self, jobs: int) -> None:
        if self._low <= jobs < self._high or not _tuned:
            return
        if jobs < _FIRST_BAND:
            self._low, self._high = 0, _FIRST_BAND
        else:
            self._high = 1 << jobs.bit_length()  # jobs < high <= 2 x jobs
            self._low = self._high >> 1
        gc.set_threshold(max(THRESHOLDS[0], PER_JOB * self._high), *THRESHOLDS[1:])


__all__ = ["PER_JOB", "THRESHOLDS", "YoungThreshold", "collect_rarely"]

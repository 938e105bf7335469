"""Python's cyclic garbage collector, tuned for the daemon and the agents (never a client's process).

Both hold many long-lived objects (jobs, orders, their records) and make many short-lived ones per
job. With the default thresholds a young-generation collection runs every 700 allocations and older
ones scan everything held, which cost a third of the daemon's CPU per job on the submit and
placement paths. What was built at start-up (modules, configuration) is frozen out of every scan;
collections run every 50,000 allocations. Our objects hold few cycles; reference counting frees the
rest at once, so memory stays where it was.
"""

from __future__ import annotations

import gc
from typing import Final

THRESHOLDS: Final = (50_000, 20, 10)


def collect_rarely() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


__all__ = ["THRESHOLDS", "collect_rarely"]

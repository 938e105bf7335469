"""Every job id a pilot holds, as runs of consecutive ids: what LIST answers.

Job ids are dense integers (given in turn, or leased in blocks), so a pilot that ran ten million jobs
holds a few runs, not ten million strings. The daemon keeps them as runs (:class:`JobIds`, one step per
accepted job) and answers LIST from memory, where reading and sorting every id from the journal paused
its loop for seconds per million jobs and outgrew a frame's limit past some seven million.

The journal keeps where each run starts (meta ``META``, written with the job that starts or joins a
run); a restarted daemon finds each run's end by one lookup (:func:`journal_ranges`), and checks the
runs against the number of jobs the journal holds. A journal without them (or whose runs do not add
up) is scanned for its holes instead.
"""

from __future__ import annotations

import bisect
import itertools
import sqlite3
from collections.abc import Sequence
from typing import Any, Final

#: ``[first, last]`` runs of consecutive ids, ascending, disjoint and not adjacent.
Ranges = list[list[int]]

#: The journal's meta key of the runs (:meth:`JobIds.journal_value`).
META: Final = "job_runs"
#: Most runs the journal keeps (~12 bytes each).
JOURNALED_RUNS_MOST: Final = 4096
#: ... and of the jobs a mass cancel has not ended yet (``JobBook.cancel_later``).
CANCELING_META: Final = "canceling"

#: The first and the last id of each run: a scan of the jobs table in id order with one primary-key
#: probe per row, all in SQLite's C (~0.45 s each per million jobs).
_STARTS: Final = "SELECT id FROM jobs AS j WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE id = j.id - 1) ORDER BY id"
_ENDS: Final = "SELECT id FROM jobs AS j WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE id = j.id + 1) ORDER BY id"


class JobIds:
    """The ids of the jobs a pilot holds, as runs. Ids come nearly in order (a client's leased block
    fills in turn), so an id that extends the newest run costs one comparison."""

    __slots__ = ("_firsts", "_runs", "changed")

    def __init__(self, ranges: Ranges | None = None) -> None:
        self._runs: Ranges = [list(r) for r in ranges or []]
        self._firsts = [r[0] for r in self._runs]
        #: A run started or joined another since the journal last had them (the runs read back at a
        #: restart are journaled again: the journal may not have had them).
        self.changed = ranges is not None

    def add(self, i: int) -> None:
        runs = self._runs
        if runs and runs[-1][1] + 1 == i:  # (nearly every job)
            runs[-1][1] = i
            return
        k = bisect.bisect_right(self._firsts, i)  # runs[k - 1] starts at or before i
        if k and runs[k - 1][1] >= i:
            return  # held already
        joins_left = k > 0 and runs[k - 1][1] + 1 == i
        joins_right = k < len(runs) and runs[k][0] == i + 1
        if joins_left and not joins_right:
            runs[k - 1][1] = i  # (not a change for the journal: a run's end is looked up)
            return
        self.changed = True  # a run starts, or starts earlier, or two become one
        if joins_left:
            runs[k - 1][1] = runs[k][1]
            del runs[k], self._firsts[k]
        elif joins_right:
            runs[k][0] = self._firsts[k] = i
        else:
            runs.insert(k, [i, i])
            self._firsts.insert(k, i)

    def journal_value(self, *, most: int | None = None) -> Ranges | None:
        """What the journal keeps (:data:`META`): the runs as they are now; None when there are more than
        ``most`` (ids with that many holes, from many clients' leases left unused, are found by a scan
        at a restart rather than written again in full as each new run starts)."""
        self.changed = False
        return None if most is not None and len(self._runs) > most else self.ranges()

    def ranges(self) -> Ranges:
        """A copy: the runs change as jobs come."""
        return [list(r) for r in self._runs]

    def __contains__(self, i: int) -> bool:
        k = bisect.bisect_right(self._firsts, i)
        return k > 0 and self._runs[k - 1][1] >= i

    def __len__(self) -> int:
        return count(self._runs)


def journal_ranges(db: sqlite3.Connection, *, kept: Any, total: int) -> Ranges:
    """The runs of the ids in ``db``'s jobs table, which holds ``total`` jobs. ``kept``: the runs its
    meta ``META`` holds (None: none), whose ends are looked up; they are used only when they account
    for every job exactly, else the table is scanned for its holes."""
    least, greatest = db.execute("SELECT min(id), max(id) FROM jobs").fetchone()
    if least is None:
        return []
    if greatest - least + 1 == total:
        return [[least, greatest]]
    runs = _kept_runs(db, kept, least) if kept is not None else None
    if runs is not None and count(runs) == total:
        return runs
    return _scan(db)


def _kept_runs(db: sqlite3.Connection, kept: Any, least: int) -> Ranges | None:
    """The journaled runs with each end looked up (the greatest id before the next run's start), or None
    when they are malformed or do not start at the least id. Every id then lies in one run's span; the
    runs are dense when their lengths add up to the jobs' number (what the caller checks)."""
    if not isinstance(kept, list) or not kept or not all(_is_run(r) for r in kept):
        return None
    starts = [r[0] for r in kept]
    if starts[0] != least or any(a >= b for a, b in itertools.pairwise(starts)):
        return None
    runs: Ranges = []
    for k, start in enumerate(starts):
        if k + 1 < len(starts):
            row = db.execute("SELECT max(id) FROM jobs WHERE id >= ? AND id < ?", (start, starts[k + 1])).fetchone()
        else:
            row = db.execute("SELECT max(id) FROM jobs WHERE id >= ?", (start,)).fetchone()
        if row[0] is None:
            return None
        runs.append([start, row[0]])
    return runs


def canceling_runs(kept: Any) -> Ranges:
    """The runs of a journal's meta value of jobs a mass cancel had not ended (None: there was none).
    Raises ValueError for a malformed one: which jobs were canceled cannot be known, and running them
    would act against a request the pilot accepted."""
    if kept is None:
        return []
    if not isinstance(kept, list) or not all(_is_run(r) for r in kept):
        raise ValueError(f"the journal's list of jobs being canceled is damaged: {kept!r:.80}")
    return [list(r) for r in kept]


def _is_run(value: Any) -> bool:
    """A ``[first, last]`` pair of ids."""
    return (
        isinstance(value, list) and len(value) == 2 and all(type(i) is int for i in value) and 0 < value[0] <= value[1]
    )


def _scan(db: sqlite3.Connection) -> Ranges:
    """The runs of the ids in the jobs table, found by their holes (within one transaction, or one
    whose journal is not written meanwhile: the two lists must agree)."""
    starts = [row[0] for row in db.execute(_STARTS)]
    ends = [row[0] for row in db.execute(_ENDS)]
    if len(starts) != len(ends):
        raise sqlite3.DatabaseError(f"the journal changed while its job ids were read ({len(starts)} != {len(ends)})")
    return [[first, last] for first, last in zip(starts, ends, strict=True)]


def count(ranges: Sequence[Sequence[int]]) -> int:
    return sum(last - first + 1 for first, last in ranges)


def expand(ranges: Sequence[Sequence[int]]) -> list[str]:
    """Each id of the runs, in order, as the job id strings it stands for."""
    return [str(i) for first, last in ranges for i in range(first, last + 1)]


#: Most ids a client expands a LIST answer into (~6 GB of Python strings): a larger count is refused,
#: not allocated, as the answer of a damaged or hostile peer would be.
MOST_LISTED: Final = 100_000_000


def from_wire(value: object) -> list[str]:
    """The job ids of a LIST answer's ``ranges``; ValueError saying what is wrong with it."""
    if not isinstance(value, list):
        raise ValueError(f"'ranges' must be a list, not {type(value).__name__}")
    last_seen = 0
    for run in value:
        if not (_is_run(run) and last_seen < run[0]):
            raise ValueError(f"'ranges' must hold ascending, disjoint [first, last] pairs of positive ids, not {run!r}")
        last_seen = run[1]
    total = count(value)
    if total > MOST_LISTED:
        raise ValueError(f"it lists {total:,} jobs, more than a client expands into ids ({MOST_LISTED:,})")
    return expand(value)

"""Job ids leased to clients ahead of their jobs.

PSI/J's ``submit()`` returns with the job's native id set. A client that waited for the pilot's answer
to learn it would pay a round trip per job; instead it asks for a block of ids now and then (LEASE) and
gives each job the next one as it sends it. The id is also the job's submit id: a job sent again after
a lost answer names the id it already has, and is followed, never made twice.

Ids come from the one counter the pilot's own ids come from (``JobBook.seq``), so a leased id is never
any other job's. A lease stays until each of its ids has made a job; the journal keeps the leases not
used up (``META``), so a daemon restarted on the same run directory takes the ids its predecessor gave.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any, Final

#: The journal's meta key for the leases not used up: [[first, last], ...].
META: Final = "leases"
#: Most ids one LEASE may ask for.
MOST: Final = 65536


class _Lease:
    """Ids first..last, and which of them made a job (a bit each)."""

    __slots__ = ("first", "last", "left", "used")

    def __init__(self, first: int, last: int) -> None:
        self.first = first
        self.last = last
        self.left = last - first + 1
        self.used = bytearray((self.left + 7) // 8)

    def mark(self, job_id: int) -> bool:
        """``job_id`` made a job: False if it had made one already."""
        k = job_id - self.first
        byte, bit = k >> 3, 1 << (k & 7)
        if self.used[byte] & bit:
            return False
        self.used[byte] |= bit
        self.left -= 1
        return True

    def taken(self, job_id: int) -> bool:
        k = job_id - self.first
        return bool(self.used[k >> 3] & (1 << (k & 7)))


class Leases:
    """The leases not used up, found by id (a few per client: a bisect over their first ids)."""

    def __init__(self) -> None:
        self._firsts: list[int] = []
        self._leases: list[_Lease] = []
        #: Whether the set changed since the journal last had it (:meth:`journal_value`).
        self.changed = False

    def __len__(self) -> int:
        return len(self._leases)

    def grant(self, first: int, last: int) -> None:
        """Ids first..last (above every id given before) go to a client."""
        if self._firsts and first <= self._leases[-1].last:
            raise ValueError(f"lease {first}..{last} overlaps an earlier one")
        self._firsts.append(first)
        self._leases.append(_Lease(first, last))
        self.changed = True

    def _find(self, job_id: int) -> int:
        i = bisect.bisect_right(self._firsts, job_id) - 1
        if i >= 0 and job_id <= self._leases[i].last:
            return i
        return -1

    def state(self, job_id: int) -> str:
        """'free' (leased, no job yet), 'used' (it made a job) or 'unknown' (not leased, or used up)."""
        i = self._find(job_id)
        if i < 0:
            return "unknown"
        return "used" if self._leases[i].taken(job_id) else "free"

    def use(self, job_id: int) -> None:
        """A job was made with ``job_id`` (leased and free: :meth:`state`); a lease used up is dropped."""
        i = self._find(job_id)
        if i < 0:
            raise KeyError(job_id)
        lease = self._leases[i]
        if lease.mark(job_id) and lease.left == 0:
            del self._firsts[i], self._leases[i]
            self.changed = True

    def give_back(self, first: int, last: int) -> int | None:
        """Ids first..last of one lease, none of which made a job, that its client will never use: the
        lease ends before them (dropped if nothing is left) -- or, in its middle, they count as used.
        Returns the lease's last id as it was when the ids were its tail (so that the pilot's counter
        may come back to them if nothing was given after), else None. Ids not so held are ignored."""
        i = self._find(first)
        if i < 0 or last > self._leases[i].last:
            return None
        lease = self._leases[i]
        if any(lease.taken(job_id) for job_id in range(first, last + 1)):
            return None
        self.changed = True
        if last == lease.last:
            was = lease.last
            if first == lease.first:
                del self._firsts[i], self._leases[i]
            else:
                lease.last = first - 1
                lease.left -= last - first + 1
            return was
        for job_id in range(first, last + 1):
            lease.mark(job_id)
        return None

    def journal_value(self) -> list[list[int]]:
        """What the journal keeps: the leases not used up (which of their ids made jobs, the jobs say)."""
        self.changed = False
        return [[lease.first, lease.last] for lease in self._leases]

    def restore(self, value: Any, job_ids: Iterable[str]) -> int:
        """The leases a journal kept (``value`` as :meth:`journal_value` wrote it), their ids that made
        jobs marked from ``job_ids``. Returns the last id leased (0: none). A malformed value raises
        ValueError: the journal is damaged."""
        if value is None:
            return 0
        if not isinstance(value, list):
            raise ValueError(f"meta {META!r} is not a list")
        last = 0
        for item in value:
            if not (
                isinstance(item, list)
                and len(item) == 2
                and all(type(x) is int for x in item)
                and 0 < item[0] <= item[1]
                and item[1] - item[0] < MOST
            ):
                raise ValueError(f"meta {META!r} holds a malformed lease {item!r:.80}")
            self.grant(item[0], item[1])
            last = item[1]
        for job_id in job_ids:
            if job_id.isascii() and job_id.isdigit() and self.state(int(job_id)) == "free":
                self.use(int(job_id))
        self.changed = False
        return last


def leased_id(submit_id: str | None) -> int | None:
    """The job id a submit id names, if it is one (a decimal number: the id leased for the job); else
    None (a client's own submit id, e.g. a document's)."""
    if submit_id is None or not (submit_id.isascii() and submit_id.isdigit()) or len(submit_id) > 18:
        return None
    job_id = int(submit_id)
    return job_id if job_id > 0 and str(job_id) == submit_id else None

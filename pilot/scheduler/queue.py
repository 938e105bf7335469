"""The queue of jobs waiting for slots, grouped into categories of identical requests and priority.

When the head of a category does not fit, nothing behind it in that category can either, so a
scheduling pass costs O(placements + categories), not O(queue length). Heads come highest priority
first, oldest first within a priority; a category holds jobs of one priority only.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

#: Subtracted from an item's ``order`` when it is put back: below every ``push``'s number, so those
#: items come first, in their own order.
_BACK = 1 << 62


class JobQueue(Generic[T]):
    def __init__(
        self,
        *,
        category: Callable[[T], Hashable],
        alive: Callable[[T], bool],
        priority: Callable[[T], int] = lambda _: 0,
        order: Callable[[T], int] | None = None,
    ) -> None:
        self._category = category
        self._order = order
        self._alive = alive
        self._priority = priority
        self._categories: dict[Hashable, deque[tuple[int, T]]] = {}
        #: The priority of each category key that has one other than 0 (its key is (priority, category)).
        self._priorities: dict[Hashable, int] = {}
        #: An item of a priority other than 0 was ever queued (until then, priorities cost nothing).
        self.prioritized = False
        self._seq = 0
        self._front = 0  # push_front's counter: below every push's, so those items are the oldest
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, item: T) -> None:
        self._seq += 1
        key = self._category(item)
        if self._priority(item):
            key = self._key(item)
        dq = self._categories.get(key)
        if dq is None:
            dq = self._categories[key] = deque()
        dq.append((self._seq, item))
        self._len += 1

    def push_front(self, item: T) -> None:
        """Put an item back ahead of everything queued in its priority (a job taken back from an agent
        keeps its turn); several put back are kept in their ``order`` (their submission), whichever
        comes back first."""
        dq = self._categories.setdefault(self._key(item), deque())
        self._len += 1
        if self._order is None:
            self._front -= 1
            dq.appendleft((self._front, item))
            return
        seq = self._order(item) - _BACK
        dq.insert(bisect.bisect_left(dq, seq, key=lambda entry: entry[0]), (seq, item))

    def _key(self, item: T) -> Hashable:
        category = self._category(item)
        priority = self._priority(item)
        if not priority:
            return category
        key = (priority, category)
        self._priorities[key] = priority
        self.prioritized = True
        return key

    def priority(self, key: Hashable) -> int:
        """The priority of the jobs under a category key :meth:`heads` gave."""
        return self._priorities.get(key, 0)

    def drop(self) -> None:
        """Account for one item that left the queue (it is dead now: placed, canceled, failed); it is
        discarded when it reaches its category's head."""
        self._len -= 1

    def heads(self) -> Iterator[tuple[Hashable, T]]:
        """Live category heads, highest priority first, oldest first within one. Dead items at a head
        are discarded on the way."""
        order = []
        priorities = self._priorities
        for category, dq in list(self._categories.items()):
            while dq and not self._alive(dq[0][1]):
                dq.popleft()
            if not dq:
                del self._categories[category]
                priorities.pop(category, None)
                continue
            order.append((-priorities.get(category, 0), dq[0][0], category))
        order.sort()  # sequence numbers are unique: categories are never compared
        for _, _, category in order:
            head = self._categories.get(category)
            if head:
                yield category, head[0][1]

    def peek(self, category: Hashable) -> T | None:
        """The category's live head (dead items at its head are discarded on the way), or None."""
        dq = self._categories.get(category)
        while dq and not self._alive(dq[0][1]):
            dq.popleft()
        if dq:
            return dq[0][1]
        self._categories.pop(category, None)
        self._priorities.pop(category, None)
        return None

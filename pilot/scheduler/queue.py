"""The queue of jobs waiting for slots, grouped into categories of identical requests.

When the head of a category does not fit, nothing behind it in that category can either, so a
scheduling pass costs O(placements + categories), not O(queue length).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class JobQueue(Generic[T]):
    def __init__(self, *, category: Callable[[T], Hashable], alive: Callable[[T], bool]) -> None:
        self._category = category
        self._alive = alive
        self._categories: dict[Hashable, deque[tuple[int, T]]] = {}
        self._seq = 0
        self._front = 0  # push_front's counter: below every push's, so those items are the oldest
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, item: T) -> None:
        self._seq += 1
        self._categories.setdefault(self._category(item), deque()).append((self._seq, item))
        self._len += 1

    def push_front(self, item: T) -> None:
        """Put an item back ahead of everything queued (a job taken back from an agent keeps its turn)."""
        self._front -= 1
        self._categories.setdefault(self._category(item), deque()).appendleft((self._front, item))
        self._len += 1

    def drop(self) -> None:
        """Account for one item that left the queue (it is dead now: placed, canceled, failed); it is
        discarded when it reaches its category's head."""
        self._len -= 1

    def heads(self) -> Iterator[tuple[Hashable, T]]:
        """Live category heads, oldest first. Dead items at a head are discarded on the way."""
        order = []
        for category, dq in list(self._categories.items()):
            while dq and not self._alive(dq[0][1]):
                dq.popleft()
            if not dq:
                del self._categories[category]
                continue
            order.append((dq[0][0], category))
        order.sort()
        for _, category in order:
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
        return None

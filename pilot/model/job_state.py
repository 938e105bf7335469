"""PSI/J job states and their strict partial order."""

from __future__ import annotations

from enum import Enum


class JobState(Enum):
    """NEW < QUEUED < ACTIVE < {COMPLETED, FAILED, CANCELED}; final states are mutually incomparable."""

    NEW = "NEW"
    QUEUED = "QUEUED"
    ACTIVE = "ACTIVE"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"

    #: Members are singletons: identity hashing is exact, and far cheaper than Enum's hash of the name
    #: (states key the daemon's counters and are hashed several times per task on the hot path).
    __hash__ = object.__hash__

    @property
    def order(self) -> int:
        return _ORDER[self]

    @property
    def final(self) -> bool:
        return _ORDER[self] == 3

    def is_final(self) -> bool:
        return self.final

    def is_greater_than(self, other: JobState) -> bool | None:
        """True/False where comparable; None for two distinct final states (the spec's ``||``)."""
        if self.final and other.final:
            return None if self is not other else False
        return _ORDER[self] > _ORDER[other]

    def __str__(self) -> str:
        return self.value


_ORDER = {
    JobState.NEW: 0,
    JobState.QUEUED: 1,
    JobState.ACTIVE: 2,
    JobState.COMPLETED: 3,
    JobState.FAILED: 3,
    JobState.CANCELED: 3,
}

#: The states to synthesise, in order, when a job jumps from one state to a later one.
PATH: tuple[JobState, ...] = (JobState.NEW, JobState.QUEUED, JobState.ACTIVE)


def states_between(old: JobState, new: JobState) -> list[JobState]:
    """The skipped states a client must fire between ``old`` and ``new`` (exclusive): only those every
    path to ``new`` goes through. COMPLETED is reached only through ACTIVE; FAILED and CANCELED also
    straight from QUEUED (a job canceled while queued never ran), so ACTIVE is not made up for them
    (as psij-python's ``JobStateOrder.prev``)."""
    path = PATH if new is JobState.COMPLETED or not new.final else PATH[:2]
    return [s for s in path if old.order < s.order < new.order]

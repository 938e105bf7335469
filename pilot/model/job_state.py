"""PSI/J job states and their strict partial order."""

from __future__ import annotations

from enum import Enum


class JobState(Enum):
    """NEW < QUEUED < STAGE_IN < ACTIVE < STAGE_OUT < CLEANUP < {COMPLETED, FAILED, CANCELED}; final
    states are mutually incomparable. Only a job with file staging enters the three staging states."""

    NEW = "NEW"
    QUEUED = "QUEUED"
    STAGE_IN = "STAGE_IN"
    ACTIVE = "ACTIVE"
    STAGE_OUT = "STAGE_OUT"
    CLEANUP = "CLEANUP"
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
        return _ORDER[self] == _FINAL

    def is_final(self) -> bool:
        return self.final

    def is_greater_than(self, other: JobState) -> bool | None:
        """True/False where comparable; None for two distinct final states (the spec's ``||``)."""
        if self.final and other.final:
            return None if self is not other else False
        return _ORDER[self] > _ORDER[other]

    def __str__(self) -> str:
        return self.value


_FINAL = 6
_ORDER = {
    JobState.NEW: 0,
    JobState.QUEUED: 1,
    JobState.STAGE_IN: 2,
    JobState.ACTIVE: 3,
    JobState.STAGE_OUT: 4,
    JobState.CLEANUP: 5,
    JobState.COMPLETED: _FINAL,
    JobState.FAILED: _FINAL,
    JobState.CANCELED: _FINAL,
}

#: The states to synthesise, in order, when a job jumps from one state to a later one.
PATH: tuple[JobState, ...] = (JobState.NEW, JobState.QUEUED, JobState.ACTIVE)


def states_between(old: JobState, new: JobState) -> list[JobState]:
    """The skipped states a client must fire between ``old`` and ``new`` (exclusive): only those every
    path to ``new`` goes through. COMPLETED is reached only through ACTIVE; FAILED and CANCELED also
    straight from QUEUED (a job canceled while queued never ran), so ACTIVE is not made up for them
    (as psij-python's ``JobStateOrder.prev``). The staging states are not made up: only jobs that stage
    enter them, and the daemon reports each (each waits for an agent's answer, so none is coalesced away)."""
    path = PATH if new is JobState.COMPLETED or not new.final else PATH[:2]
    return [s for s in path if old.order < s.order < new.order]

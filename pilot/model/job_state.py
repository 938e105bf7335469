"""PSI/J job states and their strict partial order."""

from __future__ import annotations

from enum import Enum
from typing import Final

_FINAL: Final = 6
#: Each state's place in the order, by its value (the members' ``order``).
_ORDER: Final = {
    "NEW": 0,
    "QUEUED": 1,
    "STAGE_IN": 2,
    "ACTIVE": 3,
    "STAGE_OUT": 4,
    "CLEANUP": 5,
    "COMPLETED": _FINAL,
    "FAILED": _FINAL,
    "CANCELED": _FINAL,
}


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

    def __init__(self, value: str) -> None:
        # Plain attributes, as psij-python's JobState has them: read several times per task on the
        # daemon's hot path, where a property costs twice the lookup.
        #: The state's place in the order (the three final states share the last).
        self.order: int = _ORDER[value]
        #: COMPLETED, FAILED or CANCELED.
        self.final: bool = _ORDER[value] == _FINAL

    def is_final(self) -> bool:
        return self.final

    def is_greater_than(self, other: JobState) -> bool | None:
        """True/False where comparable; None for two distinct final states (the spec's ``||``)."""
        if self.final and other.final:
            return None if self is not other else False
        return self.order > other.order

    def __str__(self) -> str:
        return self.value


#: The states to synthesise, in order, when a job jumps from one state to a later one.
PATH: tuple[JobState, ...] = (JobState.NEW, JobState.QUEUED, JobState.ACTIVE)
#: The final states, and their names as the wire and the journal write them.
FINAL_STATES: Final = tuple(s for s in JobState if s.final)
FINAL_NAMES: Final = tuple(s.value for s in FINAL_STATES)


def states_between(old: JobState, new: JobState) -> list[JobState]:
    """The skipped states a client must fire between ``old`` and ``new`` (exclusive): only those every
    path to ``new`` goes through. COMPLETED is reached only through ACTIVE; FAILED and CANCELED also
    straight from QUEUED (a job canceled while queued never ran), so ACTIVE is not made up for them
    (as psij-python's ``JobStateOrder.prev``). The staging states are not made up: only jobs that stage
    enter them, and the daemon reports each (each waits for an agent's answer, so none is coalesced away)."""
    path = PATH if new is JobState.COMPLETED or not new.final else PATH[:2]
    return [s for s in path if old.order < s.order < new.order]

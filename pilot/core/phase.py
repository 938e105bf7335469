"""The daemon's job phases and the one table of moves between them.

A job's PSI/J state (QUEUED, ACTIVE, final) is what clients see; its phase is where the daemon has it.
Every phase change goes through :meth:`pilot.core.jobs.JobBook.move`, which checks the pair against
:data:`MOVES` (an illegal move is a bug, raised at once) and keeps the queue, the blocked set, the jobs
waiting behind busy cores and the journal's dirty set in step. Staging adds its phases here: one row
each, and the moves into and out of them.
"""

from __future__ import annotations

from enum import Enum
from typing import Final


class Phase(Enum):
    #: Accepted, waiting for its dependencies or a <Hold> release: not in the queue.
    BLOCKED = "blocked"
    #: In the queue, waiting for slots.
    QUEUED = "queued"
    #: Its one order is at an agent, behind a busy core (``pilot.backlog``); not started yet.
    BEHIND = "behind"
    #: Of those, one asked back from its agent (WITHDRAW) to be placed again on a free core.
    WITHDRAWING = "withdrawing"
    #: The agents of its nodes put its files in place (stage-in); its slots are held, nothing of it runs yet.
    STAGE_IN = "stage_in"
    #: Its pre_launch script (or the launch preparation of shared output files) runs.
    PRE_LAUNCH = "pre"
    #: Its ranks run.
    RANKS = "ranks"
    #: Its post_launch script runs.
    POST_LAUNCH = "post"
    #: Its processes are done; its agent takes the files its outcome selects out (stage-out) ...
    STAGE_OUT = "stage_out"
    #: ... and then removes the paths its cleanup lists.
    CLEANUP = "cleanup"
    #: Ended: its final state is set; it leaves memory after the flush that sends it.
    DONE = "done"

    __hash__ = object.__hash__  # singletons: identity hashing, as JobState

    def __init__(self, value: str) -> None:
        #: The phase as the journal's ``phase`` column keeps it (its value; BLOCKED's is 'queued': the
        #: resuming core finds it blocked again). Behind a busy core, being asked back and started are
        #: three records, not one: a resumed daemon must know which (an order it asked back may have
        #: been given back; a started one never can be). An attribute, not a property: the journal
        #: reads it for every changed job.
        self.journaled: str = "queued" if value == "blocked" else value

    @staticmethod
    def from_journal(value: str) -> Phase:
        """A journaled phase; a queued one is QUEUED until the resuming core finds it BLOCKED."""
        phase = _FROM_JOURNAL.get(value)
        if phase is None:
            raise ValueError(f"unknown job phase {value!r}")
        return phase


_FROM_JOURNAL: Final = {
    "queued": Phase.QUEUED,
    "behind": Phase.BEHIND,
    "withdrawing": Phase.WITHDRAWING,
    "stage_in": Phase.STAGE_IN,
    "pre": Phase.PRE_LAUNCH,
    "ranks": Phase.RANKS,
    "post": Phase.POST_LAUNCH,
    "stage_out": Phase.STAGE_OUT,
    "cleanup": Phase.CLEANUP,
    "done": Phase.DONE,
}

_RUNNING: Final = (Phase.BEHIND, Phase.WITHDRAWING, Phase.PRE_LAUNCH, Phase.RANKS, Phase.POST_LAUNCH)
_PLACED: Final = (Phase.STAGE_IN, *_RUNNING, Phase.STAGE_OUT, Phase.CLEANUP)

#: Allowed moves. A placed job goes back to QUEUED when it is requeued (restartable, node lost) or
#: given back unstarted (withdrawn); any unfinished job may end (canceled, failed, stranded).
MOVES: Final[frozenset[tuple[Phase, Phase]]] = frozenset(
    {
        (Phase.BLOCKED, Phase.QUEUED),
        (Phase.QUEUED, Phase.BEHIND),
        (Phase.QUEUED, Phase.PRE_LAUNCH),
        (Phase.QUEUED, Phase.RANKS),
        (Phase.BEHIND, Phase.RANKS),
        (Phase.BEHIND, Phase.WITHDRAWING),
        (Phase.WITHDRAWING, Phase.RANKS),
        (Phase.PRE_LAUNCH, Phase.RANKS),
        (Phase.RANKS, Phase.POST_LAUNCH),
        # Staging: in before anything of the job runs (its ranks then wait at the agent for busy cores
        # rather than behind them here: a job taken back would be staged again elsewhere), out and
        # cleanup after the last process.
        (Phase.QUEUED, Phase.STAGE_IN),
        (Phase.STAGE_IN, Phase.PRE_LAUNCH),
        (Phase.STAGE_IN, Phase.RANKS),
        *((p, Phase.STAGE_OUT) for p in _RUNNING),
        *((p, Phase.CLEANUP) for p in (*_RUNNING, Phase.STAGE_OUT)),
        *((p, Phase.QUEUED) for p in _PLACED),
        *((p, Phase.DONE) for p in (Phase.BLOCKED, Phase.QUEUED, *_PLACED)),
    }
)


#: The table by phase: where each may go (what :meth:`JobBook.move` looks up, once per move).
NEXT: Final[dict[Phase, frozenset[Phase]]] = {p: frozenset(n for o, n in MOVES if o is p) for p in Phase}


class IllegalMove(AssertionError):
    """A phase change the table does not allow: a bug in the core, never a user's error."""

    def __init__(self, old: Phase, new: Phase, *, job_id: str) -> None:
        super().__init__(f"job {job_id}: {old.name} -> {new.name} is not a move of the job state machine")

"""The core rebuilt from a real journal (SQLite in a temporary directory) after its daemon died: the
queue, the running jobs' slots, the orders behind busy cores, blocked jobs, and an agent that comes back."""

from __future__ import annotations

from pathlib import Path

import pytest
from core_env import CoreEnv, true

from pilot.core.phase import Phase
from pilot.model.job_state import JobState
from pilot.store import Store

pytestmark = pytest.mark.timeout(10)


def test_resume_rebuilds_queue_running_behind_and_blocked(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    env = CoreEnv(cores=1, store=Store.open(path))
    env.register("n0")
    running, behind = env.submit(true(), true())
    (blocked,) = env.submit(true(custom_attributes={"depends_on": running}))
    env.step()
    env.started("n0", running)
    env.step()
    assert env.job(behind).phase is Phase.BEHIND

    again = env.restarted(path)
    book = again.core.book
    assert book.seq == 3 and set(book.jobs) == {running, behind, blocked}
    assert book.jobs[running].phase is Phase.RANKS and book.jobs[running].state is JobState.ACTIVE
    assert book.jobs[behind].phase is Phase.BEHIND and behind in book.behind
    assert book.jobs[blocked].phase is Phase.BLOCKED and blocked in book.blocked
    assert again.core.nodes.slots["n0"].free_cores == []  # the running job holds core 0 again
    assert not again.core.nodes.agents["n0"].confirmed

    # The agent comes back running the first job; the order behind it never reached it: sent again.
    step = again.register("n0", running=[[running, 0]])
    assert [o["job_id"] for o in step.orders("n0")] == [behind]
    assert again.core.nodes.agents["n0"].confirmed and not step.kills("n0")
    again.exited("n0", running)
    step = again.step()
    assert again.state(running) is JobState.COMPLETED
    # Its dependency completed: queued, and placed behind the core the other job is about to take.
    assert [(o["job_id"], o.get("after_cores")) for o in step.orders("n0")] == [(blocked, True)]
    again.started("n0", behind)
    again.exited("n0", behind)
    again.step()
    assert again.state(behind) is JobState.COMPLETED


def test_an_agent_running_what_the_journal_does_not_hold_is_told_to_kill_it(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    env = CoreEnv(cores=1, store=Store.open(path))
    env.register("n0")
    env.step()
    again = env.restarted(path)
    step = again.register("n0", running=[["77", 0]])
    assert step.kills("n0") == {"unknown to the daemon": [["77", 0]]}


def test_next_job_id_continues_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    env = CoreEnv(cores=1, store=Store.open(path))
    env.register("n0")
    first = env.submit(true(), true())
    env.step()
    again = env.restarted(path)
    again.register("n0", running=[[first[0], 0]])
    assert again.submit(true()) == ["3"]

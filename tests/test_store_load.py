"""A resuming daemon's load of the journal (pilot/store_load.py, ``Store.load(ended=False)``): unfinished
jobs in full, ended ones counted and left in SQLite, their ids kept where a lease names them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from test_store import _desc, _job, _order

from pilot.core.leases import META as LEASES_META
from pilot.jobs import ProcessResult
from pilot.launchers import PlannedProcess
from pilot.model.job_state import JobState
from pilot.scheduler.placement import RankPlacement
from pilot.store import JournalError, Store

pytestmark = pytest.mark.timeout(60)

RANKS = [RankPlacement("n0", [0], [], 0), RankPlacement("n0", [1], [], 0)]


def _journal(path: Path) -> None:
    """Jobs 1 (running: two processes, one ended), 2 (COMPLETED, with the process and result rows its
    run left), 3 (FAILED), 4 (QUEUED) and 9 (CANCELED, the highest sequence number); a lease of 2-4."""
    with Store.open(path) as store:
        with store.batch() as tx:
            for seq in (1, 2, 3, 4, 9):
                tx.job_accepted(str(seq), seq, _desc(seq), float(seq))
            tx.meta(LEASES_META, [[2, 4]])
        with store.batch() as tx:
            one = {0: PlannedProcess("n0", _order("1", 0), [0]), 1: PlannedProcess("n0", _order("1", 1), [1])}
            two = {0: PlannedProcess("n0", _order("2", 0), [0, 1])}
            for jid, plans in (("1", one), ("2", two)):
                for plan in plans.values():
                    tx.process_dispatched(jid, plan)
                running = {"state": JobState.ACTIVE, "phase": "ranks", "ranks": RANKS, "processes": plans}
                tx.job_update(_job(jid, _desc(int(jid)), float(jid), **running), placed=True)
            tx.process_result("1", 0, ProcessResult("n0", "rank", exit_code=0))
            tx.process_result("2", 0, ProcessResult("n0", "rank", exit_code=0))
        with store.batch() as tx:
            tx.job_update(_job("2", _desc(2), 2.0, state=JobState.COMPLETED, phase="done", exit_code=0))
            tx.job_update(_job("3", _desc(3), 3.0, state=JobState.FAILED, phase="done", message="boom"))
            tx.job_update(_job("9", _desc(9), 9.0, state=JobState.CANCELED, phase="done", message="canceled"))


def test_ended_jobs_are_counted_and_the_unfinished_loaded_as_in_full(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _journal(path)
    with Store.open(path) as store:
        full = store.load()
        lean = store.load(ended=False)
    assert [j.id for j in full.jobs] == ["1", "2", "3", "4", "9"] and not full.ended and not full.leased_ended
    assert [j.id for j in lean.jobs] == ["1", "4"]
    assert lean.ended == {JobState.COMPLETED: 1, JobState.FAILED: 1, JobState.CANCELED: 1}
    assert lean.leased_ended == ["2", "3"]  # in the lease, ended; 4 is loaded, 9 is outside the lease
    assert lean.next_seq == full.next_seq == 10
    assert lean.id_ranges == full.id_ranges == [[1, 4], [9, 9]]  # ended jobs' ids too
    assert lean.meta == full.meta and lean.allocations == full.allocations
    by_id = {j.id: j for j in full.jobs}
    for job in lean.jobs:
        other = by_id[job.id]
        assert (job.state, job.phase, job.description, job.run.ranks, job.run.taken) == (
            other.state,
            other.phase,
            other.description,
            other.run.ranks,
            other.run.taken,
        )
        assert {s: (p.node, p.order, p.holds) for s, p in job.run.processes.items()} == {
            s: (p.node, p.order, p.holds) for s, p in other.run.processes.items()
        }
        assert job.run.results.keys() == other.run.results.keys()
    one = lean.jobs[0]
    assert list(one.run.processes) == [1] and list(one.run.results) == [0] and one.run.taken == [False, True]


def test_an_ended_job_that_cannot_be_read_does_not_stop_a_resume(tmp_path: Path) -> None:
    """Its record is not needed to resume; what asks about it later gets what can be read."""
    path = tmp_path / "journal.db"
    _journal(path)
    db = sqlite3.connect(path)
    db.execute("UPDATE jobs SET description = x'c1' WHERE id = 3")  # 0xc1 is never valid msgpack
    db.commit()
    db.close()
    with Store.open(path) as store:
        lean = store.load(ended=False)
        assert [j.id for j in lean.jobs] == ["1", "4"] and lean.ended[JobState.FAILED] == 1
        found = store.job_record("3")
        assert found is not None and found[0] == {} and found[1][1] == "FAILED"
        with pytest.raises(JournalError, match="cannot read"):
            store.load()


@pytest.mark.parametrize("job_id", [2, 4])
def test_a_sequence_number_that_is_no_integer_is_refused_whether_its_job_ended_or_not(
    tmp_path: Path, job_id: int
) -> None:
    path = tmp_path / "journal.db"
    _journal(path)
    db = sqlite3.connect(path)
    db.execute("UPDATE jobs SET seq = 'x' WHERE id = ?", (job_id,))
    db.commit()
    db.close()
    with Store.open(path) as store, pytest.raises(JournalError, match="sequence number 'x' is not an integer"):
        store.load(ended=False)


def test_a_damaged_unfinished_job_still_stops_a_resume(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _journal(path)
    db = sqlite3.connect(path)
    db.execute("UPDATE jobs SET description = x'c1' WHERE id = 4")
    db.commit()
    db.close()
    with Store.open(path) as store, pytest.raises(JournalError, match="job 4"):
        store.load(ended=False)

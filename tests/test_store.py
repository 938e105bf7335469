"""The journal (pilot/store.py): round trips, atomic batches, SIGKILL recovery, hostile files, cost."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from pilot.core.phase import Phase
from pilot.jobs import JobRecord, ProcessResult
from pilot.launchers.base import PlannedProcess
from pilot.lrm.base import Allocation, AllocationState
from pilot.model.job_description import JobDescription, ResourceRequest
from pilot.model.job_state import JobState
from pilot.model.node import NodeConfigured
from pilot.model.process_order import PRE, ProcessOrder
from pilot.scheduler.placement import RankPlacement
from pilot.store import SCHEMA_VERSION, JournalError, Store
from pilot.store_batch import Batch, pack

pytestmark = pytest.mark.timeout(60)


def _desc(i: int = 0) -> JobDescription:
    return JobDescription(
        executable="/bin/echo",
        arguments=["hello", str(i)],
        environment={"A": "1"},
        resources=ResourceRequest(process_count=2),
        custom_attributes={"x": [1, 2]},
        duration=30.0,
    )


def _job(jid: str, description: JobDescription, submitted: float, **fields: Any) -> JobRecord:
    """A job record as the daemon holds it, for Batch.job_update."""
    job = JobRecord(id=jid, description=description, submitted=submitted)
    for name, value in fields.items():
        if name == "phase":
            job.phase = Phase.from_journal(value)
        elif name == "attempt":
            job.run.number = value
        elif name in _ATTEMPT_FIELDS:
            setattr(job.run, name, value)
        else:
            setattr(job, name, value)
    return job


_ATTEMPT_FIELDS = {"ranks", "taken", "processes", "results", "environment", "unset", "started", "ended"}


def _order(job_id: str, slot: int) -> ProcessOrder:
    return ProcessOrder(job_id=job_id, slot=slot, role="rank", executable="/bin/echo", cores=[slot], directory="/tmp")


def test_round_trip_every_record_kind(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    node = NodeConfigured(name="n0", hostname="h0", processors=[0, 1, 2, 3], memory=1 << 30, gpus=[0])
    alloc = Allocation(
        native_id="1234",
        lrm="slurm",
        state=AllocationState.ACTIVE,
        nodes=1,
        expected_nodes=[node],
        submitted=1.0,
        started=2.0,
        walltime=3600.0,
        hosts=["h0"],
        message="",
    )
    ranks = [RankPlacement("n0", [0], [0], 100), RankPlacement("n0", [1], [], 0, behind=True)]
    with Store.open(path) as store:
        with store.batch() as tx:
            tx.job_accepted("1", 1, _desc(1), 10.0)
            tx.job_accepted("2", 2, _desc(2).to_wire(), 11.0)  # the client's wire map works too
            tx.job_accepted("3", 3, _desc(3), 12.0)
            tx.allocation(alloc)
        with store.batch() as tx:
            # A job's outstanding processes are journaled with its row (the daemon's job_update follows
            # each dispatch); a process with its result is not rebuilt.
            p1 = {0: PlannedProcess("n0", _order("1", 0), [0]), 1: PlannedProcess("n0", _order("1", 1), [1])}
            for plan in p1.values():
                tx.process_dispatched("1", plan)
            tx.process_result(
                "1", 0, ProcessResult("n0", "rank", exit_code=0, data={"max_rss": 5, "user_cpu_time": 0.5})
            )
            tx.job_update(
                _job(
                    "1",
                    _desc(1),
                    10.0,
                    state=JobState.ACTIVE,
                    state_time=20.0,
                    phase="ranks",
                    started=20.0,
                    ranks=ranks,
                    processes=p1,
                ),
                placed=True,
            )
            p2 = {PRE: PlannedProcess("n0", _order("2", PRE), [])}
            tx.process_dispatched("2", p2[PRE])
            tx.job_update(
                _job("2", _desc(2), 11.0, state_time=11.0, phase="pre", started=21.0, ranks=ranks[:1], processes=p2),
                placed=True,
            )
            tx.pre_launch_environment("2", {"B": "2"}, ["C"])
            meta = {"wall_duration": 1.5, "nodes": ["n0"], "exit_code": 1, "signal": None}
            j3 = _job("3", _desc(3), 12.0, state=JobState.FAILED, state_time=30.0, phase="done", started=1.0, ended=2.5)
            j3.closing, j3.exit_code, j3.message, j3.metadata = True, 1, "boom", meta
            tx.job_update(j3)
            tx.process_result("3", 0, ProcessResult("n0", "rank", exit_code=1, signal=None, reason="walltime"))
    with Store.open(path) as store:
        rec = store.load()
    assert [j.id for j in rec.jobs] == ["1", "2", "3"]
    assert rec.next_seq == 4
    j1, j2, j3 = rec.jobs
    assert j1.description == _desc(1) and j1.submitted == 10.0
    assert j1.state is JobState.ACTIVE and j1.state_time == 20.0 and j1.phase is Phase.RANKS and j1.run.started == 20.0
    assert j1.run.ranks == ranks
    assert list(j1.run.processes) == [1]  # slot 0 has its result: only slot 1 is outstanding
    assert (
        j1.run.processes[1].order == _order("1", 1)
        and j1.run.processes[1].holds == [1]
        and j1.run.processes[1].node == "n0"
    )
    assert j1.run.results[0].exit_code == 0 and j1.run.results[0].data == {"max_rss": 5, "user_cpu_time": 0.5}
    assert j1.run.taken == [False, True]
    assert j2.description == _desc(2) and j2.phase is Phase.PRE_LAUNCH and j2.run.taken == [True]
    assert j2.run.environment == {"B": "2"} and j2.run.unset == ["C"]
    assert list(j2.run.processes) == [PRE]
    assert j3.state is JobState.FAILED and j3.exit_code == 1 and j3.message == "boom" and j3.metadata == meta
    assert j3.closing and j3.run.ended == 2.5 and j3.run.results[0].reason == "walltime" and j3.run.taken == []
    a = rec.allocation
    assert a is not None
    assert (a.lrm, a.native_id, a.state, a.started, a.walltime, a.hosts) == (
        "slurm",
        "1234",
        AllocationState.ACTIVE,
        2.0,
        3600.0,
        ["h0"],
    )
    assert a.expected_nodes == [node]


def test_empty_journal_loads_empty(tmp_path: Path) -> None:
    with Store.open(tmp_path / "j.db") as store:
        rec = store.load()
    assert rec.jobs == [] and rec.allocation is None and rec.next_seq == 1


def test_batch_that_raises_is_rolled_back(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with Store.open(path) as store:
        with store.batch() as tx:
            tx.job_accepted("1", 1, _desc(), 1.0)
        with pytest.raises(RuntimeError, match="midway"), store.batch() as tx:
            tx.job_accepted("2", 2, _desc(), 2.0)
            tx.job_update(_job("1", _desc(), 1.0, state=JobState.CANCELED, state_time=3.0, message="no"))
            raise RuntimeError("midway")
        # A failure inside SQL (duplicate id) also leaves nothing of its batch.
        with pytest.raises(JournalError), store.batch() as tx:
            tx.job_accepted("3", 3, _desc(), 2.0)
            tx.job_accepted("1", 4, _desc(), 2.0)
        rec = store.load()
    assert [j.id for j in rec.jobs] == ["1"]
    assert rec.jobs[0].state is JobState.QUEUED
    assert rec.next_seq == 2


_CHILD = r"""
import os, sys
from pilot.model.job_description import JobDescription
from pilot.jobs import JobRecord
from pilot.model.job_state import JobState
from pilot.store import Store

store = Store.open(sys.argv[1])
n, per = int(sys.argv[2]), int(sys.argv[3])
seq = 0
for b in range(n):
    with store.batch() as tx:
        for _ in range(per):
            seq += 1
            tx.job_accepted(str(seq), seq, JobDescription(executable="/bin/true"), 1.0)
        if seq > per:
            old = str(seq - per)
            tx.job_update(JobRecord(id=old, description=JobDescription(executable="/bin/true"), state=JobState.ACTIVE))
    print(seq, flush=True)
os.kill(os.getpid(), 9)
"""


def test_recovery_after_sigkill_right_after_commit(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    n, per = 50, 20
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(n), str(per)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    acked = int(proc.stdout.split()[-1])  # what the writer "acknowledged": after the commit returned
    assert acked == n * per
    assert Path(str(path) + "-wal").exists()  # killed: no checkpoint, the commits live in the WAL
    with Store.open(path) as store:
        rec = store.load()
    assert len(rec.jobs) == acked
    assert [j.id for j in rec.jobs] == [str(i) for i in range(1, acked + 1)]
    assert sum(j.state is JobState.ACTIVE for j in rec.jobs) == n - 1
    assert rec.next_seq == acked + 1


def test_file_mode_is_0600(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    path.touch(mode=0o644)
    os.chmod(path, 0o644)
    store = Store.open(path)
    with store.batch() as tx:
        tx.job_accepted("1", 1, _desc(), 1.0)
    for p in (path, Path(str(path) + "-wal")):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    store.close()
    fresh = tmp_path / "fresh.db"
    Store.open(fresh).close()
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600


def test_corrupt_file_gives_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    path.write_bytes(b"this is not a database at all\n" * 200)
    with pytest.raises(JournalError) as err:
        Store.open(path)
    assert str(path) in str(err.value) and "mv " in str(err.value)


def test_damaged_pages_give_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with Store.open(path) as store, store.batch() as tx:
        for i in range(1, 2000):
            tx.job_accepted(str(i), i, _desc(i), 1.0)
    data = bytearray(path.read_bytes())
    data[4096 * 2 : 4096 * 6] = b"\xff" * (4096 * 4)  # trash some b-tree pages, keep the header
    path.write_bytes(bytes(data))
    with pytest.raises(JournalError) as err:
        with Store.open(path) as store:
            store.load()
    assert str(path) in str(err.value)


def test_foreign_database_gives_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE stuff (x)")
    db.commit()
    db.close()
    with pytest.raises(JournalError, match="not a pilot journal") as err:
        Store.open(path)
    assert str(path) in str(err.value)


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    Store.open(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(JournalError, match="newer pilot") as err:
        Store.open(path)
    assert str(path) in str(err.value)


def test_second_owner_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with Store.open(path):
        with pytest.raises(JournalError, match="in use by another process"):
            Store.open(path)


def test_unreadable_record_gives_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with Store.open(path) as store, store.batch() as tx:
        tx.job_accepted("1", 1, _desc(), 1.0)
    db = sqlite3.connect(path)
    db.execute("UPDATE jobs SET description = x'c1'")  # 0xc1 is never valid msgpack
    db.commit()
    db.close()
    with pytest.raises(JournalError, match="cannot read") as err:
        with Store.open(path) as store:
            store.load()
    assert str(path) in str(err.value)


def test_explicit_commit_of_a_kept_batch(tmp_path: Path) -> None:
    """The daemon's way: a Batch filled while handling messages, committed at the start of the flush."""
    with Store.open(tmp_path / "j.db") as store:
        tx = Batch()
        store.commit(tx)  # an empty batch writes nothing
        tx.job_accepted("7", 7, _desc(), 1.0)
        tx.job_update(_job("7", _desc(), 1.0, state=JobState.CANCELED, state_time=2.0, message="canceled while queued"))
        store.commit(tx)
        rec = store.load()
    assert [(j.id, j.state, j.message) for j in rec.jobs] == [("7", JobState.CANCELED, "canceled while queued")]
    assert rec.next_seq == 8


def test_batches_do_not_nest(tmp_path: Path) -> None:
    with Store.open(tmp_path / "j.db") as store, store.batch():
        with pytest.raises(RuntimeError, match="nest"), store.batch():
            pass


def test_job_accepted_and_changed_in_one_batch(tmp_path: Path) -> None:
    """A job placed, ended or requeued in the batch that accepted it (one row written, not a row then an
    update) loads with its latest state; the next sequence number comes from the rows."""
    ranks = [RankPlacement("n0", [0], [], 0)]
    with Store.open(tmp_path / "j.db") as store:
        with store.batch() as tx:
            tx.job_accepted("1", 1, _desc(1), 1.0)
            tx.job_accepted("2", 2, _desc(2), 1.0)
            tx.job_accepted("3", 3, _desc(3), 1.0)
            p1 = {0: PlannedProcess("n0", _order("1", 0), [0])}
            tx.process_dispatched("1", p1[0])
            j1 = _job("1", _desc(1), 1.0, phase="ranks", ranks=ranks, processes=p1)
            tx.job_update(j1, placed=True)
            started = {"state": JobState.ACTIVE, "state_time": 2.0, "phase": "ranks", "started": 2.0}
            tx.job_update(_job("1", _desc(1), 1.0, **started, processes=p1))
            j2 = _job("2", _desc(2), 1.0, phase="ranks", ranks=ranks)
            tx.job_update(j2, placed=True)
            tx.job_requeued("2")
            tx.job_update(_job("2", _desc(2), 1.0, phase="queued", attempt=1))
            meta = {"exit_code": 0}
            j3 = _job("3", _desc(3), 1.0, state=JobState.COMPLETED, state_time=3.0, phase="done", exit_code=0)
            j3.metadata = meta
            tx.job_update(j3)
        rec = store.load()
    j1, j2, j3 = rec.jobs
    assert (j1.state, j1.state_time, j1.phase, j1.run.started, j1.run.ranks) == (
        JobState.ACTIVE,
        2.0,
        Phase.RANKS,
        2.0,
        ranks,
    )
    assert list(j1.run.processes) == [0] and j1.run.taken == [True]
    assert (j2.phase, j2.run.number, list(j2.run.ranks), dict(j2.run.processes)) == (Phase.QUEUED, 1, [], {})
    assert (j3.state, j3.exit_code, j3.metadata, j3.description) == (JobState.COMPLETED, 0, meta, _desc(3))
    assert rec.next_seq == 4


def test_a_requeue_forgets_only_the_attempts_before_it_in_the_batch(tmp_path: Path) -> None:
    """Requeued in the middle of a batch (and again, for job 2): what its earlier attempts wrote into the
    batch (processes, results, the pre_launch environment, its placement) is forgotten, what came after
    the last requeue is kept, and other jobs' rows between them are untouched."""
    ranks = [RankPlacement("n0", [0], [], 0)]
    moved = [RankPlacement("n1", [1], [], 0)]
    with Store.open(tmp_path / "j.db") as store:
        with store.batch() as tx:
            for i in (1, 2, 3):
                tx.job_accepted(str(i), i, _desc(i), 1.0)
        with store.batch() as tx:
            for jid in ("1", "2", "3"):
                first = {0: PlannedProcess("n0", _order(jid, 0), [0])}
                tx.process_dispatched(jid, first[0])
                tx.job_update(_job(jid, _desc(int(jid)), 1.0, phase="ranks", ranks=ranks, processes=first), placed=True)
                tx.pre_launch_environment(jid, {"OLD": jid}, [])
            tx.process_result("1", 1, ProcessResult("n0", "rank", exit_code=3))
            tx.job_requeued("1")
            again = {0: PlannedProcess("n1", _order("1", 0), [0])}
            tx.process_dispatched("1", again[0])  # right at the requeue
            tx.job_requeued("2")
            tx.process_result("3", 1, ProcessResult("n0", "rank", exit_code=0))  # another job's, kept
            second = {0: PlannedProcess("n0", _order("2", 0), [0])}
            tx.process_dispatched("2", second[0])
            tx.job_update(
                _job("2", _desc(2), 1.0, phase="ranks", ranks=ranks, attempt=1, processes=second), placed=True
            )
            tx.job_requeued("2")
            tx.job_update(_job("1", _desc(1), 1.0, phase="ranks", ranks=moved, attempt=1, processes=again), placed=True)
            tx.process_result("1", 2, ProcessResult("n1", "rank", exit_code=0))
            tx.job_update(_job("2", _desc(2), 1.0, phase="queued", attempt=2))
        j1, j2, j3 = store.load().jobs
    assert (j1.run.number, j1.run.ranks, j1.run.environment) == (1, moved, None)
    assert {s: p.node for s, p in j1.run.processes.items()} == {0: "n1"} and list(j1.run.results) == [2]
    assert (j2.phase, j2.run.number, list(j2.run.ranks), dict(j2.run.processes), j2.run.results) == (
        Phase.QUEUED,
        2,
        [],
        {},
        {},
    )
    assert (j3.run.ranks, list(j3.run.processes), list(j3.run.results), j3.run.environment) == (
        ranks,
        [0],
        [1],
        {"OLD": "3"},
    )


def test_a_job_updated_twice_in_one_batch_loads_as_its_last_update_says(tmp_path: Path) -> None:
    """A batch kept open over several flushes (a journal that could not be written) holds more than one
    update of a job, of any row shape (with or without a message, cancel reason, start or placement):
    they are written in the order they came, and the last one decides; a placement written earlier
    stays, unless the job was requeued since."""
    ranks = [RankPlacement("n0", [0], [], 0)]
    moved = [RankPlacement("n0", [1], [], 0)]
    with Store.open(tmp_path / "j.db") as store:
        with store.batch() as tx:
            for i in (1, 2, 3, 4):
                tx.job_accepted(str(i), i, _desc(i), 1.0)
                tx.job_update(_job(str(i), _desc(i), 1.0, phase="ranks", ranks=ranks), placed=True)
        with store.batch() as tx:
            tx.job_update(_job("1", _desc(1), 1.0, state=JobState.ACTIVE, state_time=2.0, phase="ranks", started=2.0))
            done = {"state": JobState.CANCELED, "state_time": 3.0, "phase": "done", "started": 2.0}
            tx.job_update(_job("1", _desc(1), 1.0, **done, message="stopped", cancel_reason="canceled by its user"))
            tx.job_update(_job("2", _desc(2), 1.0, state=JobState.ACTIVE, phase="ranks", cancel_reason="asked"))
            tx.job_update(_job("2", _desc(2), 1.0, state=JobState.COMPLETED, state_time=4.0, phase="done", exit_code=0))
            tx.job_update(_job("3", _desc(3), 1.0, phase="ranks", ranks=moved), placed=True)
            tx.job_update(_job("3", _desc(3), 1.0, state=JobState.ACTIVE, state_time=5.0, phase="ranks", started=5.0))
            tx.job_update(_job("4", _desc(4), 1.0, phase="ranks", ranks=moved), placed=True)
            tx.job_requeued("4")
            tx.job_update(_job("4", _desc(4), 1.0, phase="queued", attempt=1))
        j1, j2, j3, j4 = store.load().jobs
    assert (j1.state, j1.state_time, j1.message, j1.cancel_reason, j1.run.started, j1.run.ranks) == (
        JobState.CANCELED,
        3.0,
        "stopped",
        "canceled by its user",
        2.0,
        ranks,
    )
    assert (j2.state, j2.exit_code, j2.message, j2.cancel_reason, j2.run.ranks) == (
        JobState.COMPLETED,
        0,
        None,
        None,
        ranks,
    )
    assert (j3.state, j3.state_time, j3.run.started, j3.run.ranks) == (JobState.ACTIVE, 5.0, 5.0, moved)
    assert (j4.phase, j4.run.number, list(j4.run.ranks)) == (Phase.QUEUED, 1, [])


def test_submit_ids_are_found_whatever_the_batch_did_to_the_row(tmp_path: Path) -> None:
    """A job's submit id survives being placed, requeued and ended in the batch that accepted it, and in
        later batches; jobs_by_submit_id finds each (every job under a submit id used twice, as a document's
    jobs share one, in the order they were accepted), and no other."""
    ranks = [RankPlacement("n0", [0], [], 0)]
    with Store.open(tmp_path / "j.db") as store:
        with store.batch() as tx:
            tx.job_accepted("1", 1, _desc(1), 1.0, submit_id="k-placed")
            tx.job_accepted("2", 2, _desc(2), 1.0, submit_id="k-requeued")
            tx.job_accepted("3", 3, _desc(3), 1.0)
            tx.job_update(_job("1", _desc(1), 1.0, phase="ranks", ranks=ranks), placed=True)
            tx.job_update(_job("2", _desc(2), 1.0, phase="ranks", ranks=ranks), placed=True)
            tx.job_requeued("2")
        with store.batch() as tx:
            tx.job_accepted("4", 4, _desc(4), 1.0, submit_id="k-placed")  # a client that used one twice
            tx.job_update(_job("1", _desc(1), 1.0, state=JobState.COMPLETED, phase="done"))
        submit_ids = [f"other-{i}" for i in range(1200)] + ["k-placed", "k-requeued"]  # over one statement's worth
        assert store.jobs_by_submit_id(submit_ids) == {"k-placed": ["1", "4"], "k-requeued": ["2"]}
        assert store.jobs_by_submit_id([]) == {}
        assert [j.id for j in store.load().jobs] == ["1", "2", "3", "4"]


def test_a_schema_2_journal_gains_submit_ids(tmp_path: Path) -> None:
    """A journal written before submit ids (schema 2) opens, keeps its jobs, and takes ones with submit ids."""
    path = tmp_path / "j.db"
    with Store.open(path) as store:
        with store.batch() as tx:
            tx.job_accepted("1", 1, _desc(1), 1.0)
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = DELETE")
    db.execute("DROP INDEX jobs_submit_id")
    db.execute("ALTER TABLE jobs DROP COLUMN submit_id")
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    with Store.open(path) as store:
        assert [j.id for j in store.load().jobs] == ["1"]
        with store.batch() as tx:
            tx.job_accepted("2", 2, _desc(2), 1.0, submit_id="k")
        assert store.jobs_by_submit_id(["k"]) == {"k": ["2"]}
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert _submit_id_schema(db) == (["submit_id"], ["jobs_submit_id"])
    db.close()


def test_a_schema_3_journal_keeps_its_jobs_submit_ids_under_the_new_name(tmp_path: Path) -> None:
    """A journal of schema 3 named the submit id column ``key`` (index ``jobs_key``): it opens with both
    renamed, its jobs found by their submit ids, and takes new ones."""
    path = tmp_path / "j.db"
    with Store.open(path) as store:
        with store.batch() as tx:
            tx.job_accepted("1", 1, _desc(1), 1.0, submit_id="k-1")
            tx.job_accepted("2", 2, _desc(2), 1.0)
            tx.job_accepted("3", 3, _desc(3), 1.0, submit_id="k-3")
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = DELETE")
    db.execute("DROP INDEX jobs_submit_id")
    db.execute("ALTER TABLE jobs RENAME COLUMN submit_id TO key")
    db.execute("CREATE INDEX jobs_key ON jobs (key) WHERE key IS NOT NULL")  # as schema 3 had it
    db.execute("PRAGMA user_version = 3")
    db.commit()
    assert _submit_id_schema(db) == (["key"], ["jobs_key"])
    db.close()
    with Store.open(path) as store:
        assert [j.id for j in store.load().jobs] == ["1", "2", "3"]
        assert store.jobs_by_submit_id(["k-1", "k-2", "k-3"]) == {"k-1": ["1"], "k-3": ["3"]}
        with store.batch() as tx:
            tx.job_accepted("4", 4, _desc(4), 1.0, submit_id="k-4")
        assert store.jobs_by_submit_id(["k-4"]) == {"k-4": ["4"]}
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert _submit_id_schema(db) == (["submit_id"], ["jobs_submit_id"])
    db.close()


def _schema_5_journal(path: Path, ids: list[str]) -> None:
    """A journal as schema 5 wrote it: job ids as the text key of the jobs table (an index of their own)."""
    from pilot.store import _SCHEMA, APPLICATION_ID

    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(_SCHEMA.replace("id INTEGER PRIMARY KEY,", "id TEXT PRIMARY KEY,", 1))
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute("PRAGMA user_version = 5")
    tx = Batch()
    for i, job_id in enumerate(ids, start=1):
        tx.job_accepted(job_id, i, _desc(i), float(i), submit_id=f"k-{job_id}")
    tx.job_update(_job(ids[0], _desc(1), 1.0, state=JobState.COMPLETED, phase="done", exit_code=0))
    db.execute("BEGIN")
    tx.write(db)
    db.execute("COMMIT")
    db.close()


def test_a_schema_5_journal_keys_its_jobs_by_number(tmp_path: Path) -> None:
    """Schema 5 kept job ids as text: the journal opens with the jobs table rebuilt around the id as its
    integer key (no index of text ids left), every job, its state and submit id kept, found by id as
    before ("007" is no job's id), and new jobs follow in order."""
    path = tmp_path / "j.db"
    _schema_5_journal(path, ["1", "2", "9", "10", "11"])
    with Store.open(path) as store:
        jobs = store.load().jobs
        assert [j.id for j in jobs] == ["1", "2", "9", "10", "11"]
        assert (jobs[0].state, jobs[0].exit_code) == (JobState.COMPLETED, 0)
        assert store.jobs_by_submit_id(["k-10", "k-2"]) == {"k-10": ["10"], "k-2": ["2"]}
        found = store.job_record("10")
        assert found is not None and found[1][:2] == ["10", "QUEUED"]
        assert store.job_record("010") is None and store.job_record("x") is None
        with store.batch() as tx:
            tx.job_accepted("12", 12, _desc(12), 12.0)
        assert store.load().id_ranges == [[1, 2], [9, 12]]
        assert [row[0] for row in store.job_rows()] == ["1", "2", "9", "10", "11", "12"]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    id_column = [row for row in db.execute("PRAGMA table_info(jobs)") if row[1] == "id"]
    assert [(row[2], row[5]) for row in id_column] == [("INTEGER", 1)]  # the table's key
    assert [row[1] for row in db.execute("PRAGMA index_list(jobs)")] == ["jobs_submit_id"]
    assert db.execute("SELECT typeof(id) FROM jobs GROUP BY 1").fetchall() == [("integer",)]
    db.close()


def test_a_schema_5_journal_with_a_job_id_that_is_no_number_is_refused(tmp_path: Path) -> None:
    """No pilot wrote one, but a journal is hostile input: a text id is refused as damage, and the file
    is left as it was (the rebuild is rolled back)."""
    path = tmp_path / "j.db"
    _schema_5_journal(path, ["1", "x7"])
    with pytest.raises(JournalError, match="'x7' is not a job number"):
        Store.open(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 5
    assert db.execute("SELECT id FROM jobs ORDER BY seq").fetchall() == [("1",), ("x7",)]
    db.close()


def _submit_id_schema(db: sqlite3.Connection) -> tuple[list[str], list[str]]:
    """The jobs table's submit id column and its index, under whichever names the journal has them."""
    columns = [row[1] for row in db.execute("PRAGMA table_info(jobs)") if row[1] in ("key", "submit_id")]
    indexes = [row[1] for row in db.execute("PRAGMA index_list(jobs)") if not row[1].startswith("sqlite_autoindex")]
    return columns, indexes


def test_next_seq_of_an_older_journal_is_kept(tmp_path: Path) -> None:
    """A journal written when the next sequence number had its own row (meta 'seq') still gives it."""
    with Store.open(tmp_path / "j.db") as store:
        with store.batch() as tx:
            tx.job_accepted("1", 1, _desc(1), 1.0)
    db = sqlite3.connect(tmp_path / "j.db")
    db.execute("INSERT INTO meta (key, value) VALUES ('seq', 9)")  # as the earlier pilot wrote it
    db.commit()
    db.close()
    with Store.open(tmp_path / "j.db") as store:
        assert store.load().next_seq == 10


def _fill(store: Store, first: int, count: int) -> None:
    """``count`` commits of one accepted job each (a big description: a few pages of WAL per commit)."""
    big = JobDescription(executable="/bin/echo", arguments=["x" * 6000])
    for i in range(first, first + count):
        tx = Batch()
        tx.job_accepted(str(i), i, big, 1.0)
        store.commit(tx)


def test_commits_do_not_checkpoint_when_the_owner_does(tmp_path: Path) -> None:
    """``auto_checkpoint=False`` (the daemon's journal): no commit copies the WAL into the journal file, so
    none waits for a checkpoint's fsyncs; checkpoint_due() says when the WAL outgrew its limit, and
    checkpoint() -- from another thread, as the daemon runs it -- empties it. Nothing is lost."""
    path = tmp_path / "journal.db"
    wal = Path(f"{path}-wal")
    store = Store.open(path, auto_checkpoint=False, checkpoint_bytes=1 << 20)
    base = path.stat().st_size
    due_at = []
    for k in range(100):  # 1,000 commits of ~8 KiB of WAL each: twice SQLite's own 4 MiB threshold
        _fill(store, 1 + 10 * k, 10)
        if store.checkpoint_due():
            due_at.append(wal.stat().st_size)
    assert wal.stat().st_size > 6 << 20  # SQLite's auto-checkpoint would have reset it at 4 MiB
    assert path.stat().st_size == base  # and nothing reached the journal file
    assert due_at and all(size >= 1 << 20 for size in due_at)
    assert due_at[0] < 2 << 20  # said soon after the limit, not much later
    done: list[BaseException | None] = []

    def run() -> None:
        try:
            store.checkpoint()
            done.append(None)
        except BaseException as exc:
            done.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert done == [None]
    assert wal.stat().st_size == 0 and path.stat().st_size > 6 << 20
    assert not store.checkpoint_due()
    _fill(store, 1001, 5)  # the emptied WAL takes commits again
    store.close()
    with Store.open(path) as again:
        assert [j.id for j in again.load().jobs] == [str(i) for i in range(1, 1006)]


def test_default_store_checkpoints_by_itself(tmp_path: Path) -> None:
    """Without an owner that checkpoints (tools, tests, the default): SQLite's own bound on the WAL holds."""
    path = tmp_path / "journal.db"
    with Store.open(path) as store:
        _fill(store, 1, 1000)
        assert Path(f"{path}-wal").stat().st_size < 5 << 20
        assert path.stat().st_size > 4 << 20


def test_a_schema_6_journal_moves_its_outstanding_orders_into_their_jobs(tmp_path: Path) -> None:
    """Schema 6 kept every dispatched order as a row of a processes table, also after its job ended:
    opened, the journal holds the unfinished jobs' outstanding orders in their rows (one with a result
    is not), as sent, and no such table; the ended job keeps none."""
    path = tmp_path / "j.db"
    two = [RankPlacement("n0", [0], [], 0), RankPlacement("n0", [1], [], 0)]
    with Store.open(path) as store:
        with store.batch() as tx:
            for i in (1, 2, 3):
                tx.job_accepted(str(i), i, _desc(i), 1.0)
        with store.batch() as tx:
            tx.job_update(_job("1", _desc(1), 1.0, state=JobState.ACTIVE, phase="ranks", ranks=two), placed=True)
            tx.process_result("1", 0, ProcessResult("n0", "rank", exit_code=0))
            tx.job_update(_job("3", _desc(3), 1.0, state=JobState.COMPLETED, phase="done", exit_code=0))
    orders = {(j, s): pack(_order(j, s).to_wire()) for j, s in (("1", 0), ("1", 1), ("3", 0))}
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE processes (job_id TEXT NOT NULL, slot INTEGER NOT NULL, node TEXT NOT NULL, "
        "order_wire BLOB NOT NULL, holds BLOB NOT NULL, PRIMARY KEY (job_id, slot)) WITHOUT ROWID"
    )
    rows = [(j, s, "n0", o, pack([s])) for (j, s), o in orders.items()]
    db.executemany("INSERT INTO processes VALUES (?, ?, ?, ?, ?)", rows)
    db.execute("ALTER TABLE jobs DROP COLUMN orders")
    db.execute("PRAGMA user_version = 6")
    db.commit()
    db.close()
    with Store.open(path) as store:
        j1, j2, j3 = store.load().jobs
    assert list(j1.run.processes) == [1] and list(j1.run.results) == [0]
    plan = j1.run.processes[1]
    assert (plan.node, plan.order, plan.holds, plan.packed) == ("n0", _order("1", 1), [1], orders[("1", 1)])
    assert not j2.run.processes and not j3.run.processes
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7
    assert not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'processes'").fetchall()
    assert [r[0] for r in db.execute("SELECT id FROM jobs WHERE orders IS NOT NULL")] == [1]
    db.close()

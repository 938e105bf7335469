"""'pilot jobs' and LIST against a core on a real journal: jobs in memory (running, behind a core,
queued) and ended ones only the journal holds, before and after a restart.

``views.jobs`` with a limit builds rows only for the last ``limit`` matching jobs in memory and reads
the journal for ended jobs only; what it answers must be exactly the tail of the unlimited answer."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from core_env import CoreEnv, true

from pilot import views
from pilot.core import reactor
from pilot.core.reactor import Core
from pilot.model.job_state import JobState
from pilot.store import Store

pytestmark = pytest.mark.timeout(60)

FILTERS: list[dict[str, Any]] = [
    {},
    {"states": ("QUEUED",)},
    {"states": ("COMPLETED", "FAILED")},
    {"states": ("ACTIVE", "COMPLETED")},
    {"name": "odd-*"},
    {"name": "even-*", "states": ("QUEUED", "FAILED")},
    {"since": 0.0},
]


def _mixed(tmp_path: Path) -> tuple[CoreEnv, Path]:
    """40 jobs on 2 cores: 16 ended (some FAILED), 2 running, 2 behind a core, the rest queued."""
    path = tmp_path / "journal.db"
    env = CoreEnv(cores=2, store=Store.open(path), pilot={"backlog": 1})
    env.register("n0")
    ids = env.submit(  # jobs 1-20 of run "a", 21-40 of run "b"
        *(
            true(name=f"{'odd' if i % 2 else 'even'}-{i}", custom_attributes={"pilot.run": "b" if i >= 20 else "a"})
            for i in range(40)
        )
    )
    env.step()
    book = env.core.book
    for job_id in ids[:18]:
        assert book.jobs[job_id].run.processes, f"job {job_id} was not placed"
        env.started("n0", job_id)
        if int(job_id) <= 16:  # 16 end (every third FAILED); 17 and 18 run on
            env.exited("n0", job_id, code=1 if int(job_id) % 3 == 0 else 0)
        env.step()
    return env, path


def _check(core: Core, truth: dict[str, str]) -> None:
    for filters, limit in itertools.product(FILTERS, (1, 3, 7, 100)):
        full = views.jobs(core, **filters)
        assert full["left_out"] == 0
        wanted = set(filters.get("states", ())) or None
        if "name" not in filters:
            expect = [i for i, state in truth.items() if wanted is None or state in wanted]
            assert [r["id"] for r in full["jobs"]] == expect, filters
        cut = views.jobs(core, limit=limit, **filters)
        assert cut["jobs"] == full["jobs"][-limit:], (filters, limit)
        left = len(full["jobs"]) - len(cut["jobs"])
        assert cut["left_out"] in (left, None), (filters, limit)
        assert cut["left_out"] is not None or left > 0


def test_the_last_rows_are_those_of_the_whole_answer_in_memory_and_from_the_journal(tmp_path: Path) -> None:
    env, path = _mixed(tmp_path)
    book = env.core.book
    truth = {}  # id -> state, in id order
    for job_id in map(str, range(1, 41)):
        job = book.jobs.get(job_id)
        found = env.store.job_status(job_id) if job is None and env.store is not None else None
        truth[job_id] = job.state.value if job is not None else found[0][1] if found is not None else "?"
    states = set(truth.values())
    assert {"QUEUED", "ACTIVE", "COMPLETED", "FAILED"} <= states, states
    assert sum(1 for j in truth if j not in book.jobs) >= 10  # ended: only the journal holds them
    _check(env.core, truth)
    assert book.ids.ranges() == [[1, 40]]

    again = env.restarted(path)
    _check(again.core, truth)
    assert again.core.book.ids.ranges() == [[1, 40]]


def test_jobs_of_leased_ids_accepted_out_of_their_order_are_cut_by_id(tmp_path: Path) -> None:
    """Two clients' leased blocks: the later block's jobs come first, so memory holds them out of id
    order; the last rows are still the greatest ids, and LIST's runs have the unused ids as holes."""
    path = tmp_path / "journal.db"
    env = CoreEnv(cores=1, store=Store.open(path))  # no agent: every job stays queued
    core = env.core
    a = core.on_lease(5)
    b = core.on_lease(5)
    assert (a["first"], b["first"]) == (1, 6)
    for job_id in (7, 8, 9, 1, 2, 3):  # b's first, then a's; 4, 5, 6 and 10 never used
        (result,) = core.on_submit(b"c", [true(name=f"j{job_id}").to_wire()], [str(job_id)])
        assert result.get("id") == str(job_id), result
    env.step()
    assert list(core.book.jobs) == ["7", "8", "9", "1", "2", "3"]
    for limit, ids in ((1, ["9"]), (2, ["8", "9"]), (4, ["3", "7", "8", "9"]), (9, ["1", "2", "3", "7", "8", "9"])):
        cut = views.jobs(core, limit=limit)
        assert [r["id"] for r in cut["jobs"]] == ids
        assert cut["left_out"] == 6 - len(ids)
    assert [r["id"] for r in views.jobs(core, limit=2, name="j[12]")["jobs"]] == ["1", "2"]
    assert core.book.ids.ranges() == [[1, 3], [7, 9]]
    assert env.restarted(path).core.book.ids.ranges() == [[1, 3], [7, 9]]


def test_cancel_where_cancels_the_unfinished_jobs_of_a_state_and_run_and_names_them_in_runs(tmp_path: Path) -> None:
    env, _ = _mixed(tmp_path)
    core = env.core
    assert core.on_cancel_where(("DONE",), None) == {
        "error": "unknown state 'DONE'; use one of " + ", ".join(s.value for s in JobState)
    }
    assert core.on_cancel_where(("QUEUED",), "b") == {"canceled": {"QUEUED": [[21, 40]]}}
    env.step()
    assert all(env.state(str(i)) is JobState.CANCELED for i in range(21, 41))
    assert core.on_cancel_where(("QUEUED",), "b") == {"canceled": {}}  # (ended: nothing more to cancel)
    everything = core.on_cancel_where((), "a")
    assert everything == {"canceled": {"ACTIVE": [[17, 18]], "QUEUED": [[19, 20]]}}
    step = env.step()  # running or waiting at the agent behind a core: their orders are killed
    assert sorted(ref[0] for refs in step.kills("n0").values() for ref in refs) == ["17", "18", "19", "20"]
    assert core.on_cancel_where((), "a") == {"canceled": {}}  # asked already: not asked twice
    for job_id in ("17", "18"):
        env.exited("n0", job_id, code=-15)
    env.step()
    assert [env.state(i) for i in ("17", "18")] == [JobState.CANCELED] * 2


def _state(env: CoreEnv, job_id: str) -> JobState:
    """A job's state: in memory, or from the journal once it has left."""
    job = env.core.book.jobs.get(job_id)
    found = env.store.job_status(job_id) if job is None and env.store is not None else None
    return job.state if job is not None else JobState(found[0][1]) if found is not None else JobState.NEW


def test_a_mass_cancel_ends_its_jobs_a_bounded_number_per_step_and_none_is_placed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queued jobs a CANCEL_WHERE picked end over several steps (the daemon's turns stay short); none
    of them is placed meanwhile, also when cores come free, and a restart in the middle ends the rest."""
    monkeypatch.setattr(reactor, "CANCELS_PER_STEP", 8)
    path = tmp_path / "journal.db"
    env = CoreEnv(cores=2, store=Store.open(path))
    ids = env.submit(*(true() for _ in range(40)))
    env.step()
    assert env.core.on_cancel_where(("QUEUED",), None) == {"canceled": {"QUEUED": [[1, 40]]}}
    step = env.step()
    assert [_state(env, i) for i in ids].count(JobState.CANCELED) == 8
    # Journaled: the 8 ended jobs' rows and the 40 ids as one run, not a row per canceled job.
    assert step.journal.rows == 8 + 1
    assert env.store is not None and env.store.load().meta["canceling"] == [[1, 40]]
    step = env.register("n0")  # cores come free: nothing of the canceled is placed
    assert not step.orders("n0")
    assert [_state(env, i) for i in ids].count(JobState.CANCELED) == 16
    (later,) = env.submit(true())  # a job submitted after the cancel runs, ahead of the rest's ending
    step = env.step()
    assert [o["job_id"] for o in step.orders("n0")] == [later]

    again = env.restarted(path)  # the 16 not yet ended were journaled as canceled (its first step ends 8)
    book = again.core.book
    pending = [i for i in ids if i in book.jobs and not book.jobs[i].final]
    assert len(pending) == 8 and all(book.jobs[i].cancel_reason == "canceled" for i in pending)
    step = again.register("n0", running=[[later, 0]])
    for _ in range(3):
        assert later not in {o["job_id"] for o in step.orders("n0")} and not step.orders("n0")
        step = again.step()
    assert all(_state(again, i) is JobState.CANCELED for i in pending)
    assert again.store is not None and again.store.load().meta["canceling"] == []  # all ended
    assert not [j for j in book.jobs.values() if not j.final and j.id != later]


def test_a_pilot_stopping_ends_the_jobs_a_mass_cancel_left_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reactor, "CANCELS_PER_STEP", 8)
    env = CoreEnv(cores=2, store=Store.open(tmp_path / "journal.db"))
    ids = env.submit(*(true() for _ in range(40)))
    env.step()
    env.core.on_cancel_where((), None)
    env.step()
    assert len(env.core.book.canceling) == 32
    env.core.cancel_all("pilot stopped")
    assert not env.core.book.canceling and env.core.settled()
    env.step()
    assert all(_state(env, i) is JobState.CANCELED for i in ids)


def _ended_out_of_order(tmp_path: Path) -> tuple[CoreEnv, Path, list[str]]:
    """6 jobs on 6 cores and 30 queued behind them (no backlog): the 6 end in the order 4, 1, 6, 2, 5,
    3 (job 3 FAILED), a second apart, each in a step of its own; returns the ids in the order they ended."""
    path = tmp_path / "journal.db"
    env = CoreEnv(cores=6, store=Store.open(path), pilot={"backlog": 0})
    env.register("n0")
    ids = env.submit(*(true(name=f"j{i}") for i in range(36)))
    env.step()
    for job_id in ids[:6]:
        env.started("n0", job_id)
    env.step()
    order = [ids[i] for i in (3, 0, 5, 1, 4, 2)]
    for job_id in order:
        env.advance(1.0)
        env.exited("n0", job_id, code=1 if job_id == ids[2] else 0)
        env.step()
    return env, path, order


def test_latest_names_the_last_jobs_to_end_in_the_order_they_ended_whatever_the_queue(tmp_path: Path) -> None:
    """'pilot top' asks for the latest ends: by end, not by id (the last submitted of the ended jobs),
    from memory without reading past the queued jobs' rows, and from the journal alone once a restart
    has left memory without them -- the same answer either way."""
    env, path, order = _ended_out_of_order(tmp_path)
    core = env.core
    assert env.core.book.counts[JobState.QUEUED] >= 24  # queued behind them, the newest ids

    def latest(core: Core, **kw: Any) -> dict[str, Any]:
        return views.jobs(core, latest=True, **kw)

    got = latest(core, states=("COMPLETED", "FAILED", "CANCELED"), limit=4)
    assert [r["id"] for r in got["jobs"]] == order[-4:]
    assert got["left_out"] == 2
    assert [r["id"] for r in views.jobs(core, states=("COMPLETED", "FAILED"), limit=4)["jobs"]] == ["3", "4", "5", "6"]
    assert [r["id"] for r in latest(core, limit=10)["jobs"]] == order  # (no states: every final one)
    failed = latest(core, states=("FAILED",), limit=5)
    assert [(r["id"], r["state"], r["exit_code"]) for r in failed["jobs"]] == [(order[-1], "FAILED", 1)]
    assert failed["left_out"] == 0
    assert latest(core, states=("CANCELED",), limit=5) == {"jobs": [], "left_out": 0}
    assert [r["id"] for r in latest(core, states=("COMPLETED",), limit=2, name="j*")["jobs"]] == order[-3:-1]
    # A job that ended in this very step (its row not committed yet) is among them.
    env.advance(1.0)
    for job_id in ("7", "8"):
        env.started("n0", job_id)
    env.exited("n0", "8")
    assert [r["id"] for r in latest(core, limit=2)["jobs"]] == [order[-1], "8"]
    assert [r["id"] for r in latest(core, limit=2, name="j*")["jobs"]] == [order[-1], "8"]  # (the journal's way)
    env.step()

    again = env.restarted(path)  # memory of ends is gone: the journal answers, by end
    assert again.core.book.latest_ended([JobState.COMPLETED], 3) is None
    after = latest(again.core, states=("COMPLETED", "FAILED"), limit=3)
    assert [r["id"] for r in after["jobs"]] == [order[-2], order[-1], "8"]
    assert after["left_out"] is None  # (earlier ones exist: the journal is not read to count them)


def test_latest_asks_for_ended_jobs_and_a_limit() -> None:
    from pilot.wire import ProtocolError
    from pilot.wire.messages import Jobs

    assert Jobs.from_body({"rid": 1, "states": ["FAILED"], "limit": 5, "latest": True}).latest
    for body in (
        {"rid": 1, "states": ["FAILED"], "latest": True},
        {"rid": 1, "states": ["QUEUED", "FAILED"], "limit": 5, "latest": True},
        {"rid": 1, "limit": 5, "latest": 1},
    ):
        with pytest.raises(ProtocolError):
            Jobs.from_body(body)

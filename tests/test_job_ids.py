"""The job ids LIST answers (pilot/job_ids.py): kept as runs as jobs are accepted, read back as runs
from a real journal after a restart, and checked when a client reads them off the wire."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_store import _desc

from pilot import job_ids
from pilot.job_ids import JobIds
from pilot.store import JournalError, Store

pytestmark = pytest.mark.timeout(120)

_ids = st.lists(st.integers(1, 300), max_size=200)


def _runs(ids: set[int]) -> list[list[int]]:
    """The runs of ``ids``, the slow and obvious way."""
    out: list[list[int]] = []
    for i in sorted(ids):
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


@given(_ids, _ids)
@settings(max_examples=300, deadline=None)
def test_the_runs_hold_exactly_the_ids_added_in_any_order(before: list[int], after: list[int]) -> None:
    kept = JobIds(_runs(set(before)))
    for i in after:
        kept.add(i)
    want = set(before) | set(after)
    assert kept.ranges() == _runs(want)
    assert len(kept) == len(want)
    assert all(i in kept for i in want) and not any(i in kept for i in set(range(0, 302)) - want)
    assert job_ids.expand(kept.ranges()) == [str(i) for i in sorted(want)]


@given(st.sets(st.integers(1, 400), max_size=250))
@settings(max_examples=60, deadline=None)
def test_a_journal_gives_back_the_runs_of_its_job_ids(tmp_path_factory: pytest.TempPathFactory, ids: set[int]) -> None:
    """Through ``Store.load``, as a restarted daemon reads them: one run by two lookups, holes by a scan."""
    path = tmp_path_factory.mktemp("j") / "journal.db"
    with Store.open(path) as store:
        with store.batch() as tx:
            for i in sorted(ids):
                tx.job_accepted(str(i), i, _desc(i), float(i))
        assert store.load().id_ranges == store.load(ended=False).id_ranges == _runs(ids)


def _table(ids: set[int]) -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY)")
    db.executemany("INSERT INTO jobs VALUES (?)", ((i,) for i in ids))
    return db


@given(st.lists(st.lists(st.integers(1, 200), max_size=30), max_size=8))
@settings(max_examples=300, deadline=None)
def test_the_journaled_runs_give_every_run_back_without_a_scan(commits: list[list[int]]) -> None:
    """Ids accepted over several commits, the runs journaled at each commit where they changed (as
    ``JobBook.seal`` does): the last runs journaled and one lookup per run give the runs exactly,
    with no scan of the table (which would hide a change the journal missed)."""
    kept = JobIds()
    value = None
    for ids in commits:
        for i in ids:
            kept.add(i)
        if kept.changed:
            value = kept.journal_value()
    held = {i for ids in commits for i in ids}

    def no_scan(db: sqlite3.Connection) -> list[list[int]]:
        raise AssertionError("scanned: the journaled runs missed a change")

    original, job_ids._scan = job_ids._scan, no_scan
    try:
        assert job_ids.journal_ranges(_table(held), kept=value, total=len(held)) == _runs(held)
    finally:
        job_ids._scan = original


_garbage = st.recursive(
    st.none() | st.integers(-5, 250) | st.booleans() | st.text(max_size=3) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=6),
    max_leaves=20,
)


@given(
    st.sets(st.integers(1, 250), max_size=120),
    _garbage | st.lists(st.lists(st.integers(1, 250), min_size=2, max_size=2)),
)
@settings(max_examples=400, deadline=None)
def test_runs_journaled_wrongly_or_damaged_fall_back_to_the_scan(ids: set[int], kept: object) -> None:
    """The jobs table is the truth: whatever the meta holds, the runs come out right."""
    assert job_ids.journal_ranges(_table(ids), kept=kept, total=len(ids)) == _runs(ids)


def test_the_scan_finds_holes_in_a_large_journal() -> None:
    holes = {17, 50_000, 50_001, 99_999}
    ids = set(range(1, 100_001)) - holes
    assert job_ids.journal_ranges(_table(ids), kept=None, total=len(ids)) == [
        [1, 16],
        [18, 49_999],
        [50_002, 99_998],
        [100_000, 100_000],
    ]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"1": 2}, "must be a list"),
        ([[1]], "pairs"),
        ([[1, 2, 3]], "pairs"),
        ([[2, 1]], "pairs"),
        ([[0, 1]], "positive"),
        ([[1, 5], [5, 9]], "disjoint"),
        ([[4, 5], [1, 2]], "ascending"),
        ([[1, "2"]], "pairs"),
        ([[True, 2]], "pairs"),
        ([[1, 2.0]], "pairs"),
        ([[1, job_ids.MOST_LISTED + 1]], "more than a client expands"),
    ],
)
def test_a_malformed_answer_is_refused_before_anything_is_expanded(value: object, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        job_ids.from_wire(value)


def test_a_well_formed_answer_expands_in_order() -> None:
    assert job_ids.from_wire([[1, 3], [7, 7], [10, 11]]) == ["1", "2", "3", "7", "10", "11"]
    assert job_ids.from_wire([]) == []


@pytest.mark.parametrize("value", [{"1": 2}, [[2, 1]], [[0, 3]], [["1", 2]], "x"])
def test_a_damaged_list_of_jobs_being_canceled_is_a_damaged_journal(tmp_path: Path, value: object) -> None:
    """Which jobs a mass cancel had not ended cannot be guessed: running them would go against a cancel
    the pilot accepted. The journal is refused as damaged, saying what."""
    path = tmp_path / "journal.db"
    with Store.open(path) as store:
        with store.batch() as tx:
            tx.job_accepted("1", 1, _desc(1), 1.0)
            tx.meta(job_ids.CANCELING_META, value)
        with pytest.raises(JournalError, match="list of jobs being canceled is damaged"):
            store.load(ended=False)
    assert job_ids.canceling_runs(None) == [] and job_ids.canceling_runs([[3, 5]]) == [[3, 5]]


def test_runs_past_the_most_journaled_are_left_to_the_scan() -> None:
    kept = JobIds()
    for i in range(1, 20, 2):  # ten runs of one id each
        kept.add(i)
    assert kept.journal_value(most=10) == [[i, i] for i in range(1, 20, 2)]
    kept.add(30)
    assert kept.journal_value(most=10) is None and not kept.changed
    held = set(range(1, 20, 2)) | {30}
    assert job_ids.journal_ranges(_table(held), kept=None, total=len(held)) == kept.ranges()

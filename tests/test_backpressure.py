"""Backpressure (issue 5): past ``pilot.max_queued`` unfinished jobs a submit waits for room instead of
growing the daemon's memory, and is refused (transient) before the client's own timeout; jobs that
ended leave the daemon's memory and are still answered for from the journal."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import Pilot
from pilot_waits import agents_active

import client as psij

pytestmark = pytest.mark.timeout(120)


@contextmanager
def unfinished_seen(p: Pilot) -> Iterator[list[int]]:
    """The pilot's unfinished (QUEUED + ACTIVE) job counts, sampled every 5 ms while the block runs."""
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        watcher = p.executor()
        while not stop.is_set():
            st = watcher.pilot_status()
            seen.append(sum(n for s, n in st["jobs"].items() if s in ("QUEUED", "ACTIVE")))
            time.sleep(0.005)

    t = threading.Thread(target=watch)
    t.start()
    try:
        yield seen
    finally:
        stop.set()
        t.join()


def test_submits_past_max_queued_wait_and_all_complete(start_pilot: Callable[..., Pilot], tmp_path: Path) -> None:
    p = start_pilot('[pilot]\nmax_queued = 4\n[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n')
    ex = p.executor()
    agents_active(ex, 1)
    with unfinished_seen(p) as seen:
        jobs = []
        for i in range(40):
            job = psij.Job(
                psij.JobSpec(executable="/bin/sh", arguments=["-c", f"sleep 0.05; echo {i} > {tmp_path}/{i}"])
            )
            ex.submit(job)  # blocks while 4 are unfinished
            jobs.append(job)
        for job in jobs:
            status = job.wait(timeout=30)
            assert status is not None and status.state is psij.JobState.COMPLETED, status
    assert max(seen) <= 4, f"the pilot held {max(seen)} unfinished jobs, more than max_queued = 4"
    assert sorted(int(f.name) for f in tmp_path.iterdir() if f.name.isdigit()) == list(range(40))
    # Ended jobs are answered for from the journal: list, attach (with Delivered) and a no-op cancel.
    ids = [job.native_id for job in jobs]
    assert set(ids) <= set(ex.list())
    again = psij.Job()
    assert ids[0] is not None
    p.executor().attach(again, ids[0])
    status = again.wait(timeout=10)
    assert status is not None and status.state is psij.JobState.COMPLETED
    assert (status.metadata or {}).get("processors") == 1
    p.executor().cancel(again)
    assert again.status.state is psij.JobState.COMPLETED


def test_a_submit_that_finds_no_room_in_time_is_refused_transient(start_pilot: Callable[..., Pilot]) -> None:
    p = start_pilot('[pilot]\nmax_queued = 1\n[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 1\n')
    ex = p.executor()
    agents_active(ex, 1)
    blocker = psij.Job(psij.JobSpec(executable="/bin/sleep", arguments=["60"]))
    ex.submit(blocker)
    refused = psij.Job(psij.JobSpec(executable="/bin/true"))
    with pytest.raises(psij.SubmitException) as info:
        ex.submit(refused)
    assert info.value.transient and "max_queued" in str(info.value), info.value
    assert refused.native_id is None
    assert set(ex.list()) == {blocker.native_id}, "the refused submit was not accepted behind the client's back"
    ex.cancel(blocker)
    blocker.wait(timeout=20)
    ok = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(ok)
    status = ok.wait(timeout=20)
    assert status is not None and status.state is psij.JobState.COMPLETED


@pytest.mark.parametrize("api", ["submit_all", "pipelined submit"])
def test_a_request_larger_than_the_room_left_is_taken_in_part_and_the_rest_sent_again(
    start_pilot: Callable[..., Pilot], tmp_path: Path, api: str
) -> None:
    """max_queued holds per job, not per request: a submit_all request of 16 jobs, or a pipelined
    frame of jobs submitted meanwhile, finds room for a few; those are taken, the rest answered 'no
    room' and sent again by the client under the same submit ids, and every job runs once."""
    p = start_pilot('[pilot]\nmax_queued = 4\n[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n')
    ex = p.executor(pipelined=True)
    agents_active(ex, 1)
    marks = tmp_path / "marks"
    marks.mkdir()
    with unfinished_seen(p) as seen:
        jobs = [
            psij.Job(psij.JobSpec(executable="/bin/sh", arguments=["-c", f"sleep 0.02; echo x >> {marks}/{i}"]))
            for i in range(60)
        ]
        if api == "submit_all":
            ex.submit_all(jobs)
        else:
            for job in jobs:
                ex.submit(job)
        for job in jobs:
            status = job.wait(timeout=60)
            assert status is not None and status.state is psij.JobState.COMPLETED, status
    assert seen and max(seen) <= 4, f"the pilot held {max(seen)} unfinished jobs, more than max_queued = 4"
    assert sorted(int(f.name) for f in marks.iterdir()) == list(range(60))
    assert all(f.read_text() == "x\n" for f in marks.iterdir()), "a job ran twice"
    assert len({job.native_id for job in jobs}) == 60

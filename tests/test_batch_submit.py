"""Batched submission through the public client: ``JobExecutor.submit_all`` (PSI/J's bulk submit) and
concurrent ``submit()`` calls coalesced into shared SUBMIT frames (group submit).

Real daemons, agents and task processes: every job that is said to be submitted must really run
(each one touches its own file), and every job that is said to have failed must not exist in the pilot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import Pilot
from pilot_waits import agents_active, callbacks_settled, in_a_thread, wait_for
from test_client_resilience import Restartable, restartable, strays  # noqa: F401 -- fixtures

import client as psij
from client import JobState
from client._backend import SUBMIT_WINDOW

CONFIG = """
[allocation]
lrm = "local"
nodes = 1
cores_per_node = 4
"""

WAIT = 60.0


def touch(path: Path, **kwargs: object) -> psij.JobSpec:
    return psij.JobSpec(executable="/usr/bin/touch", arguments=[str(path)], **kwargs)  # type: ignore[arg-type]


class Recorder:
    """(job, state, native id at the time) for every executor callback, in the order they fired per job."""

    def __init__(self) -> None:
        self.by_job: dict[str, list[tuple[JobState, str | None]]] = {}
        self._lock = threading.Lock()

    def __call__(self, job: psij.Job, status: psij.JobStatus) -> None:
        with self._lock:
            self.by_job.setdefault(job.id, []).append((status.state, job.native_id))

    def settled(self, job: psij.Job) -> list[tuple[JobState, str | None]]:
        """What the callbacks had once they had the final status (see ``callbacks_settled``)."""
        with self._lock:
            got = self.by_job.setdefault(job.id, [])
        callbacks_settled(lambda: [state for state, _ in got], f"job {job.native_id}")
        with self._lock:
            return list(got)


def outputs(tmp_path: Path) -> Path:
    """A directory for the tasks' files only (the pilot's config and home sit in ``tmp_path``)."""
    out = tmp_path / "out"
    out.mkdir()
    return out


def final(job: psij.Job) -> psij.JobStatus:
    status = job.wait(timeout=WAIT)
    assert status is not None and status.final, f"job {job.native_id} not final: {job.status}"
    return status


@pytest.mark.timeout(120)
def test_submit_all_submits_the_good_jobs_and_names_each_bad_one(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    ex = start_pilot(CONFIG).executor()
    tmp_path = outputs(tmp_path)
    rec = Recorder()
    ex.set_job_status_callback(rec)
    already = psij.Job(touch(tmp_path / "already"))
    ex.submit(already)
    n = 2600  # eight requests (16, 32, ... up to 1,000 jobs), so errors land in several of them
    jobs = [psij.Job(touch(tmp_path / f"out-{i}")) for i in range(n)]
    bad_launcher = {5, 1500, 2599}  # refused by the daemon, each in a different request
    for i in bad_launcher:
        jobs[i] = psij.Job(touch(tmp_path / f"out-{i}", launcher="nope"))
    jobs[10] = psij.Job()  # no spec: refused by the client before anything is sent
    jobs[20] = already  # submitted before: InvalidStateException
    jobs.append(jobs[30])  # the same job twice in one call: the second copy is refused

    with pytest.raises(psij.BatchSubmitException) as caught:
        ex.submit_all(jobs)
    err = caught.value
    expected = {5: psij.InvalidJobException, 10: psij.InvalidJobException, 20: psij.InvalidStateException}
    expected |= {1500: psij.InvalidJobException, 2599: psij.InvalidJobException, n: psij.InvalidStateException}
    assert [job for job, _ in err.failed] == [jobs[i] for i in sorted(expected)]
    assert [type(e) for _, e in err.failed] == [expected[i] for i in sorted(expected)]
    assert list(err.exceptions) == [e for _, e in err.failed]
    assert all(getattr(e, "job") is job for job, e in err.failed)  # noqa: B009
    assert err.jobs == [job for job, _ in err.failed]
    assert all("launcher 'nope'" in str(e) for job, e in err.failed if job in [jobs[i] for i in bad_launcher])
    assert f"{len(expected)} of {n + 1} jobs" in str(err)
    # except* picks one kind out of the group, still knowing each exception's job
    picked: list[BaseExceptionGroup[BaseException]] = []
    try:
        raise err
    except* psij.InvalidStateException as group:
        picked.append(group)
    except* psij.InvalidJobException:
        pass
    assert isinstance(picked[0], psij.BatchSubmitException)
    assert picked[0].jobs == [jobs[20], jobs[30]]

    good = [j for i, j in enumerate(jobs[:n]) if i not in expected]
    refused = [jobs[i] for i in (5, 10, 1500, 2599)]
    for job in refused:
        assert job.status.state is JobState.NEW and job.native_id is None and job.executor is None
    # Every good job was QUEUED with its native id by the time submit_all returned, and runs.
    ids = [job.native_id for job in good]
    assert None not in ids and len(set(ids)) == len(good)
    assert set(ids) | {already.native_id} == set(ex.list()), "the pilot holds exactly the jobs said submitted"
    for job in good:
        assert final(job).state is JobState.COMPLETED
    assert final(already).state is JobState.COMPLETED
    made = {p.name for p in tmp_path.iterdir()}
    assert made == {f"out-{i}" for i in range(n) if i not in expected} | {"already"}
    # Callbacks: per job, QUEUED first (with the native id known), then ACTIVE, then COMPLETED.
    for job in good:
        assert rec.by_job[job.id] == [
            (JobState.QUEUED, job.native_id),
            (JobState.ACTIVE, job.native_id),
            (JobState.COMPLETED, job.native_id),
        ]
    for job in refused:
        assert job.id not in rec.by_job
    # A refused job can be fixed and submitted again.
    jobs[10].spec = touch(tmp_path / "fixed")
    ex.submit_all([jobs[10]])
    assert final(jobs[10]).state is JobState.COMPLETED and (tmp_path / "fixed").exists()


@pytest.mark.timeout(60)
def test_submit_all_of_nothing_or_of_good_jobs_raises_nothing(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    ex = start_pilot(CONFIG).executor()
    tmp_path = outputs(tmp_path)
    ex.submit_all([])
    jobs = [psij.Job(touch(tmp_path / f"g-{i}")) for i in range(5)]
    ex.submit_all(iter(jobs))  # any iterable
    assert all(final(job).state is JobState.COMPLETED for job in jobs)
    assert len({p.name for p in tmp_path.iterdir()}) == 5


@pytest.mark.timeout(120)
def test_concurrent_submits_share_one_frame_and_keep_their_own_results(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    ex = start_pilot(CONFIG).executor()
    tmp_path = outputs(tmp_path)
    agents_active(ex, 1)
    conn = ex._backend.connection
    # Hold the connection's socket, as a thread in the middle of a send or a read would: the submits
    # below cannot be sent on their callers' threads and all queue up; released, they leave together.
    conn._sock_lock.acquire()
    rec = Recorder()
    ex.set_job_status_callback(rec)
    threads, n = 12, 3
    results: dict[int, list[psij.Job | BaseException]] = {t: [] for t in range(threads)}

    def work(t: int) -> None:
        for i in range(n):
            bad = t == 0 and i == 1
            job = psij.Job(touch(tmp_path / f"t{t}-{i}", launcher="nope" if bad else None))
            try:
                ex.submit(job)
                results[t].append(job)
            except BaseException as exc:  # recorded for the asserts below
                results[t].append(exc)

    before = conn.submit_frames
    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    # Each thread's first submit is queued (the I/O thread is held); none has returned yet.
    wait_for(lambda: len(conn._outbox) == threads, what="every thread's submit to be queued")
    assert all(not r for r in results.values())
    conn._sock_lock.release()
    for w in workers:
        w.join(60)
    assert not any(w.is_alive() for w in workers)
    # The first submit of all threads went in one frame; the rest followed in as few as came together.
    assert conn.submit_frames - before <= 1 + (n - 1) * threads
    assert conn.submit_frames - before < n * threads
    errors = [r for rs in results.values() for r in rs if isinstance(r, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], psij.InvalidJobException), errors
    assert isinstance(results[0][1], psij.InvalidJobException), "the error is raised by the call that made it"
    jobs = [r for rs in results.values() for r in rs if isinstance(r, psij.Job)]
    assert len(jobs) == threads * n - 1
    assert len({j.native_id for j in jobs}) == len(jobs) and None not in {j.native_id for j in jobs}
    for job in jobs:
        assert final(job).state is JobState.COMPLETED
        seen = rec.settled(job)
        assert [s for s, _ in seen] == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
        assert seen[0][1] == job.native_id
    assert len(list(tmp_path.iterdir())) == threads * n - 1


@pytest.mark.timeout(120)
def test_a_batch_in_flight_when_the_daemon_dies_is_sent_to_the_next_daemon_and_runs_once(
    restartable: Restartable,  # noqa: F811 -- the fixture imported above
    tmp_path: Path,
) -> None:
    """Issue 19 changed this promise: the batch's requests in flight when the daemon dies are no longer
    failed with "may or may not have been accepted". Their jobs carry submit ids: they wait (within
    request_timeout) for the next daemon on the run directory, go to it, and every job runs once."""
    r = restartable
    ex = r.executor(request_timeout=60)
    agents_active(ex, 1)
    jobs = [psij.Job(touch(tmp_path / f"j{i}")) for i in range(400)]
    errors: list[BaseException] = []
    daemon = psutil.Process(r.pilot.pid)
    daemon.suspend()  # reads nothing: the requests are in flight, unanswered, when the daemon dies
    try:
        t = in_a_thread(lambda: ex.submit_all(jobs), errors)
        conn = ex._backend.connection
        # Requests of 16, 32, 64 and 128 jobs are in flight (the window), the other 160 not yet sent.
        wait_for(lambda: conn.in_flight() == SUBMIT_WINDOW, what="the window's requests to be sent")
        r.kill_daemon()
    finally:
        try:
            daemon.resume()
        except psutil.NoSuchProcess:
            pass
    r.up_again()
    t.join(WAIT)
    assert not t.is_alive() and not errors, errors
    assert all(final(job).state is JobState.COMPLETED for job in jobs)
    assert sorted(ex.list(), key=int) == sorted((str(j.native_id) for j in jobs), key=int)
    assert len(list(tmp_path.glob("j*"))) == 400


@pytest.mark.timeout(60)
def test_a_batch_to_a_stopped_daemon_waits_for_it_and_is_accepted_once(
    restartable: Restartable,  # noqa: F811 -- the fixture imported above
) -> None:
    """Issue 19 changed this promise: a batch to a daemon that is alive but stopped no longer fails at
    request_timeout (to be accepted behind the caller's back once the daemon runs again): it waits."""
    r = restartable
    ex = r.executor(request_timeout=1)
    agents_active(ex, 1)
    daemon = psutil.Process(r.pilot.pid)
    jobs = [psij.Job(psij.JobSpec(executable="/bin/true")) for _ in range(500)]
    errors: list[BaseException] = []
    daemon.suspend()
    try:
        t = in_a_thread(lambda: ex.submit_all(jobs), errors)
        t.join(4)  # four request timeouts
        assert t.is_alive() and not errors, errors
    finally:
        daemon.resume()
    t.join(WAIT)
    assert not t.is_alive() and not errors, errors
    assert all(job.status.state is not JobState.NEW for job in jobs)
    assert len(ex.list()) == 500


@pytest.mark.timeout(120)
def test_more_requests_in_flight_than_the_socket_holds_all_get_their_replies(
    start_pilot: Callable[..., Pilot],
) -> None:
    """8,000 one-job SUBMITs queued at once on one connection (what as many threads calling submit()
    together amount to): the daemon's replies outnumber what the client's socket queues hold (1,000
    messages each way). A reply that finds no room waits for the next flush instead of being dropped:
    every request is answered, every job has its id, and the statuses of those jobs still arrive."""
    p = start_pilot(CONFIG.replace("cores_per_node = 4", "cores_per_node = 1") + "[pilot]\nbacklog = 0\n")
    ex = p.executor()
    agents_active(ex, 1)
    blocker = psij.Job(psij.JobSpec(executable="/bin/sleep", arguments=["60"]))
    ex.submit(blocker)
    assert blocker.wait(timeout=WAIT, target_states=[JobState.ACTIVE]) is not None
    conn = ex._backend.connection
    n = 8000
    ids: list[str] = []
    lock = threading.Lock()

    def on_reply(body: dict[str, object]) -> None:
        results = body.get("results")
        assert isinstance(results, list) and len(results) == 1 and "id" in results[0], body
        with lock:
            ids.append(str(results[0]["id"]))

    description = {"executable": "/bin/true"}
    tickets = [conn.submit([description], on_reply=on_reply) for _ in range(n)]
    for ticket in tickets:
        conn.wait(ticket, timeout=WAIT)
    assert len(ids) == n and len(set(ids)) == n
    # Their statuses come too: the last of them, followed, is canceled while queued and says so.
    last = psij.Job()
    ex.attach(last, max(ids, key=int))
    ex.cancel(last)
    status = last.wait(timeout=WAIT)
    assert status is not None and status.state is JobState.CANCELED, status
    ex.cancel(blocker)

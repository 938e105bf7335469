"""PSI/J semantics against a real pilot: states, waiting, callbacks, errors, cancel, attach.

Every test drives a real daemon started with ``pilot up``, real agents and real task processes, and
checks what those processes did (files they wrote, whether they are still alive), not only what the
client reports.
"""

from __future__ import annotations

import itertools
import select
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from pilot_waits import gone, read_pid, wait_for

import client as psij
from client import JobState
from pilot import wire

WAIT = 30.0  # seconds a job may take to reach a final state; never reached by a passing test

ONE_CORE = """
[allocation]
lrm = "local"
nodes = 1
cores_per_node = 1
"""

TWO_CORES = """
[allocation]
lrm = "local"
nodes = 1
cores_per_node = 2
gpus_per_node = 0
"""


# -- helpers ----------------------------------------------------------------------------------------


def sh(script: str, **kwargs: Any) -> psij.JobSpec:
    """A JobSpec running ``script`` with /bin/sh (the script itself must not use ``${...}``)."""
    return psij.JobSpec(executable="/bin/sh", arguments=["-c", script], **kwargs)


def final(job: psij.Job, timeout: float = WAIT) -> psij.JobStatus:
    status = job.wait(timeout=timeout)
    assert status is not None, f"job {job.native_id} not final after {timeout} s: {job.status}"
    assert status.final
    return status


class Recorder:
    """Collects (job native id, state) from callbacks; ``done`` is set once ``expect`` jobs are final."""

    def __init__(self, expect: int = 1) -> None:
        self.events: list[tuple[str | None, JobState]] = []
        self.statuses: list[psij.JobStatus] = []
        self.native_ids_seen: list[str | None] = []
        self._lock = threading.Lock()
        self._expect = expect
        self._finals = 0
        self.done = threading.Event()

    def __call__(self, job: psij.Job, status: psij.JobStatus) -> None:
        with self._lock:
            self.events.append((job.native_id, status.state))
            self.statuses.append(status)
            self.native_ids_seen.append(job.native_id)
            if status.state.final:
                self._finals += 1
                if self._finals >= self._expect:
                    self.done.set()

    def states(self, native_id: str | None = None) -> list[JobState]:
        with self._lock:
            return [s for n, s in self.events if native_id is None or n == native_id]


# -- the state model --------------------------------------------------------------------------------


def test_callbacks_see_queued_active_completed_once_in_order(start_pilot, tmp_path: Path) -> None:
    """Per-job and per-executor callbacks each see QUEUED, ACTIVE, COMPLETED exactly once, in that
    order: for a job whose ACTIVE state the daemon reports, and for an instant one whose ACTIVE the
    client may have to synthesise."""
    pilot = start_pilot()
    ex = pilot.executor()
    per_executor = Recorder(expect=2)
    ex.set_job_status_callback(per_executor)

    gate = tmp_path / "gate"
    slow = psij.Job(sh(f"while [ ! -e {gate} ]; do sleep 0.02; done; echo ran > {tmp_path / 'slow.out'}"))
    fast = psij.Job(sh(f"echo ran > {tmp_path / 'fast.out'}"))
    per_job = {"slow": Recorder(), "fast": Recorder()}
    slow.set_job_status_callback(per_job["slow"])

    class Listener:  # the PSI/J callback interface, not a plain callable
        def __init__(self) -> None:
            self.rec = per_job["fast"]

        def job_status_changed(self, job: psij.Job, status: psij.JobStatus) -> None:
            self.rec(job, status)

    fast.set_job_status_callback(Listener())

    ex.submit(slow)
    assert slow.wait(timeout=WAIT, target_states=[JobState.ACTIVE]) is not None
    assert slow.status.state is JobState.ACTIVE  # blocked on the gate: really running, not done
    ex.submit(fast)
    gate.touch()
    for job in (slow, fast):
        assert final(job).state is JobState.COMPLETED
    assert per_executor.done.wait(WAIT)
    for rec in per_job.values():
        assert rec.done.wait(WAIT)

    expected = [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    assert per_job["slow"].states() == expected
    assert per_job["fast"].states() == expected
    assert per_executor.states(slow.native_id) == expected
    assert per_executor.states(fast.native_id) == expected
    # Each state seen is greater than the one before (the PSI/J partial order), and timestamps never
    # go backwards along a job's history.
    for rec in per_job.values():
        states = rec.states()
        assert all(b.is_greater_than(a) for a, b in itertools.pairwise(states))
        times = [s.time for s in rec.statuses]
        assert times == sorted(times), times
    assert (tmp_path / "slow.out").read_text() == "ran\n"
    assert (tmp_path / "fast.out").read_text() == "ran\n"


def test_active_is_timed_when_the_process_started_also_for_an_instant_job(start_pilot) -> None:
    """A task that starts and ends between two reports comes with its end alone; the ACTIVE the client
    then enters is timed at the process's start (Delivered ``started``), not at its end."""
    pilot = start_pilot()
    ex = pilot.executor()
    seen: dict[JobState, psij.JobStatus] = {}
    job = psij.Job(psij.JobSpec(executable="/bin/true"))
    job.set_job_status_callback(lambda _, status: seen.setdefault(status.state, status))
    ex.submit(job)
    done = final(job)
    assert done.state is JobState.COMPLETED
    started = done.metadata["started"]
    active = seen[JobState.ACTIVE]
    assert active.time == started, (active.time, started)
    assert done.time is not None and started < done.time
    assert done.time - started == pytest.approx(done.metadata["wall_duration"], abs=1e-6)


def test_callbacks_stay_in_order_while_a_callback_is_busy(start_pilot, tmp_path: Path) -> None:
    """The QUEUED callback runs on the submitting thread; if it is still busy when the job's later
    states arrive, those must not overtake it: the executor callback still sees QUEUED first."""
    pilot = start_pilot()
    ex = pilot.executor()
    per_executor = Recorder()
    ex.set_job_status_callback(per_executor)
    job = psij.Job(sh(f"echo ran > {tmp_path / 'out'}"))
    in_queued_callback: list[psij.JobStatus | None] = []

    def busy(j: psij.Job, status: psij.JobStatus) -> None:
        if status.state is JobState.QUEUED:
            # Busy until the job has ended (it is instant): its end arrives meanwhile.
            in_queued_callback.append(j.wait(timeout=10))

    job.set_job_status_callback(busy)
    ex.submit(job)
    assert final(job).state is JobState.COMPLETED
    assert per_executor.done.wait(WAIT)
    assert in_queued_callback and in_queued_callback[0] is not None
    assert in_queued_callback[0].state is JobState.COMPLETED
    assert per_executor.states() == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    assert (tmp_path / "out").read_text() == "ran\n"


@pytest.mark.timeout(60)
def test_a_blocked_callback_stalls_neither_the_socket_nor_the_order(start_pilot, tmp_path: Path) -> None:
    """The worker that read a status runs its callbacks and the other one reads meanwhile: while an
    executor callback is blocked, replies still arrive (submit from the callback itself and from
    another thread, list), and the statuses read meanwhile wait their turn, each job's in order."""
    pilot = start_pilot(TWO_CORES)
    ex = pilot.executor()
    gate = threading.Event()
    seen: list[tuple[str | None, JobState]] = []
    inner: list[psij.Job] = []
    first = psij.Job(sh("true"))

    def cb(job: psij.Job, status: psij.JobStatus) -> None:
        seen.append((job.native_id, status.state))
        if job is first and status.state is JobState.COMPLETED:
            follow = psij.Job(sh(f"echo inner > {tmp_path / 'inner.out'}"))
            ex.submit(follow)  # its reply is read by the other worker while this one is here
            inner.append(follow)
            assert gate.wait(WAIT)

    ex.set_job_status_callback(cb)
    ex.submit(first)
    assert first.wait(timeout=WAIT) is not None
    wait_for(lambda: bool(inner), timeout=WAIT)  # the callback is now blocked on the gate
    other = psij.Job(sh(f"echo other > {tmp_path / 'other.out'}"))
    ex.submit(other)  # replies still come while a callback is blocked
    assert other.native_id in ex.list()
    wait_for(lambda: (tmp_path / "other.out").exists() and (tmp_path / "inner.out").exists(), timeout=WAIT)
    assert [s for n, s in seen if n == other.native_id] == [JobState.QUEUED]  # only the submitter's so far
    gate.set()
    for job in (first, inner[0], other):
        assert final(job).state is JobState.COMPLETED
    wait_for(lambda: sum(1 for _, s in seen if s is JobState.COMPLETED) == 3, timeout=WAIT)
    for job in (first, inner[0], other):
        assert [s for n, s in seen if n == job.native_id] == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]


@pytest.mark.timeout(60)
def test_closing_from_a_callback_ends_both_workers(start_pilot) -> None:
    """A callback may close the executor: the worker running it goes on delivering, the reader stops,
    and both threads end."""
    pilot = start_pilot()
    ex = psij.JobExecutor.get_instance("pilot", url=str(pilot.rundir.path))
    closed = threading.Event()

    def cb(job: psij.Job, status: psij.JobStatus) -> None:
        if status.state is JobState.COMPLETED:
            ex.close()
            closed.set()

    ex.set_job_status_callback(cb)
    job = psij.Job(sh("true"))
    ex.submit(job)
    conn = ex._backend._conn
    assert conn is not None
    assert closed.wait(WAIT)
    assert final(job).state is JobState.COMPLETED
    for worker in conn._workers:
        worker.join(timeout=10)
        assert not worker.is_alive()
    assert conn.closed


def test_raising_callback_does_not_break_the_job(start_pilot, tmp_path: Path) -> None:
    """A callback that raises is the caller's bug: submit still succeeds, the job still runs, and the
    other callback still sees every state (psij-python logs such exceptions and goes on)."""
    pilot = start_pilot()
    ex = pilot.executor()
    per_executor = Recorder()
    ex.set_job_status_callback(per_executor)
    calls: list[JobState] = []

    def broken(job: psij.Job, status: psij.JobStatus) -> None:
        calls.append(status.state)
        raise RuntimeError(f"callback bug at {status.state}")

    job = psij.Job(sh(f"echo ran > {tmp_path / 'out'}"))
    job.set_job_status_callback(broken)
    ex.submit(job)
    assert job.native_id is not None
    assert final(job).state is JobState.COMPLETED
    assert per_executor.done.wait(WAIT)
    assert per_executor.states() == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    assert calls == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    assert (tmp_path / "out").read_text() == "ran\n"


def test_many_short_jobs_each_see_every_state_once_in_order(start_pilot, tmp_path: Path) -> None:
    """Under load (many jobs whose states race the submit call), no callback is lost, doubled or
    delivered out of order."""
    pilot = start_pilot()
    ex = pilot.executor()
    n = 60
    per_executor = Recorder(expect=n)
    ex.set_job_status_callback(per_executor)
    jobs = []
    recs = []
    for i in range(n):
        job = psij.Job(psij.JobSpec(executable="/bin/sh", arguments=["-c", f"echo {i} > {tmp_path / str(i)}"]))
        rec = Recorder()
        job.set_job_status_callback(rec)
        ex.submit(job)
        jobs.append(job)
        recs.append(rec)
    for job, rec in zip(jobs, recs, strict=True):
        assert final(job).state is JobState.COMPLETED
        assert rec.done.wait(WAIT)
        assert rec.states() == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED], (job, rec.states())
    assert per_executor.done.wait(WAIT)
    for job in jobs:
        assert per_executor.states(job.native_id) == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    assert sorted(int((tmp_path / str(i)).read_text()) for i in range(n)) == list(range(n))


def test_wait_semantics(start_pilot, tmp_path: Path) -> None:
    """wait() returns on the target state or any later one, on a final state whatever the targets,
    and None on timeout."""
    pilot = start_pilot()
    ex = pilot.executor()
    gate = tmp_path / "gate"
    job = psij.Job(sh(f"while [ ! -e {gate} ]; do sleep 0.02; done; exit 3"))
    # Not submitted yet: NEW, and waiting for anything times out.
    assert job.status.state is JobState.NEW
    t0 = time.monotonic()
    assert job.wait(timeout=0.2) is None
    assert time.monotonic() - t0 >= 0.2
    ex.submit(job)

    active = job.wait(timeout=WAIT, target_states=JobState.ACTIVE)
    assert active is not None and active.state is JobState.ACTIVE
    # QUEUED is behind us: a later state satisfies the wait at once.
    t0 = time.monotonic()
    st = job.wait(timeout=timedelta(seconds=5), target_states=[JobState.QUEUED])
    assert st is not None and st.state is JobState.ACTIVE
    assert time.monotonic() - t0 < 1.0
    # The job is blocked: waiting for its end times out with None, after the timeout.
    t0 = time.monotonic()
    assert job.wait(timeout=0.3) is None
    assert job.wait(timeout=timedelta(milliseconds=200), target_states=[JobState.COMPLETED]) is None
    assert time.monotonic() - t0 >= 0.5
    assert job.status.state is JobState.ACTIVE

    gate.touch()
    # The target COMPLETED is never reached, but FAILED is final: wait returns it.
    st = job.wait(timeout=WAIT, target_states=[JobState.COMPLETED])
    assert st is not None and st.state is JobState.FAILED and st.exit_code == 3
    # Waiting on an earlier state after the end returns the final status at once.
    st = job.wait(timeout=0.1, target_states=[JobState.ACTIVE])
    assert st is not None and st.state is JobState.FAILED


def test_native_id_set_before_submit_returns_and_listed(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    rec = Recorder(expect=3)
    ex.set_job_status_callback(rec)
    jobs = [psij.Job(sh(f"echo $PILOT_JOB_ID > {tmp_path / f'id{i}'}")) for i in range(3)]
    for job in jobs:
        ex.submit(job)
        assert job.native_id is not None  # before anything else happens
        assert job.status.state is not JobState.NEW
    ids = [job.native_id for job in jobs]
    assert len(set(ids)) == 3
    listed = ex.list()
    assert set(ids) <= set(listed)
    for job in jobs:
        assert final(job).state is JobState.COMPLETED
    # The id the client got is the one the task sees.
    for i, job in enumerate(jobs):
        assert (tmp_path / f"id{i}").read_text().strip() == job.native_id
    # Callbacks never saw a job without its native id, not even QUEUED.
    assert rec.done.wait(WAIT)
    assert None not in rec.native_ids_seen
    # Finished jobs stay listed, also for a fresh executor.
    assert set(ids) <= set(pilot.executor().list())
    # A client from before LIST answered in runs gets one string per job, the same ids.
    body = ex._backend.request(wire.Kind.LIST, {})
    assert "ranges" not in body and body["ids"] == ex.list()
    assert ex._backend.request(wire.Kind.LIST, {"ranges": True})["ranges"] == [[int(ids[0]), int(ids[-1])]]


def test_resubmit_raises_invalid_state(start_pilot) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    job = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(job)
    native_id = job.native_id
    with pytest.raises(psij.InvalidStateException):
        ex.submit(job)
    with pytest.raises(psij.InvalidStateException):
        pilot.executor().submit(job)
    assert final(job).state is JobState.COMPLETED
    with pytest.raises(psij.InvalidStateException):
        ex.submit(job)
    assert job.native_id == native_id
    assert ex.list().count(native_id) == 1


def test_missing_executable_in_spec_is_invalid_job(start_pilot) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    before = set(ex.list())
    job = psij.Job(psij.JobSpec(arguments=["x"]))
    with pytest.raises(psij.InvalidJobException) as err:
        ex.submit(job)
    assert "executable" in str(err.value)
    assert job.status.state is JobState.NEW and job.native_id is None
    with pytest.raises(psij.InvalidJobException):
        ex.submit(psij.Job())  # no spec at all
    assert set(ex.list()) == before
    # The same Job, once fixed, can be submitted: a rejected submit leaves it NEW.
    job.spec.executable = "/bin/true"
    ex.submit(job)
    assert final(job).state is JobState.COMPLETED


@pytest.mark.parametrize(
    ("resources", "words"),
    [
        (dict(cpu_cores_per_process=3), ("3 cores", "2")),
        (dict(gpu_cores_per_process=1), ("GPU",)),
        (dict(node_count=2), ("2 nodes",)),
        (dict(process_count=2, cpu_cores_per_process=2), ("2 processes", "at most 1")),
        (dict(memory=1 << 50), ("memory",)),
    ],
    ids=["cores", "gpu", "nodes", "processes", "memory"],
)
def test_request_that_can_never_fit_is_invalid_job(start_pilot, resources: dict[str, int], words: tuple[str]) -> None:
    pilot = start_pilot(TWO_CORES)
    ex = pilot.executor()
    job = psij.Job(psij.JobSpec(executable="/bin/true", resources=psij.ResourceSpecV1(**resources)))
    with pytest.raises(psij.InvalidJobException) as err:
        ex.submit(job)
    message = str(err.value)
    assert "never" in message
    for w in words:
        assert w in message, message
    assert job.native_id is None and job.status.state is JobState.NEW
    assert ex.list() == []
    # The pilot is unharmed: a job that fits still runs.
    ok = psij.Job(psij.JobSpec(executable="/bin/true", resources=psij.ResourceSpecV1(cpu_cores_per_process=2)))
    ex.submit(ok)
    assert final(ok).state is JobState.COMPLETED


def test_submit_after_pilot_down_is_transient(start_pilot) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    job = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(job)
    assert final(job).state is JobState.COMPLETED
    daemon = psutil.Process(pilot.pid)
    pilot.cli("down")
    assert gone(daemon)

    # A client that looks the pilot up in its run directory.
    with pytest.raises(psij.SubmitException) as err:
        psij.JobExecutor.get_instance("pilot", url=str(pilot.rundir.path)).submit(psij.Job(psij.JobSpec("/bin/true")))
    assert err.value.transient
    assert str(pilot.rundir.path) in str(err.value)

    # A client still holding a connection to the dead daemon: it must not hang for long.
    t0 = time.monotonic()
    stale = psij.Job(psij.JobSpec(executable="/bin/true"))
    with pytest.raises(psij.SubmitException) as err:
        ex.submit(stale)
    assert err.value.transient
    assert time.monotonic() - t0 < 10, "a dead daemon should be noticed well before the request timeout"
    assert stale.status.state is JobState.NEW and stale.executor is None


# -- failures ---------------------------------------------------------------------------------------


def test_failing_executable_ends_failed_with_exit_code(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    job = psij.Job(sh(f"echo partial > {tmp_path / 'out'}; exit 7"))
    ex.submit(job)
    st = final(job)
    assert st.state is JobState.FAILED
    assert st.exit_code == 7
    assert "7" in (st.message or "")
    assert (st.metadata or {})["exit_code"] == 7
    assert (tmp_path / "out").read_text() == "partial\n"


@pytest.mark.parametrize("exe", ["/nonexistent/dir/no-such-prog-4711", "no-such-prog-4711"], ids=["path", "name"])
def test_missing_executable_ends_failed_naming_it(start_pilot, exe: str) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    rec = Recorder()
    job = psij.Job(psij.JobSpec(executable=exe, arguments=["a"]))
    job.set_job_status_callback(rec)
    ex.submit(job)
    st = final(job)
    assert st.state is JobState.FAILED
    assert exe in (st.message or ""), st.message
    assert "not found" in (st.message or "")
    assert rec.done.wait(WAIT)
    assert rec.states()[0] is JobState.QUEUED and rec.states()[-1] is JobState.FAILED
    assert len(rec.states()) == len(set(rec.states()))


# -- cancel -----------------------------------------------------------------------------------------


def test_cancel_queued_job(start_pilot, tmp_path: Path) -> None:
    """Fill the only core, queue a second job, cancel it: CANCELED, never started, never ACTIVE."""
    pilot = start_pilot(ONE_CORE)
    ex = pilot.executor()
    blocker = psij.Job(sh(f"echo $$ > {tmp_path / 'blocker.pid'}; exec sleep 60"))
    ex.submit(blocker)
    proc = read_pid(tmp_path / "blocker.pid")
    assert blocker.wait(timeout=WAIT, target_states=JobState.ACTIVE) is not None

    marker = tmp_path / "queued-ran"
    queued = psij.Job(sh(f"touch {marker}"))
    rec = Recorder()
    queued.set_job_status_callback(rec)
    ex.submit(queued)
    assert queued.status.state is JobState.QUEUED
    assert pilot.status()["queued"] == 1
    queued.cancel()
    st = final(queued)
    assert st.state is JobState.CANCELED
    assert rec.done.wait(WAIT)
    assert rec.states() == [JobState.QUEUED, JobState.CANCELED]

    # Free the core: the canceled job must not start after all.
    assert not gone(proc)
    blocker.cancel()
    assert final(blocker).state is JobState.CANCELED
    wait_for(lambda: gone(proc), 5, "the blocker to be gone")
    follower = psij.Job(sh(f"touch {tmp_path / 'follower-ran'}"))
    ex.submit(follower)
    assert final(follower).state is JobState.COMPLETED
    assert (tmp_path / "follower-ran").exists()
    assert not marker.exists()
    assert queued.status.state is JobState.CANCELED


def test_cancel_running_job_kills_its_process_tree(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    rec = Recorder()
    job = psij.Job(sh(f"sleep 60 & echo $! > {tmp_path / 'child.pid'}; echo $$ > {tmp_path / 'main.pid'}; wait"))
    job.set_job_status_callback(rec)
    ex.submit(job)
    main = read_pid(tmp_path / "main.pid")
    child = read_pid(tmp_path / "child.pid")
    assert job.wait(timeout=WAIT, target_states=JobState.ACTIVE) is not None
    assert not gone(main) and not gone(child)
    t0 = time.monotonic()
    ex.cancel(job)
    st = final(job)
    assert st.state is JobState.CANCELED
    assert time.monotonic() - t0 < 10
    assert gone(main)
    wait_for(lambda: gone(child), 5, "the task's child to be gone")
    assert rec.done.wait(WAIT)
    assert rec.states() == [JobState.QUEUED, JobState.ACTIVE, JobState.CANCELED]
    # Canceling again, or canceling a finished job, changes nothing.
    job.cancel()
    assert job.status.state is JobState.CANCELED


def test_cancel_after_completion_keeps_completed(start_pilot) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    job = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(job)
    assert final(job).state is JobState.COMPLETED
    job.cancel()
    ex.cancel(job)
    assert job.wait(timeout=0.5).state is JobState.COMPLETED  # type: ignore[union-attr]
    with pytest.raises(psij.InvalidStateException):
        ex.cancel(psij.Job(psij.JobSpec(executable="/bin/true")))  # never submitted


# -- attach -----------------------------------------------------------------------------------------

_ATTACHER = textwrap.dedent(
    """
    import sys
    import client as psij

    url, native_id = sys.argv[1], sys.argv[2]
    ex = psij.JobExecutor.get_instance("pilot", url=url)
    job = psij.Job()
    seen = []
    job.set_job_status_callback(lambda j, s: seen.append(s.state.value))
    ex.attach(job, native_id)
    print("attached", job.native_id, job.status.state.value, flush=True)
    status = job.wait(timeout=60)
    print("final", status.state.value, status.exit_code, ",".join(seen), flush=True)
    ex.close()
    """
)


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"no output from the attaching process within {timeout} s; stderr:\n{err}")
    return proc.stdout.readline()


def test_attach_from_another_process(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    gate = tmp_path / "gate"
    job = psij.Job(sh(f"while [ ! -e {gate} ]; do sleep 0.02; done; echo done > {tmp_path / 'out'}; exit 5"))
    ex.submit(job)
    assert job.wait(timeout=WAIT, target_states=JobState.ACTIVE) is not None
    assert job.native_id is not None

    proc = subprocess.Popen(
        [sys.executable, "-c", _ATTACHER, str(pilot.rundir.path), job.native_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=pilot.env,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        line = _readline(proc, 30).split()
        assert line == ["attached", job.native_id, "ACTIVE"], line
        gate.touch()
        line = _readline(proc, 30).split()
        # The attaching job saw QUEUED (synthesised) and ACTIVE at attach, then FAILED with the code.
        assert line == ["final", "FAILED", "5", "QUEUED,ACTIVE,FAILED"], line
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        elif proc.stdout is not None:
            proc.communicate()
    st = final(job)
    assert st.state is JobState.FAILED and st.exit_code == 5
    assert (tmp_path / "out").read_text() == "done\n"


def test_attach_from_fresh_executor(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    gate = tmp_path / "gate"
    running = psij.Job(sh(f"while [ ! -e {gate} ]; do sleep 0.02; done; echo out"))
    done = psij.Job(psij.JobSpec(executable="/bin/sh", arguments=["-c", "exit 4"]))
    ex.submit(running)
    ex.submit(done)
    assert final(done).state is JobState.FAILED
    assert running.wait(timeout=WAIT, target_states=JobState.ACTIVE) is not None

    fresh = pilot.executor()
    assert fresh is not ex
    # A finished job: attach yields its final status at once, with its exit code.
    again = psij.Job()
    fresh.attach(again, str(done.native_id))
    assert again.native_id == done.native_id
    assert again.status.state is JobState.FAILED and again.status.exit_code == 4
    # A running one: followed to its end.
    rec = Recorder()
    follower = psij.Job()
    follower.set_job_status_callback(rec)
    fresh.attach(follower, str(running.native_id))
    assert follower.status.state is JobState.ACTIVE
    with pytest.raises(psij.InvalidJobException):  # the specification's exception for a job not NEW
        fresh.attach(follower, str(running.native_id))
    gate.touch()
    st = final(follower)
    assert st.state is JobState.COMPLETED and st.exit_code == 0
    assert final(running).state is JobState.COMPLETED
    assert rec.done.wait(WAIT)
    assert rec.states() == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    # An id the pilot never gave out: the job moves to FAILED, saying why (it does not raise), and
    # whatever spec the passed Job held is discarded.
    unknown = psij.Job(psij.JobSpec(executable="/bin/true"))
    fresh.attach(unknown, "no-such-job-4711")
    assert unknown.status.state is JobState.FAILED and unknown.native_id == "no-such-job-4711"
    assert "no-such-job-4711" in str(unknown.status.message) and unknown.spec is None
    assert final(unknown).state is JobState.FAILED  # wait() returns at once


def test_attached_cancel_reaches_the_process(start_pilot, tmp_path: Path) -> None:
    """A job attached by a fresh executor can be canceled through it."""
    pilot = start_pilot()
    job = psij.Job(sh(f"echo $$ > {tmp_path / 'pid'}; exec sleep 60"))
    pilot.executor().submit(job)
    proc = read_pid(tmp_path / "pid")
    other = psij.Job()
    pilot.executor().attach(other, str(job.native_id))
    other.cancel()
    assert final(other).state is JobState.CANCELED
    assert final(job).state is JobState.CANCELED
    assert gone(proc)


def test_cancel_signal_reaches_task_as_sigterm(start_pilot, tmp_path: Path) -> None:
    """The canceled task gets SIGTERM first (it can clean up), and the job is still CANCELED."""
    pilot = start_pilot()
    ex = pilot.executor()
    trap = tmp_path / "trapped"
    job = psij.Job(
        sh(f"trap 'echo term > {trap}; exit 143' TERM; echo $$ > {tmp_path / 'pid'}; while :; do sleep 0.05; done")
    )
    ex.submit(job)
    proc = read_pid(tmp_path / "pid")
    job.cancel()
    st = final(job)
    assert st.state is JobState.CANCELED, st
    assert trap.read_text() == "term\n"
    assert gone(proc)


def test_executor_callback_object_interface(start_pilot) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    seen: list[JobState] = []
    done = threading.Event()

    class Cb:
        def job_status_changed(self, job: psij.Job, status: psij.JobStatus) -> None:
            seen.append(status.state)
            if status.final:
                done.set()

    ex.set_job_status_callback(Cb())
    job = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(job)
    assert final(job).state is JobState.COMPLETED
    assert done.wait(WAIT)
    assert seen == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]


def test_queue_project_and_reservation_are_checked_not_dropped(start_pilot) -> None:
    """A local pilot has no queue, project or reservation: a job naming one is refused at submit, saying
    so (issue 20: they were silently dropped)."""
    ex = start_pilot().executor()
    for attrs in (
        psij.JobAttributes(queue_name="debug"),
        psij.JobAttributes(project_name="chem"),
        psij.JobAttributes(reservation_id="r42"),
    ):
        with pytest.raises(psij.InvalidJobException, match=r"no allocation of this pilot runs there \(site 'main'"):
            ex.submit(psij.Job(psij.JobSpec("/bin/true", attributes=attrs)))

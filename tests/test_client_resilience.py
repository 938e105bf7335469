"""Clients survive too (issue 5): an executor whose daemon is SIGKILLed gets transient SubmitExceptions
instead of hanging, and follows a daemon restarted with ``pilot up`` on the same run directory by itself.

Real daemons, agents and tasks throughout. A SIGKILLed daemon's agents and their tasks outlive it on
purpose; the ``strays`` fixture kills whatever of them still runs once the test and its ``pilot down``
are over, so nothing is left behind.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import psij as psij_python
import psutil
import pytest
from conftest import PYTHON, Pilot
from pilot_waits import agents_active, callbacks_settled, gone, in_a_thread, list_when_back, wait_for

import client as psij
from client._psij_plugin import PilotJobExecutor
from pilot.store import JOURNAL_FILE

CONFIG = """
[pilot]
heartbeat_interval = 0.5
agent_timeout = 4

[allocation]
lrm = "local"
nodes = 1
cores_per_node = 4
"""

TIMEOUT = 5.0  # the executors' request_timeout here: a passing test never waits for it


def sh(script: str) -> psij.JobSpec:
    return psij.JobSpec(executable="/bin/sh", arguments=["-c", script])


def gated(gate: Path) -> psij.JobSpec:
    """A job that runs until ``gate`` exists: it is running across a daemon restart however long that takes."""
    return sh(f"while [ ! -e {gate} ]; do sleep 0.05; done")


class Seen:
    """The states a job's callback was given, in order."""

    def __init__(self, job: psij.Job) -> None:
        self.states: list[psij.JobState] = []
        self.messages: list[str | None] = []
        self._lock = threading.Lock()
        job.set_job_status_callback(self)

    def job_status_changed(self, job: psij.Job, status: psij.JobStatus) -> None:
        with self._lock:
            self.states.append(status.state)
            self.messages.append(status.message)

    def settled(self) -> list[psij.JobState]:
        """The states seen once the callback has had a final one (see ``callbacks_settled``)."""
        callbacks_settled(lambda: self.states, "the job")
        with self._lock:
            return list(self.states)


@dataclass
class Restartable:
    """A pilot whose daemon the test kills and starts again on the same run directory."""

    pilot: Pilot
    strays: list[psutil.Process]
    executors: list[psij.JobExecutor] = field(default_factory=list)

    def executor(self, *, request_timeout: float = TIMEOUT, pipelined: bool = False) -> psij.JobExecutor:
        """An executor of the pilot; by default one that waits for each submit's answer (the guarantees of
        that round trip are what most tests here check; the pipelined default's are checked apart)."""
        ex = psij.JobExecutor.get_instance(
            "pilot", url=str(self.pilot.rundir.path), request_timeout=request_timeout, pipelined=pipelined
        )
        self.pilot.executors.append(ex)  # closed by the start_pilot fixture
        return ex

    def kill_daemon(self, *, with_agents: bool = False) -> None:
        """SIGKILL the daemon; its agents and their tasks keep running (and are the test's to clean up),
        unless ``with_agents``: then they are killed too, as when the whole allocation is lost."""
        daemon = psutil.Process(self.pilot.pid)
        children = daemon.children(recursive=True)
        self.strays.extend(children)
        daemon.kill()
        wait_for(lambda: gone(daemon), what="the daemon to die")
        assert self.pilot.rundir.read_info() is None
        if with_agents:
            for proc in children:
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
            wait_for(lambda: all(gone(proc) for proc in children), what="the agents and tasks to die")

    def kill_with_requests_in_flight(
        self, ex: psij.JobExecutor, call: Callable[[], object], *, in_flight: int
    ) -> tuple[threading.Thread, list[BaseException]]:
        """Run ``call`` (a submit) in a thread while the daemon is stopped, so its ``in_flight`` requests are
        sent and unanswered; then SIGKILL the daemon. The thread (still waiting) and what it raises."""
        daemon = psutil.Process(self.pilot.pid)
        daemon.suspend()  # reads nothing: the requests are in flight, unanswered, when the daemon dies
        errors: list[BaseException] = []
        try:
            t = in_a_thread(call, errors)
            conn = ex._backend.connection
            wait_for(lambda: conn.in_flight() == in_flight, what=f"{in_flight} request(s) to be sent")
            self.kill_daemon()
        finally:
            try:
                daemon.resume()
            except psutil.NoSuchProcess:
                pass
        return t, errors

    def die_with_requests_in_flight(
        self, ex: psij.JobExecutor, call: Callable[[], object], *, in_flight: int
    ) -> list[BaseException]:
        """:meth:`kill_with_requests_in_flight`, no daemon coming back: the call must end (not hang);
        what it raised."""
        t, errors = self.kill_with_requests_in_flight(ex, call, in_flight=in_flight)
        t.join(30)
        assert not t.is_alive(), "the in-flight submit hangs"
        return errors

    def up_again(self, *, forget_jobs: bool = False) -> None:
        """``pilot up`` on the same run directory; ``forget_jobs`` removes the journal first and starts the
        new daemon with ``--fresh`` (without it, a lost journal is refused), so it starts empty."""
        if not forget_jobs:
            self.pilot.up_again()
            return
        for suffix in ("", "-wal", "-shm"):
            (self.pilot.rundir.path / f"{JOURNAL_FILE}{suffix}").unlink(missing_ok=True)
        p = self.pilot
        proc = subprocess.run(
            [PYTHON, "-m", "pilot", "up", "--fresh", "--config", str(p.config), "--rundir", str(p.rundir.path)],
            env=p.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, f"pilot up --fresh failed: {proc.stdout}\n{proc.stderr}"


@pytest.fixture
def strays() -> Iterator[list[psutil.Process]]:
    """Processes a SIGKILLed daemon left behind. Set up before the pilot, so torn down after its
    ``pilot down``: whatever of them still runs then (with what it started since) is killed."""
    procs: list[psutil.Process] = []
    yield procs
    found: dict[int, psutil.Process] = {}
    for proc in procs:
        try:
            if proc.is_running():
                found[proc.pid] = proc
                found.update((c.pid, c) for c in proc.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    for proc in found.values():
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(list(found.values()), timeout=10)
    assert not [p for p in alive if not gone(p)], f"could not clean up after the killed daemon: {alive}"


@pytest.fixture
def restartable(strays: list[psutil.Process], start_pilot: Callable[..., Pilot]) -> Restartable:
    return Restartable(start_pilot(CONFIG), strays)


def final(job: psij.Job, timeout: float = 30) -> psij.JobStatus:
    status = job.wait(timeout=timeout)
    assert status is not None and status.final, f"job {job.native_id} not final after {timeout} s: {job.status}"
    return status


# -- a dead daemon: transient errors, not hangs ----------------------------------------------------


@pytest.mark.timeout(90)
def test_submit_to_a_killed_daemon_is_transient_and_the_same_executor_reconnects(restartable: Restartable) -> None:
    r = restartable
    ex = r.executor()
    agents_active(ex, 1)
    held = [psij.Job(sh("sleep 3")) for _ in range(2)]
    for job in held:
        ex.submit(job)
    conn = ex._backend.connection

    r.kill_daemon()
    # The timeout marker is the "does not hang" bound; the error is expected long before request_timeout.
    job = psij.Job(sh("true"))
    with pytest.raises(psij.SubmitException) as err:
        ex.submit(job)
    assert err.value.transient, err.value
    assert job.status.state is psij.JobState.NEW and job.native_id is None and job.executor is None
    with pytest.raises(psij.SubmitException) as err:
        ex.list()
    assert err.value.transient and "pilot up" in str(err.value), err.value

    r.up_again()
    # The same executor object, on the same connection, which found the new daemon by itself. (Whether
    # the job then completes is the daemon's business: one that restarts empty numbers jobs from 1 again
    # while the old agents still run the old job 1; the tests below run new jobs on a clean restart.)
    again = psij.Job(sh("true"))
    seen = Seen(again)
    ex.submit(again)
    assert again.native_id is not None  # minted by the client from its leased ids: no answer needed
    final(again)
    assert seen.states[0] is psij.JobState.QUEUED
    assert ex._backend.connection is conn and conn.connects == 2
    # The jobs held across the restart end one way or the other (run on, or lost): wait() never hangs.
    for job in held:
        final(job)


@pytest.mark.timeout(90)
def test_submit_in_flight_when_the_daemon_dies_is_answered_by_the_next_daemon_and_runs_once(
    restartable: Restartable, tmp_path: Path
) -> None:
    """Issue 19 changed this promise: a submit in flight when its daemon dies is no longer failed with
    "may or may not have been accepted". It carries a submit id, waits (within request_timeout) for
    the next daemon on the run directory, is sent to it again, and its job runs once."""
    r = restartable
    ex = r.executor(request_timeout=60)
    agents_active(ex, 1)
    out = tmp_path / "out"
    job = psij.Job(sh(f"echo once >> {out}"))
    t, errors = r.kill_with_requests_in_flight(ex, lambda: ex.submit(job), in_flight=1)
    r.up_again()
    t.join(60)
    assert not t.is_alive() and not errors, errors
    assert final(job).state is psij.JobState.COMPLETED
    assert ex.list() == [job.native_id]
    assert out.read_text() == "once\n"


@pytest.mark.timeout(120)
def test_pipelined_submits_and_a_lease_in_flight_when_the_daemon_dies_are_answered_by_the_next(
    restartable: Restartable, tmp_path: Path
) -> None:
    """The default executor: jobs sent and unanswered when the daemon is SIGKILLed are sent again to the
    next daemon on the run directory and run once each; an executor whose first lease of job ids was in
    flight gets its ids from the next daemon, and its job runs once."""
    r = restartable
    ex = r.executor(request_timeout=60, pipelined=True)
    agents_active(ex, 1)
    warm = psij.Job(sh("true"))
    ex.submit(warm)  # its first submit leased the ids the next ones use
    assert final(warm).state is psij.JobState.COMPLETED
    out = tmp_path / "out"
    jobs = [psij.Job(sh(f"echo {i} >> {out}")) for i in range(20)]

    def submit_all() -> None:
        for job in jobs:
            ex.submit(job)

    t, errors = r.kill_with_requests_in_flight(ex, submit_all, in_flight=2)
    t.join(30)
    assert not t.is_alive() and not errors, errors
    r.up_again()
    for job in jobs:
        assert final(job).state is psij.JobState.COMPLETED, job.status
    fresh = r.executor(request_timeout=60, pipelined=True)
    late = psij.Job(sh(f"echo late >> {out}"))
    t2, errors2 = r.kill_with_requests_in_flight(fresh, lambda: fresh.submit(late), in_flight=1)
    r.up_again()
    t2.join(60)
    assert not t2.is_alive() and not errors2, errors2
    for job in [*jobs, late]:
        assert final(job).state is psij.JobState.COMPLETED, job.status
    assert sorted(out.read_text().split()) == sorted([*map(str, range(20)), "late"])
    assert len({job.native_id for job in [warm, *jobs, late]}) == 22


@pytest.mark.timeout(90)
def test_submit_in_flight_when_the_daemon_dies_for_good_is_withdrawn(restartable: Restartable) -> None:
    """No daemon back within request_timeout: the submit raises, transient, saying it was withdrawn --
    a definite answer: a daemon started later on the run directory does not run it."""
    r = restartable
    ex = r.executor(request_timeout=1)
    agents_active(ex, 1)
    job = psij.Job(sh("true"))
    errors = r.die_with_requests_in_flight(ex, lambda: ex.submit(job), in_flight=1)
    assert len(errors) == 1 and isinstance(errors[0], psij.SubmitException), errors
    assert errors[0].transient
    assert "it was withdrawn: no pilot of" in str(errors[0]), errors[0]
    assert job.status.state is psij.JobState.NEW and job.native_id is None

    r.up_again()
    assert list_when_back(ex) == []
    ok = psij.Job(sh("true"))
    ex.submit(ok)
    assert final(ok).state is psij.JobState.COMPLETED


def appending_group(out: Path) -> str:
    """An SSS JobGroup of two jobs, each appending its name to ``out``: what ran, and how often."""
    script = out.with_name("append.sh")
    script.write_text(f"#!/bin/sh\necho $1 >> {out}\n")
    script.chmod(0o755)
    jobs = "".join(
        f"<Job><Id>{name}</Id><Executable>{script}</Executable><Arguments>{name}</Arguments></Job>"
        for name in ("first", "second")
    )
    return f"<JobGroup><Id>pair</Id>{jobs}</JobGroup>"


@pytest.mark.timeout(90)
def test_a_document_in_flight_when_the_daemon_dies_is_answered_by_the_next_daemon_and_runs_once(
    restartable: Restartable, tmp_path: Path
) -> None:
    """An SSS document travels under one submit id for all its jobs, as a PSI/J job does: in flight when
    its daemon dies, it is sent again to the next daemon and each of its jobs runs once (issue 19)."""
    r = restartable
    ex = r.executor(request_timeout=60)
    agents_active(ex, 1)
    out = tmp_path / "out"
    made: list[list[psij.Job]] = []

    def submit() -> None:
        made.append(list(ex.submit_sss(appending_group(out))))

    t, errors = r.kill_with_requests_in_flight(ex, submit, in_flight=1)
    r.up_again()
    t.join(60)
    assert not t.is_alive() and not errors, errors
    (jobs,) = made
    assert [final(job).state for job in jobs] == [psij.JobState.COMPLETED] * 2
    assert sorted(ex.list()) == sorted(str(job.native_id) for job in jobs)
    assert sorted(out.read_text().split()) == ["first", "second"]


@pytest.mark.timeout(90)
def test_a_document_in_flight_when_the_daemon_dies_for_good_is_withdrawn(
    restartable: Restartable, tmp_path: Path
) -> None:
    """No daemon back within request_timeout: submit_sss raises, transient, saying the document was
    withdrawn; a daemon started later on the run directory runs none of its jobs."""
    r = restartable
    ex = r.executor(request_timeout=1)
    agents_active(ex, 1)
    out = tmp_path / "out"
    errors = r.die_with_requests_in_flight(ex, lambda: ex.submit_sss(appending_group(out)), in_flight=1)
    assert len(errors) == 1 and isinstance(errors[0], psij.SubmitException), errors
    assert errors[0].transient and "it was withdrawn: no pilot of" in str(errors[0]), errors[0]
    r.up_again()
    assert list_when_back(ex) == []
    assert not out.exists()


@pytest.mark.timeout(60)
def test_a_stopped_daemon_is_waited_for_by_submits_and_times_out_other_requests(restartable: Restartable) -> None:
    """Issue 19 changed this promise: a submit to a daemon that is alive but stopped no longer fails at
    request_timeout with "may still be accepted" (and is then accepted behind the caller's back): it
    waits for the daemon and gets its answer. Other requests still time out."""
    r = restartable
    ex = r.executor(request_timeout=1)
    agents_active(ex, 1)
    daemon = psutil.Process(r.pilot.pid)
    job = psij.Job(sh("true"))
    submitted = threading.Thread(target=ex.submit, args=(job,))
    daemon.suspend()
    try:
        submitted.start()
        with pytest.raises(psij.SubmitException) as err:
            ex.list()
        assert err.value.transient and "request_timeout" in str(err.value), err.value
        assert submitted.is_alive() and job.status.state is psij.JobState.NEW  # several timeouts later
    finally:
        daemon.resume()
    submitted.join(30)
    assert not submitted.is_alive() and job.native_id is not None
    assert final(job).state is psij.JobState.COMPLETED
    assert ex.list() == [job.native_id]


# -- a restarted daemon: jobs are followed again ---------------------------------------------------


@pytest.mark.timeout(90)
def test_jobs_a_restarted_daemon_lost_end_failed_saying_so(restartable: Restartable, tmp_path: Path) -> None:
    r = restartable
    ex = r.executor()
    agents_active(ex, 1)
    gate = tmp_path / "gate"
    held = [psij.Job(gated(gate)) for _ in range(2)]
    seen = [Seen(job) for job in held]
    for job in held:
        ex.submit(job)
        assert job.wait(timeout=20, target_states=[psij.JobState.ACTIVE]) is not None
    # Everything lost: the daemon, its journal, its agents and their tasks. The new daemon knows nothing.
    r.kill_daemon(with_agents=True)
    r.up_again(forget_jobs=True)
    for job, s in zip(held, seen, strict=True):
        status = final(job)
        assert status.state is psij.JobState.FAILED, status
        assert status.message is not None and "restarted" in status.message, status.message
        assert f"job {job.native_id}" in status.message, status.message
        assert s.settled() == [psij.JobState.QUEUED, psij.JobState.ACTIVE, psij.JobState.FAILED], s.states
    # The new daemon numbers its jobs from 1 again: a new job with a lost one's id is its own job.
    new = psij.Job(sh("true"))
    new_seen = Seen(new)
    ex.submit(new)
    assert new.native_id in {job.native_id for job in held}
    assert final(new).state is psij.JobState.COMPLETED  # before the next restart forgets it too
    assert psij.JobState.FAILED not in new_seen.states
    # A pipelined executor gives its jobs ids leased from the lost daemon: the new one takes them on (and
    # the block they come from), so a lost job's id is never given to a new job of it.
    piped = r.executor(pipelined=True)
    before = psij.Job(sh("true"))
    piped.submit(before)
    assert final(before).state is psij.JobState.COMPLETED
    r.kill_daemon(with_agents=True)
    r.up_again(forget_jobs=True)
    after = [psij.Job(sh("true")) for _ in range(3)]
    for job in after:
        piped.submit(job)
    assert [final(job).state for job in after] == [psij.JobState.COMPLETED] * 3
    ids = [int(job.native_id or 0) for job in [before, *after]]
    assert ids == sorted(set(ids)) and ids[0] > 0, ids
    assert all(job.status.state is psij.JobState.FAILED for job in held)
    gate.touch()


_FOLLOWER = textwrap.dedent(
    """
    import json, sys
    import client as psij

    url, ids = sys.argv[1], sys.argv[2:]
    ex = psij.JobExecutor.get_instance("pilot", url=url, request_timeout=10)
    out = {"list": ex.list(), "final": {}}
    for native_id in ids:
        job = psij.Job()
        ex.attach(job, native_id)
        status = job.wait(timeout=60)
        out["final"][native_id] = None if status is None else status.state.value
    ex.close()
    print(json.dumps(out))
    """
)


def follow(r: Restartable, *ids: str) -> dict[str, object]:
    """list() and attach(ids) -> final states, from a new process."""
    proc = subprocess.run(
        [PYTHON, "-c", _FOLLOWER, str(r.pilot.rundir.path), *ids],
        env=r.pilot.env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout)
    return out


@pytest.mark.timeout(90)
def test_list_and_attach_work_from_a_new_process_after_a_restart(restartable: Restartable) -> None:
    r = restartable
    ex = r.executor()
    agents_active(ex, 1)
    r.kill_daemon()
    r.up_again()
    job = psij.Job(sh("true"))
    ex.submit(job)
    assert final(job).state is psij.JobState.COMPLETED
    assert job.native_id is not None
    out = follow(r, job.native_id)
    assert isinstance(out["list"], list) and job.native_id in out["list"], out
    assert out["final"] == {job.native_id: "COMPLETED"}, out


@pytest.mark.timeout(120)
def test_callbacks_and_wait_resume_for_jobs_submitted_before_the_kill(restartable: Restartable, tmp_path: Path) -> None:
    r = restartable
    ex = r.executor()
    agents_active(ex, 1)
    gate = tmp_path / "gate"
    held = [psij.Job(sh(f"while [ ! -e {gate} ]; do sleep 0.05; done; exit {code}")) for code in (0, 3)]
    seen = [Seen(job) for job in held]
    for job in held:
        ex.submit(job)
        assert job.wait(timeout=20, target_states=[psij.JobState.ACTIVE]) is not None
    ids = [str(job.native_id) for job in held]
    r.kill_daemon()
    r.up_again()
    # A new process finds the jobs and can follow them too.
    follower = subprocess.Popen(
        [PYTHON, "-c", _FOLLOWER, str(r.pilot.rundir.path), *ids],
        env=r.pilot.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        gate.touch()
        statuses = [final(job, 60) for job in held]
        out, err = follower.communicate(timeout=90)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert [s.state for s in statuses] == [psij.JobState.COMPLETED, psij.JobState.FAILED], statuses
    assert statuses[1].exit_code == 3
    for s in seen:
        states = s.settled()
        assert states[:2] == [psij.JobState.QUEUED, psij.JobState.ACTIVE], states
        assert len(states) == 3, states
    assert follower.returncode == 0, err
    found = json.loads(out)
    assert set(ids) <= set(found["list"]), found
    assert found["final"] == {ids[0]: "COMPLETED", ids[1]: "FAILED"}, found


# -- the psij-python plugin shares all of it --------------------------------------------------------


@pytest.mark.timeout(90)
def test_psij_plugin_executor_gets_transient_errors_and_reconnects(restartable: Restartable) -> None:
    r = restartable
    agents_active(r.executor(), 1)
    ex = PilotJobExecutor(url=str(r.pilot.rundir.path), request_timeout=TIMEOUT)
    try:
        r.kill_daemon()
        job = psij_python.Job(psij_python.JobSpec("/bin/true"))
        with pytest.raises(psij_python.SubmitException) as err:
            ex.submit(job)
        assert err.value.transient
        assert job.status.state == psij_python.JobState.NEW and job.executor is None
        r.up_again()
        again = psij_python.Job(psij_python.JobSpec("/bin/true"))
        ex.submit(again)
        status = again.wait(timeout=timedelta(seconds=30))
        assert status is not None and status.state == psij_python.JobState.COMPLETED, status
    finally:
        ex.close()


# -- options and threads -----------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_request_timeout_must_be_a_positive_number(bad: float) -> None:
    with pytest.raises(ValueError, match="request_timeout"):
        psij.JobExecutor(request_timeout=bad)
    with pytest.raises(ValueError, match="request_timeout"):
        PilotJobExecutor(request_timeout=bad)


@pytest.mark.timeout(60)
def test_closing_the_last_executor_joins_the_connection_threads(start_pilot: Callable[..., Pilot]) -> None:
    p = start_pilot(CONFIG)
    url = str(p.rundir.path)
    first = psij.JobExecutor.get_instance("pilot", url=url)
    second = psij.JobExecutor.get_instance("pilot", url=url)
    job = psij.Job(sh("true"))
    first.submit(job)
    conn = first._backend.connection
    assert second._backend.connection is conn, "one connection per process and pilot"
    first.close()
    assert not conn.closed, "another executor still uses it"
    assert final(job).state is psij.JobState.COMPLETED
    second.close()
    assert conn.closed
    assert not any(worker.is_alive() for worker in conn._workers)


@pytest.mark.timeout(120)
def test_a_submit_is_not_given_up_while_its_daemon_lives_though_the_io_thread_is_held_up(
    restartable: Restartable,
) -> None:
    """The I/O thread, held up (here: its socket lock taken; in the wild: a flood of statuses), cannot
    note that the daemon lives; a submit waiting on a stopped daemon must not be given up for that: its
    caller looks at the run directory itself. Before that, it was withdrawn after request_timeout + 2.5 s
    with 'its daemon is not running'."""
    r = restartable
    ex = r.executor(request_timeout=1.0)
    agents_active(ex, 1)
    conn = ex._backend.connection  # type: ignore[attr-defined]
    daemon = psutil.Process(r.pilot.pid)
    job = psij.Job(sh("true"))
    daemon.suspend()
    errors: list[BaseException] = []
    try:
        t = in_a_thread(lambda: ex.submit(job), errors)
        wait_for(lambda: conn.in_flight() == 1, what="the submit to be sent")
        with conn._sock_lock:  # the I/O thread stops at its next read of the socket
            t.join(6)  # well past request_timeout + ALIVE_SLACK (3.5 s)
            assert t.is_alive() and not errors, errors
    finally:
        daemon.resume()
    t.join(30)
    assert not t.is_alive() and not errors, errors
    assert final(job).state is psij.JobState.COMPLETED

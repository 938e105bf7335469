"""The ``pilot`` executor plugin for psij-python 0.9.11, driven through psij-python itself.

``import psij`` here is psij-python from PyPI, not our ``client``: the plugin is found by psij's
``psij-descriptors`` scan (the project root is on sys.path through the compat editable install, or
site-packages through a normal one). Every job runs on a real pilot started with ``pilot up``.
psij-python's own suite runs against the plugin through ``tests/psij_suite/run.sh``.
"""

from __future__ import annotations

import os
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psij
import psutil
import pytest
from packaging.version import Version

import pilot
from client._psij_plugin import PilotJobExecutor
from pilot.rundir import RunDir

WAIT = timedelta(seconds=30)  # a passing test never gets near it

TWO_CORES = """
[allocation]
lrm = "local"
nodes = 1
cores_per_node = 2
"""


def sh(script: str, **kwargs: Any) -> psij.JobSpec:
    return psij.JobSpec(executable="/bin/sh", arguments=["-c", script], **kwargs)


def final(job: psij.Job) -> psij.JobStatus:
    status = job.wait(timeout=WAIT)
    assert status is not None, f"job {job.native_id} not final after {WAIT}: {job.status}"
    assert status.final
    return status


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Recorder:
    """What a job's status callback saw, and when its final state came."""

    def __init__(self) -> None:
        self.states: list[psij.JobState] = []
        self.final = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, job: psij.Job, status: psij.JobStatus) -> None:
        with self._lock:
            self.states.append(status.state)
        if status.final:
            self.final.set()


Executors = Callable[..., PilotJobExecutor]


@pytest.fixture
def executors() -> Iterator[Executors]:
    made: list[PilotJobExecutor] = []

    def make(url: str | None = None, config: psij.JobExecutorConfig | None = None) -> PilotJobExecutor:
        ex = psij.JobExecutor.get_instance("pilot", url=url, config=config)
        assert isinstance(ex, PilotJobExecutor)
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.close()


# -- registration -----------------------------------------------------------------------------------


def test_get_instance_returns_our_class_and_connects_to_nothing(pilot_home: Path) -> None:
    assert "pilot" in psij.JobExecutor.get_executor_names()
    ex = psij.JobExecutor.get_instance("pilot")
    # The descriptor points at a shim; the class is the one a normal import gives (one identity).
    assert type(ex) is PilotJobExecutor
    assert isinstance(ex, psij.JobExecutor)
    assert ex.name == "pilot"
    assert ex.version == Version(pilot.__version__)
    assert isinstance(ex.config, psij.JobExecutorConfig)
    assert type(psij.JobExecutor.get_instance("pilot", version_constraint=f">={pilot.__version__}")) is PilotJobExecutor
    # psij builds one of every registered executor at test collection: that must start nothing.
    assert list(pilot_home.iterdir()) == []
    ex.close()


# -- jobs on a real pilot ---------------------------------------------------------------------------


def test_completed_job_reports_every_state_once_and_delivered(
    start_pilot: Any, executors: Executors, tmp_path: Path
) -> None:
    p = start_pilot()
    ex = executors(str(p.rundir.path))
    out = tmp_path / "out"
    job = psij.Job(psij.JobSpec("/bin/echo", ["-n", "hello"], stdout_path=out))
    rec = Recorder()
    job.set_job_status_callback(rec)
    ex.submit(job)
    assert job.native_id is not None
    assert job.executor is ex
    status = final(job)
    assert status.state == psij.JobState.COMPLETED, status.message
    assert status.exit_code == 0
    assert out.read_text() == "hello"  # complete when the final status arrives
    md: dict[str, Any] = dict(status.metadata or {})
    assert md["nodes"] == ["local-0"]
    assert md["processors"] == 1
    assert md["processes"] == 1
    assert md["exit_code"] == 0
    assert md["wall_duration"] > 0
    assert md["user_cpu_time"] >= 0 and md["system_cpu_time"] >= 0 and md["max_rss"] > 0
    assert rec.final.wait(WAIT.total_seconds())
    assert rec.states == [psij.JobState.QUEUED, psij.JobState.ACTIVE, psij.JobState.COMPLETED]


def test_many_concurrent_jobs_each_see_every_state_once_in_order(start_pilot: Any, executors: Executors) -> None:
    # What psij's test_callbacks asks of its local executor, for a burst of jobs: statuses of one job
    # come from the submitting thread and the connection's dispatch thread, and must still be seen
    # once each, in order (psij's own setter does not serialise them; the plugin's per-job feed does).
    p = start_pilot(TWO_CORES)
    ex = executors(str(p.rundir.path))
    jobs = [psij.Job(psij.JobSpec("/bin/true")) for _ in range(40)]
    recs = [Recorder() for _ in jobs]
    for job, rec in zip(jobs, recs, strict=True):
        job.set_job_status_callback(rec)
        ex.submit(job)
    for job, rec in zip(jobs, recs, strict=True):
        assert final(job).state == psij.JobState.COMPLETED
        assert rec.final.wait(WAIT.total_seconds())
        assert rec.states == [psij.JobState.QUEUED, psij.JobState.ACTIVE, psij.JobState.COMPLETED], job.native_id
        assert job.status.state == psij.JobState.COMPLETED
    assert len({job.native_id for job in jobs}) == len(jobs)


def test_a_pipelined_executor_from_psij_config_submits_before_the_answer(start_pilot: Any) -> None:
    """``config.pipelined = True`` through psij's own get_instance: statuses still come once each, in
    order, and a job the pilot refuses ends FAILED with the pilot's reason instead of raising."""
    p = start_pilot(TWO_CORES)
    config = psij.JobExecutorConfig()
    config.pipelined = True  # type: ignore[attr-defined]
    ex = psij.JobExecutor.get_instance("pilot", url=str(p.rundir.path), config=config)
    try:
        assert ex._backend.pipeline is not None  # type: ignore[attr-defined]
        jobs = [psij.Job(psij.JobSpec("/bin/true")) for _ in range(40)]
        recs = [Recorder() for _ in jobs]
        for job, rec in zip(jobs, recs, strict=True):
            job.set_job_status_callback(rec)
            ex.submit(job)
        too_big = psij.Job(psij.JobSpec("/bin/true", resources=psij.ResourceSpecV1(process_count=64)))
        ex.submit(too_big)
        for job, rec in zip(jobs, recs, strict=True):
            assert final(job).state == psij.JobState.COMPLETED
            assert rec.final.wait(WAIT.total_seconds())
            assert rec.states == [psij.JobState.QUEUED, psij.JobState.ACTIVE, psij.JobState.COMPLETED], job.native_id
        status = final(too_big)
        assert status.state == psij.JobState.FAILED and "can never run" in str(status.message), status
        assert len({job.native_id for job in [*jobs, too_big]}) == len(jobs) + 1 and None not in {too_big.native_id}
    finally:
        ex.close()


def test_failing_job_is_failed_with_its_exit_code(start_pilot: Any, executors: Executors) -> None:
    p = start_pilot()
    ex = executors(str(p.rundir.path))
    job = psij.Job(sh("exit 3"))
    ex.submit(job)
    status = final(job)
    assert status.state == psij.JobState.FAILED
    assert status.exit_code == 3
    assert status.message is not None and "3" in status.message


def test_cancel_ends_exactly_canceled_and_kills_the_process(
    start_pilot: Any, executors: Executors, tmp_path: Path
) -> None:
    p = start_pilot()
    ex = executors(str(p.rundir.path))
    pidfile = tmp_path / "pid"
    job = psij.Job(sh(f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && exec sleep 60"))
    rec = Recorder()
    job.set_job_status_callback(rec)
    ex.submit(job)
    assert job.wait(timeout=WAIT, target_states=[psij.JobState.ACTIVE]) is not None
    wait_for(pidfile.exists, "the task to write its pid")
    proc = psutil.Process(int(pidfile.read_text()))
    job.cancel()
    status = final(job)
    assert status.state == psij.JobState.CANCELED
    _, alive = psutil.wait_procs([proc], timeout=15)
    assert not alive, "the canceled task is still running"
    assert rec.final.wait(WAIT.total_seconds())
    assert rec.states == [psij.JobState.QUEUED, psij.JobState.ACTIVE, psij.JobState.CANCELED]
    assert job.status.state == psij.JobState.CANCELED
    job.cancel()  # a final job: nothing to do, no error


def test_attach_from_a_second_executor_instance(start_pilot: Any, executors: Executors, tmp_path: Path) -> None:
    p = start_pilot()
    url = str(p.rundir.path)
    ex = executors(url)
    gate = tmp_path / "gate"
    running = psij.Job(sh(f"while [ ! -e {gate} ]; do sleep 0.02; done"))
    failed = psij.Job(sh("exit 5"))
    ex.submit(running)
    ex.submit(failed)
    assert final(failed).state == psij.JobState.FAILED
    assert running.wait(timeout=WAIT, target_states=[psij.JobState.ACTIVE]) is not None

    ex2 = executors(url)
    assert ex2 is not ex
    # A job that already ended: its final status at once, exit code included.
    again = psij.Job()
    ex2.attach(again, str(failed.native_id))
    assert again.native_id == failed.native_id
    assert again.executor is ex2
    assert again.status.state == psij.JobState.FAILED and again.status.exit_code == 5
    # A running one: followed to its end.
    follower = psij.Job()
    rec = Recorder()
    follower.set_job_status_callback(rec)
    ex2.attach(follower, str(running.native_id))
    assert follower.status.state == psij.JobState.ACTIVE
    gate.touch()
    assert final(follower).state == psij.JobState.COMPLETED
    assert final(running).state == psij.JobState.COMPLETED
    assert rec.final.wait(WAIT.total_seconds())
    assert rec.states == [psij.JobState.QUEUED, psij.JobState.ACTIVE, psij.JobState.COMPLETED]
    # Attach needs a NEW job (InvalidJobException, the specification's); an id the pilot cannot find
    # moves the job to FAILED, saying so (it does not raise).
    with pytest.raises(psij.InvalidJobException):
        ex2.attach(follower, str(running.native_id))
    unknown = psij.Job()
    ex2.attach(unknown, "no-such-job")
    assert unknown.status.state == psij.JobState.FAILED and unknown.native_id == "no-such-job"
    assert "cannot attach" in str(unknown.status.message) and "no-such-job" in str(unknown.status.message)


def test_list_contains_the_id_right_after_submit(start_pilot: Any, executors: Executors, tmp_path: Path) -> None:
    p = start_pilot()
    url = str(p.rundir.path)
    ex = executors(url)
    gate = tmp_path / "gate"
    job = psij.Job(sh(f"while [ ! -e {gate} ]; do sleep 0.02; done"))
    ex.submit(job)
    assert job.native_id is not None
    assert job.native_id in ex.list()
    assert job.native_id in executors(url).list()  # every job of the pilot, not only this instance's
    gate.touch()
    assert final(job).state == psij.JobState.COMPLETED


def test_multiple_launcher_ranks_see_a_nodefile_line_per_process(
    start_pilot: Any, executors: Executors, tmp_path: Path
) -> None:
    p = start_pilot(TWO_CORES)
    ex = executors(str(p.rundir.path))
    out = tmp_path / "out"
    spec = sh('wc -l < "$PSIJ_NODEFILE"', stdout_path=out, launcher="multiple")
    spec.resources = psij.ResourceSpecV1(process_count=2)
    job = psij.Job(spec)
    ex.submit(job)
    status = final(job)
    assert status.state == psij.JobState.COMPLETED, status.message
    assert out.read_text().split() == ["2", "2"]  # two processes, appending to one file
    assert (status.metadata or {})["processors"] == 2


# -- errors -----------------------------------------------------------------------------------------


def test_a_job_that_can_never_fit_ends_failed_saying_why(start_pilot: Any, executors: Executors) -> None:
    """By default submit() does not wait for the pilot's answer: its refusal comes as FAILED, with the
    reason and the job's native id."""
    p = start_pilot()
    ex = executors(str(p.rundir.path))
    spec = psij.JobSpec("/bin/true")
    spec.resources = psij.ResourceSpecV1(node_count=5)
    job = psij.Job(spec)
    ex.submit(job)
    assert job.native_id is not None
    status = final(job)
    assert status.state == psij.JobState.FAILED and "can never run" in str(status.message), status
    assert job.native_id not in ex.list()


def test_a_job_that_can_never_fit_is_invalid_and_stays_new(start_pilot: Any, executors: Executors) -> None:
    """An executor that waits for each answer (``pipelined = False``) raises the refusal."""
    p = start_pilot()
    config = psij.JobExecutorConfig()
    config.pipelined = False  # type: ignore[attr-defined]
    ex = executors(str(p.rundir.path), config)
    spec = psij.JobSpec("/bin/true")
    spec.resources = psij.ResourceSpecV1(node_count=5)
    job = psij.Job(spec)
    with pytest.raises(psij.InvalidJobException):
        ex.submit(job)
    assert job.status.state == psij.JobState.NEW
    assert job.executor is None and job.native_id is None
    # The same Job may be submitted again once fixed.
    spec.resources = psij.ResourceSpecV1(node_count=1)
    ex.submit(job)
    assert final(job).state == psij.JobState.COMPLETED


def test_no_pilot_at_the_url_is_a_transient_submit_error(pilot_home: Path, executors: Executors) -> None:
    ex = executors(str(pilot_home / "nobody-here"))
    job = psij.Job(psij.JobSpec("/bin/true"))
    with pytest.raises(psij.SubmitException) as info:
        ex.submit(job)
    assert info.value.transient
    assert job.status.state == psij.JobState.NEW and job.executor is None
    with pytest.raises(psij.SubmitException):
        ex.list()


def test_embedded_pilot_starts_on_demand_and_stops_at_close(
    pilot_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What psij-python's suite relies on: get_instance('pilot') with no url and no running pilot.
    cfg = tmp_path / "embedded.toml"
    cfg.write_text(textwrap.dedent(TWO_CORES))
    monkeypatch.setenv("PILOT_CONFIG", str(cfg))
    ex = psij.JobExecutor.get_instance("pilot")
    assert isinstance(ex, PilotJobExecutor)
    tree: list[psutil.Process] = []
    try:
        job = psij.Job(psij.JobSpec("/bin/true"))
        ex.submit(job)
        assert final(job).state == psij.JobState.COMPLETED
        infos = [RunDir(d).read_info() for d in pilot_home.glob(f"embedded-{os.getpid()}*")]
        running = [info for info in infos if info is not None]
        assert len(running) == 1, infos
        info = running[0]
        daemon = psutil.Process(int(info["pid"]))
        tree += [daemon, *daemon.children(recursive=True)]
        assert len(tree) >= 2  # the daemon and its agent
    finally:
        ex.close()
    _, alive = psutil.wait_procs(tree, timeout=20)
    assert not alive, f"the embedded pilot outlived the last executor: {alive}"


def test_an_embedded_pilot_that_did_not_stop_cleanly_is_not_resumed_by_the_next(
    pilot_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its run directory (journal and logs) is kept for the user; the next embedded pilot of the process
    starts in a run directory of its own, empty, instead of resuming that journal (whose allocation
    may have ended: every job would be refused)."""
    cfg = tmp_path / "embedded.toml"
    cfg.write_text(textwrap.dedent(TWO_CORES))
    monkeypatch.setenv("PILOT_CONFIG", str(cfg))

    def running() -> dict[Path, dict[str, Any]]:
        found = {d: RunDir(d).read_info() for d in pilot_home.glob(f"embedded-{os.getpid()}*")}
        return {d: info for d, info in found.items() if info is not None}

    ex = psij.JobExecutor.get_instance("pilot")
    try:
        job = psij.Job(psij.JobSpec("/bin/true"))
        ex.submit(job)
        assert final(job).state == psij.JobState.COMPLETED
        ((first, info),) = running().items()
        daemon = psutil.Process(int(info["pid"]))
        agents = daemon.children(recursive=True)
        for proc in [daemon, *agents]:
            proc.kill()
        psutil.wait_procs(agents, timeout=20)
        # The daemon is the client's child: left for the client to reap (its exit status says "killed").
        deadline = time.monotonic() + 20
        while daemon.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        ex.close()
    assert (first / "journal.db").exists()  # kept: it did not stop cleanly
    ex = psij.JobExecutor.get_instance("pilot")
    try:
        job = psij.Job(psij.JobSpec("/bin/true"))
        ex.submit(job)
        assert final(job).state == psij.JobState.COMPLETED
        ((second, _),) = running().items()
        assert second != first
    finally:
        ex.close()

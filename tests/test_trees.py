"""A task's whole tree dies with it: descendants that left its process group or session (``setsid``, a
daemon's double fork, one that ignores SIGTERM) are killed by cancel, walltime and the agent's stop,
and reaped by the agent, their child subreaper; other tasks' processes are untouched, and an adopted
process never produces a task event. Real processes: the engine driven directly (both ways of reaping),
then real pilots with each launcher and with pre/post-launch scripts."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from conftest import Pilot
from pilot_waits import agents_active, ends, gone, reach, wait_for

import client as psij
from agent.processes import ProcessEngine
from agent.trees import MARK
from pilot.model.node import NodeConfigured
from pilot.model.process_order import ProcessOrder
from pilot.wire.messages import TaskEvent

pytestmark = pytest.mark.timeout(120)

#: Started with the file to append pids to: three descendants that leave the caller's session, one by
#: setsid, one by a daemon's double fork (both parents gone), one that also ignores SIGTERM.
ESCAPE = """\
setsid sleep 300 &
echo $! >> "$1"
( setsid sh -c 'sleep 300 & echo $! >> "$1"' sh "$1" & )
setsid sh -c 'trap "" TERM; echo $$ >> "$1"; while :; do sleep 0.05; done' sh "$1" &
"""
PER_RUN = 3  # pids ESCAPE writes


def escape_script(tmp_path: Path) -> Path:
    path = tmp_path / "escape.sh"
    path.write_text(ESCAPE)
    return path


def escaped(pids: Path, n: int, timeout: float = 30) -> list[psutil.Process]:
    """The ``n`` processes whose pids were written to ``pids``, once they all run."""

    def ready() -> list[str] | None:
        lines = pids.read_text().split() if pids.exists() else []
        return lines if len(lines) >= n else None

    lines = wait_for(ready, timeout, f"{n} pids in {pids}")
    return [psutil.Process(int(pid)) for pid in lines]


def reaped(procs: list[psutil.Process], timeout: float = 30) -> None:
    """Every one of ``procs`` has exited and been reaped (a zombie still counts as there: only a reap by
    its parent, the agent for an adopted one, ends it)."""
    wait_for(lambda: not any(p.is_running() for p in procs), timeout, f"{procs} to be killed and reaped")


def running(procs: list[psutil.Process]) -> bool:
    return all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)


# -- the engine, driven directly -------------------------------------------------------------------------


@pytest.fixture(params=["pidfd", "wait4"])
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ProcessEngine:
    if request.param == "wait4":
        monkeypatch.setenv("PILOT_AGENT_PIDFDS", "0")
    else:
        monkeypatch.delenv("PILOT_AGENT_PIDFDS", raising=False)
    cpus = sorted(os.sched_getaffinity(0))
    node = NodeConfigured("n0", "localhost", cpus, 1 << 30)
    return ProcessEngine(node=node, workdir=tmp_path, notify=lambda: None, kill_grace=0.5)


def _order(job: str, script: str, cores: list[int]) -> ProcessOrder:
    return ProcessOrder(job_id=job, slot=0, role="rank", executable="/bin/sh", arguments=["-c", script], cores=cores)


def _two_cores() -> tuple[list[int], list[int]]:
    """Cores for two tasks that run together: a cpu each (a pinned spawner each, which waits for its own
    task), or on a one-cpu machine no core for the second (the general spawner's, the reaper's)."""
    cpus = sorted(os.sched_getaffinity(0))
    return [cpus[0]], ([cpus[-1]] if len(cpus) > 1 else [])


def _events(engine: ProcessEngine, got: list[TaskEvent], job: str, kind: str) -> Callable[[], bool]:
    def seen() -> bool:
        got.extend(engine.drain())
        return any(e.job_id == job and e.kind == kind for e in got)

    return seen


def _no_zombie_children() -> bool:
    return not [c for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]


def test_engine_kill_takes_the_whole_tree_and_no_other_task(engine: ProcessEngine, tmp_path: Path) -> None:
    script = escape_script(tmp_path)
    first, second = _two_cores()
    engine.start()
    got: list[TaskEvent] = []
    try:
        engine.submit(
            [
                _order("a", f"sh {script} {tmp_path / 'a'}; exec sleep 300", first),
                _order("b", f"sh {script} {tmp_path / 'b'}; exec sleep 300", second),
            ]
        )
        a, b = escaped(tmp_path / "a", PER_RUN), escaped(tmp_path / "b", PER_RUN)
        # Each carries its task's mark (this process is the agent here), which its own descendants inherit.
        marks = {p.environ()[MARK] for p in a}
        assert len(marks) == 1 and marks.pop().startswith(f"{os.getpid()}:"), [p.environ() for p in a]
        assert engine.kill(("a", 0), reason="canceled")
        reaped(a)  # the one that ignores SIGTERM too: SIGKILL after the grace
        wait_for(_events(engine, got, "a", "exited"), what="a's exit")
        assert running(b) and engine.is_running(("b", 0))
        assert engine.kill(("b", 0), reason="canceled")
        reaped(b)
        wait_for(_events(engine, got, "b", "exited"), what="b's exit")
        wait_for(_no_zombie_children, what="no zombie child of the engine's process")
        time.sleep(0.2)
        got += engine.drain()
        # One exit per task, none for the processes the engine adopted and reaped.
        assert sorted((e.job_id, e.kind) for e in got if e.kind != "started") == [("a", "exited"), ("b", "exited")]
        assert {e.data["reason"] for e in got if e.kind == "exited"} == {"canceled"}
    finally:
        engine.stop()


def test_engine_reaps_what_an_ended_task_left_and_its_stop_kills_the_rest(
    engine: ProcessEngine, tmp_path: Path
) -> None:
    """A task that ends by itself leaves its escaped descendants running (they end with the agent); one
    of them that exits later is reaped by the agent without any event; the engine's stop kills the rest,
    SIGTERM first, SIGKILL for the one that ignores it."""
    script = escape_script(tmp_path)
    engine.start()
    got: list[TaskEvent] = []
    stopped = False
    try:
        short = tmp_path / "short"
        engine.submit(
            [
                _order(
                    "left",
                    f"sh {script} {tmp_path / 'left'}; setsid sleep 0.3 & echo $! > {short}; exit 0",
                    _two_cores()[0],
                )
            ]
        )
        left = escaped(tmp_path / "left", PER_RUN)
        wait_for(_events(engine, got, "left", "exited"), what="the task's exit")
        (brief,) = escaped(short, 1)
        reaped([brief])
        assert running(left)
        wait_for(_no_zombie_children, what="no zombie child of the engine's process")
        got += engine.drain()
        (exited,) = [e for e in got if e.kind != "started"]
        assert (exited.job_id, exited.kind, exited.data["exit_code"]) == ("left", "exited", 0), got
        stop = threading.Thread(target=engine.stop)
        stop.start()
        stopped = True
        reaped(left)
        stop.join(timeout=30)
        assert not stop.is_alive()
    finally:
        if not stopped:
            engine.stop()


# -- real pilots: cancel, walltime, pilot down ------------------------------------------------------------

FOUR_CORES = '[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 4\n'


def _mpi_env() -> dict[str, str]:
    if os.geteuid() == 0:  # Open MPI refuses root unless told twice
        return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return {}


def _job(case: str, tmp_path: Path, pids: Path) -> tuple[psij.Job, int]:
    """A job whose processes leave their sessions, with the ``case`` launcher; and how many pids it writes."""
    script = escape_script(tmp_path)
    run = f"sh {script} {pids}; exec sleep 300"
    two = psij.ResourceSpecV1(process_count=2)
    if case == "single":
        return psij.Job(psij.JobSpec("/bin/sh", ["-c", run])), PER_RUN
    if case == "multiple":
        return psij.Job(psij.JobSpec("/bin/sh", ["-c", run], launcher="multiple", resources=two)), 2 * PER_RUN
    if case == "mpirun":
        if shutil.which("mpirun") is None:
            pytest.skip("mpirun is not installed")
        spec = psij.JobSpec("/bin/sh", ["-c", run], launcher="mpirun", resources=two, environment=_mpi_env())
        return psij.Job(spec), 2 * PER_RUN
    # pre_launch leaves its escapees and ends; the rank ends; post_launch leaves its own and runs on.
    pre = tmp_path / "pre.sh"
    pre.write_text(f"sh {script} {pids}\n")
    post = tmp_path / "post.sh"
    post.write_text(f"sh {script} {pids}\nsleep 300\n")
    return psij.Job(psij.JobSpec("/bin/true", pre_launch=pre, post_launch=post)), 2 * PER_RUN


@pytest.mark.parametrize("case", ["single", "multiple", "mpirun", "pre_post"])
def test_cancel_kills_every_descendant_of_the_job_and_nothing_else(
    case: str, start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    p = start_pilot(FOUR_CORES)
    ex = p.executor()
    agents_active(ex, 1)
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = psij.Job(
        psij.JobSpec("/bin/sh", ["-c", f"sh {escape_script(other_dir)} {other_dir / 'pids'}; exec sleep 300"])
    )
    job, n = _job(case, tmp_path, tmp_path / "pids")
    ex.submit_all([other, job])
    others = escaped(other_dir / "pids", PER_RUN)
    procs = escaped(tmp_path / "pids", n)
    reach(job, psij.JobState.ACTIVE)
    ex.cancel(job)
    ends(job, psij.JobState.CANCELED, timeout=30)
    reaped(procs)
    assert running(others) and other.status.state is psij.JobState.ACTIVE, other.status
    ex.cancel(other)
    ends(other, psij.JobState.CANCELED, timeout=30)
    reaped(others)


def test_walltime_kills_every_descendant(start_pilot: Callable[..., Pilot], tmp_path: Path) -> None:
    p = start_pilot('[pilot]\nkill_grace = 0.5\n[allocation]\nlrm = "local"\nnodes = 1\n')
    ex = p.executor()
    agents_active(ex, 1)
    run = f"sh {escape_script(tmp_path)} {tmp_path / 'pids'}; exec sleep 300"
    attrs = psij.JobAttributes(duration=timedelta(seconds=2))
    job = psij.Job(psij.JobSpec("/bin/sh", ["-c", run], attributes=attrs))
    ex.submit(job)
    procs = escaped(tmp_path / "pids", PER_RUN)
    status = ends(job, psij.JobState.FAILED, timeout=30)
    assert "walltime" in (status.message or ""), status
    reaped(procs)


def test_pilot_down_kills_every_descendant(start_pilot: Callable[..., Pilot], tmp_path: Path) -> None:
    """What a completed job left and what a running job's processes started, also outside their sessions:
    nothing outlives the pilot."""
    p = start_pilot(FOUR_CORES)
    ex = p.executor()
    agents_active(ex, 1)
    script = escape_script(tmp_path)
    done = psij.Job(psij.JobSpec("/bin/sh", ["-c", f"sh {script} {tmp_path / 'done'}"]))
    busy = psij.Job(psij.JobSpec("/bin/sh", ["-c", f"sh {script} {tmp_path / 'busy'}; exec sleep 300"]))
    ex.submit_all([done, busy])
    ends(done, psij.JobState.COMPLETED)
    procs = escaped(tmp_path / "done", PER_RUN) + escaped(tmp_path / "busy", PER_RUN)
    reach(busy, psij.JobState.ACTIVE)
    assert running(procs)
    p.cli("down")
    # The agent is gone too: what it could not reap is init's, so a zombie counts as gone here.
    wait_for(lambda: all(gone(proc) for proc in procs), 30, "every task's descendant to be gone")


def test_a_process_that_ignores_sigterm_outside_the_group_gets_sigkill_after_the_grace(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    """The task's own process exits on SIGTERM at once: its descendant that ignores SIGTERM is SIGKILLed
    all the same (the loop's SIGKILL is only for a task still running)."""
    p = start_pilot('[pilot]\nkill_grace = 0.5\n[allocation]\nlrm = "local"\nnodes = 1\n')
    ex = p.executor()
    agents_active(ex, 1)
    pid = tmp_path / "pid"
    stubborn = f"setsid sh -c 'trap \"\" TERM; echo $$ > {pid}; while :; do sleep 0.05; done' & exec sleep 300"
    job = psij.Job(psij.JobSpec("/bin/sh", ["-c", stubborn]))
    ex.submit(job)
    (proc,) = escaped(pid, 1)
    reach(job, psij.JobState.ACTIVE)
    ex.cancel(job)
    status = ends(job, psij.JobState.CANCELED)
    assert (status.metadata or {}).get("signal") == signal.SIGTERM, status.metadata
    reaped([proc])

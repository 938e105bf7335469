"""What a task gets from the agent's spawn path (posix_spawn from per-cpu spawner threads, each with its
own cwd, or Popen): exactly the process Popen would have made. Real pilots, real task processes that
report what they see."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Pilot

import client as psij
from client import JobState

WAIT = 30.0

TWO_CORES = """
[allocation]
lrm = "local"
nodes = 1
cores_per_node = 2
"""

_REPORT = """
import json, os, sys
def is_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
json.dump({
    "cwd": os.getcwd(),
    "fds": [fd for fd in range(3, 1024) if is_open(fd)],
    "sid_is_pid": os.getsid(0) == os.getpid(),
    "affinity": sorted(os.sched_getaffinity(0)),
}, open(sys.argv[1], "w"))
"""


def run(ex: psij.JobExecutor, spec: psij.JobSpec) -> psij.JobStatus:
    job = psij.Job(spec)
    ex.submit(job)
    status = job.wait(timeout=WAIT)
    assert status is not None and status.final, f"job {job.native_id} not final: {job.status}"
    return status


@pytest.mark.timeout(90)
def test_tasks_get_their_directory_only_fds_0_to_2_default_sigpipe_own_session_and_one_core(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    ex = start_pilot(TWO_CORES).executor()
    dirs = [tmp_path / "a", tmp_path / "b", tmp_path / "a"]  # the spawner's cwd moves, and back
    for d in dirs:
        d.mkdir(exist_ok=True)
    jobs = []
    for i, d in enumerate(dirs):
        job = psij.Job(
            psij.JobSpec(executable=sys.executable, arguments=["-c", _REPORT, f"report-{i}.json"], directory=str(d))
        )
        jobs.append(job)
    ex.submit_all(jobs)
    for i, (job, d) in enumerate(zip(jobs, dirs, strict=True)):
        status = job.wait(timeout=WAIT)
        assert status is not None and status.state is JobState.COMPLETED, status
        seen = json.loads((d / f"report-{i}.json").read_text())
        assert seen["cwd"] == str(d)
        assert seen["fds"] == [], f"the task inherited fds {seen['fds']}"
        assert seen["sid_is_pid"]
        assert len(seen["affinity"]) == 1, seen["affinity"]


@pytest.mark.timeout(60)
def test_tasks_do_not_inherit_the_signals_python_ignores(start_pilot: Callable[..., Pilot], tmp_path: Path) -> None:
    ex = start_pilot(TWO_CORES).executor()
    out = tmp_path / "sigign"
    st = run(ex, psij.JobSpec(executable="/bin/sh", arguments=["-c", f"grep SigIgn /proc/$$/status > {out}"]))
    assert st.state is JobState.COMPLETED
    ignored = int(out.read_text().split()[1], 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # the agent (Python) ignores them; a task must not
        assert not ignored & (1 << (sig - 1)), f"{sig.name} ignored in the task"


@pytest.mark.timeout(60)
def test_the_executable_is_looked_up_in_the_tasks_own_path(start_pilot: Callable[..., Pilot], tmp_path: Path) -> None:
    ex = start_pilot(TWO_CORES).executor()
    bin_dir = tmp_path / "mybin"
    bin_dir.mkdir()
    tool = bin_dir / "pilot-test-tool"
    out = tmp_path / "tool.out"
    tool.write_text(f"#!/bin/sh\necho ran > {out}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    st = run(ex, psij.JobSpec(executable="pilot-test-tool", environment={"PATH": f"{bin_dir}:{os.defpath}"}))
    assert st.state is JobState.COMPLETED and out.read_text() == "ran\n"
    # Not in the task's PATH: not found, and the message says where it looked.
    st = run(ex, psij.JobSpec(executable="pilot-test-tool"))
    assert st.state is JobState.FAILED and "not found in PATH" in (st.message or ""), st.message
    # No inherited environment at all: the default search path, as for Popen.
    st = run(ex, psij.JobSpec(executable="true", inherit_environment=False))
    assert st.state is JobState.COMPLETED, st


@pytest.mark.timeout(60)
def test_a_missing_directory_fails_the_task_and_the_next_one_still_runs(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    ex = start_pilot(TWO_CORES).executor()
    st = run(ex, psij.JobSpec(executable="/bin/true", directory=str(tmp_path / "nowhere")))
    assert st.state is JobState.FAILED and "does not exist" in (st.message or ""), st.message
    ok = tmp_path / "ok"
    st = run(ex, psij.JobSpec(executable="/bin/sh", arguments=["-c", f"pwd > {ok}"], directory=str(tmp_path)))
    assert st.state is JobState.COMPLETED and ok.read_text().strip() == str(tmp_path)

"""The allocation's walltime: jobs that cannot finish are not started; running ones stop before the end."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psutil
from pilot_waits import agents_active

import client as psij

CONFIG = '[pilot]\nwalltime_margin = 4\n[allocation]\nlrm = "local"\nnodes = 1\nwalltime = 12\n'


def _job(cmd: list[str], seconds: float) -> psij.Job:
    return psij.Job(psij.JobSpec(cmd[0], cmd[1:], attributes=psij.JobAttributes(duration=timedelta(seconds=seconds))))


def test_jobs_respect_the_allocations_walltime(start_pilot: Any) -> None:
    pilot = start_pilot(CONFIG)
    ex = pilot.executor()
    agents_active(ex, 1)
    too_long = _job(["/bin/true"], 300)
    ex.submit(too_long)
    status = too_long.wait(timeout=10)
    assert status is not None and status.state is psij.JobState.FAILED, status
    assert "cannot finish before the allocation's walltime ends" in (status.message or ""), status.message
    long_task = _job(["/bin/sleep", "60"], 10)  # fits the allocation, but still runs at its end
    ex.submit(long_task)
    active = long_task.wait(timeout=10, target_states=[psij.JobState.ACTIVE])
    assert active is not None and active.state is psij.JobState.ACTIVE
    pids = [p.pid for p in psutil.Process(pilot.pid).children(recursive=True) if p.name() == "sleep"]
    status = long_task.wait(timeout=20)
    assert status is not None and status.state is psij.JobState.FAILED, status
    assert "the allocation ends" in (status.message or "") and "walltime" in (status.message or ""), status.message
    assert status.time < pilot_end(ex), "the task was not stopped before the allocation's end"
    assert pids and not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    late = _job(["/bin/true"], 1)
    ex.submit(late)
    status = late.wait(timeout=10)
    assert status is not None and status.state is psij.JobState.FAILED and "walltime ends" in (status.message or "")


def pilot_end(ex: psij.JobExecutor) -> float:
    a = ex.pilot_status()["allocation"]
    return float(a["started"]) + float(a["walltime"])

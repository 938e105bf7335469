"""How an agent reaps: with pidfds (a pinned spawner waits for its own task, a reaper for the others by
pidfd) and as where pidfds are missing (``PILOT_AGENT_PIDFDS=0``: one reaper in ``wait4(-1)`` with a
sentinel child). Both must take every exit exactly once, with its code and rusage, whatever spawned it."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta

import psutil
import pytest
from conftest import Pilot
from pilot_waits import agents_active, ends, reach, wait_for

import client as psij

pytestmark = pytest.mark.timeout(120)


def agent_of(pilot: Pilot) -> psutil.Process:
    (agent,) = [c for c in psutil.Process(pilot.pid).children() if "agent" in " ".join(c.cmdline())]
    return agent


def sentinels(agent: psutil.Process) -> list[psutil.Process]:
    return [c for c in agent.children() if c.cmdline()[:3] == ["/bin/sh", "-c", "read _"]]


def helpers(agent: psutil.Process) -> list[psutil.Process]:
    """The spawners' helpers (agent.forkserver): children of the agent for its whole life."""
    return [c for c in agent.children() if os.path.basename(c.cmdline()[0]).startswith("forkserver-")]


@pytest.mark.parametrize("mode", ["pidfd", "wait4"])
def test_a_mixed_burst_is_reaped_exactly_once(
    mode: str, start_pilot: Callable[..., Pilot], monkeypatch: pytest.MonkeyPatch
) -> None:
    if mode == "wait4":
        monkeypatch.setenv("PILOT_AGENT_PIDFDS", "0")
    p = start_pilot('[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n')
    ex = p.executor()
    agents_active(ex, 1)
    agent = agent_of(p)
    # The mode is the one asked for: only the wait4(-1) reaper keeps a sentinel child.
    assert len(sentinels(agent)) == (1 if mode == "wait4" else 0)

    def sh(script: str, **kwargs: object) -> psij.JobSpec:
        return psij.JobSpec(executable="/bin/sh", arguments=["-c", script], **kwargs)  # type: ignore[arg-type]

    expected: list[tuple[psij.Job, int]] = []
    for i in range(150):  # one core each: a pinned spawner's own (pidfd mode)
        expected.append((psij.Job(sh(f"exit {i % 5}")), i % 5))
    for i in range(10):  # both cores: the general spawner's, waited for by the reaper
        res = psij.ResourceSpecV1(process_count=1, cpu_cores_per_process=2)
        expected.append((psij.Job(sh(f"exit {i % 3}", resources=res)), i % 3))
    for i in range(10):  # a pre_launch process first, then the rank
        expected.append((psij.Job(sh(f"exit {i % 2}", pre_launch="/dev/null")), i % 2))
    for _ in range(5):  # two ranks, one per core
        res = psij.ResourceSpecV1(process_count=2)
        expected.append((psij.Job(sh("exit 0", launcher="multiple", resources=res)), 0))
    long = psij.Job(psij.JobSpec(executable="/bin/sleep", arguments=["60"]))
    timed = psij.Job(
        psij.JobSpec(
            executable="/bin/sleep", arguments=["60"], attributes=psij.JobAttributes(duration=timedelta(seconds=1))
        )
    )
    ex.submit_all([long, timed] + [job for job, _ in expected])
    reach(long, psij.JobState.ACTIVE, timeout=60)
    ex.cancel(long)
    for job, code in expected:
        status = ends(job, psij.JobState.COMPLETED if code == 0 else psij.JobState.FAILED, timeout=60)
        assert status.exit_code == code, (job.native_id, status)
        md = status.metadata or {}
        assert md["wall_duration"] > 0 and md["user_cpu_time"] >= 0 and md["max_rss"] > 0, md
    ends(long, psij.JobState.CANCELED)
    status = ends(timed, psij.JobState.FAILED, timeout=30)
    assert "walltime" in str(status.message), status
    # Every exit was taken: the agent has no child left but its sentinel and helpers, and nothing runs twice.
    assert helpers(agent), "no spawn helper: the tasks were spawned from the agent's process"
    wait_for(
        lambda: len(agent.children()) == len(sentinels(agent)) + len(helpers(agent)),
        what="the agent's children to be reaped",
    )
    assert not [c for c in agent.children() if c.status() == psutil.STATUS_ZOMBIE]
    ok = sum(1 for _, code in expected if code == 0)
    assert ex.pilot_status()["jobs"] == {"COMPLETED": ok, "FAILED": len(expected) - ok + 1, "CANCELED": 1}

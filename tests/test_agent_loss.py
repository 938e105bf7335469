"""Agent loss (issue 5): an agent killed or frozen is declared lost after ``pilot.agent_timeout``; its
tasks end FAILED naming the node, or run again elsewhere when restartable; the other nodes' tasks are
untouched; a frozen agent that comes back is told to kill its orphaned tasks. Real agents, real
signals, real processes."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from conftest import Pilot
from pilot_waits import agents_active, gone, reach, read_pid, wait_for

import client as psij

pytestmark = pytest.mark.timeout(120)

CONFIG = """
[pilot]
heartbeat_interval = 0.5
agent_timeout = 3

[allocation]
lrm = "local"
nodes = 3
cores_per_node = 1
"""


@pytest.fixture
def orphans() -> Iterator[list[psutil.Process]]:
    """Tasks of a SIGKILLed agent outlive it (their own sessions; on a real node loss they die with the
    node): the test kills what it registered here."""
    procs: list[psutil.Process] = []
    yield procs
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def _sleeper(tmp_path: Path, name: str, *, restartable: bool = False, retries: int | None = None) -> psij.Job:
    custom: dict[str, object] = {}
    if restartable:
        custom["pilot.restartable"] = True
    if retries is not None:
        custom["pilot.retries"] = retries
    return psij.Job(
        psij.JobSpec(
            executable="/bin/sh",
            arguments=["-c", f"echo $$ >> {tmp_path / name}; exec sleep 60"],
            name=name,
            attributes=psij.JobAttributes(custom_attributes=custom),
        )
    )


def _agent_of(task: psutil.Process) -> tuple[psutil.Process, str]:
    agent = task.parent()
    assert agent is not None
    if os.path.basename(agent.cmdline()[0]).startswith("forkserver-"):  # a chained spawn helper's task
        agent = agent.parent()
        assert agent is not None
    node = agent.environ()["PILOT_AGENT_NODE"]
    return agent, node


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_killed_agent_fails_its_tasks_naming_the_node_others_untouched(
    start_pilot: Callable[..., Pilot], tmp_path: Path, orphans: list[psutil.Process]
) -> None:
    p = start_pilot(CONFIG)
    ex = p.executor()
    agents_active(ex, 3)
    jobs = [_sleeper(tmp_path, f"j{i}") for i in range(3)]
    for job in jobs:
        ex.submit(job)
    for job in jobs:
        reach(job, psij.JobState.ACTIVE)
    tasks = [read_pid(tmp_path / f"j{i}") for i in range(3)]
    agent, node = _agent_of(tasks[0])
    assert len({_agent_of(t)[1] for t in tasks}) == 3, "one job per node (1 core each)"
    orphans.append(tasks[0])
    os.kill(agent.pid, signal.SIGKILL)

    status = jobs[0].wait(timeout=15)
    assert status is not None and status.state is psij.JobState.FAILED, status
    assert status.message is not None and node in status.message and "lost" in status.message, status.message
    # The dead agent's task ran in its own session: the local batch system ends what the lost node left.
    wait_for(lambda: gone(tasks[0]), 20, "the lost node's task to be killed")
    for job, task in zip(jobs[1:], tasks[1:], strict=True):
        assert job.status.state is psij.JobState.ACTIVE
        assert task.is_running() and not gone(task)
    st = ex.pilot_status()
    states = {n["name"]: n["agent"] for n in st["nodes"]}
    assert states[node] == "lost" and sorted(s for n, s in states.items() if n != node) == ["active", "active"]
    # A new job never goes to the lost node: it waits for a free core on a live one.
    extra = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(extra)
    ex.cancel(jobs[1])
    status = extra.wait(timeout=20)
    assert status is not None and status.state is psij.JobState.COMPLETED
    assert node not in (status.metadata or {}).get("nodes", [])
    ex.cancel(jobs[2])
    jobs[2].wait(timeout=20)


def test_restartable_job_moves_to_another_node_once(
    start_pilot: Callable[..., Pilot], tmp_path: Path, orphans: list[psutil.Process]
) -> None:
    p = start_pilot(CONFIG)
    ex = p.executor()
    agents_active(ex, 3)
    movable = _sleeper(tmp_path, "movable", restartable=True)
    fixed = _sleeper(tmp_path, "fixed", restartable=True, retries=0)
    ex.submit(movable)
    ex.submit(fixed)
    reach(movable, psij.JobState.ACTIVE)
    reach(fixed, psij.JobState.ACTIVE)
    first = read_pid(tmp_path / "movable")
    agent, node = _agent_of(first)
    orphans.append(first)
    os.kill(agent.pid, signal.SIGKILL)

    # The restartable job runs again on a live node, under the same job (still ACTIVE, same native id).
    wait_for(lambda: len(_pids(tmp_path / "movable")) == 2, 15, "the restartable job to start again")
    second = psutil.Process(_pids(tmp_path / "movable")[1])
    assert _agent_of(second)[1] != node
    assert movable.status.state is psij.JobState.ACTIVE
    fixed_task = read_pid(tmp_path / "fixed")
    if _agent_of(fixed_task)[1] == node:  # pragma: no cover - placement put both on one node: not with 1 core each
        raise AssertionError("two 1-core jobs on one 1-core node")
    assert fixed.status.state is psij.JobState.ACTIVE
    ex.cancel(movable)
    status = movable.wait(timeout=20)
    assert status is not None and status.state is psij.JobState.CANCELED
    wait_for(lambda: gone(second), 20, "the second attempt's process to be killed")
    assert len(_pids(tmp_path / "movable")) == 2, "exactly one re-run"
    ex.cancel(fixed)
    fixed.wait(timeout=20)


def test_an_sss_restartable_job_moves_to_another_node(
    start_pilot: Callable[..., Pilot], tmp_path: Path, orphans: list[psutil.Process]
) -> None:
    """SSS <Restartable>true</Restartable> is acted on as pilot.restartable is (issue 20: it was ignored)."""
    p = start_pilot(CONFIG)
    ex = p.executor()
    agents_active(ex, 3)
    script = tmp_path / "sleeper.sh"
    script.write_text(f"#!/bin/sh\necho $$ >> {tmp_path / 'sss'}\nexec sleep 60\n")
    script.chmod(0o755)
    (job,) = ex.submit_sss(f"<Job><Executable>{script}</Executable><Restartable>true</Restartable></Job>")
    reach(job, psij.JobState.ACTIVE)
    first = read_pid(tmp_path / "sss")
    agent, node = _agent_of(first)
    orphans.append(first)
    os.kill(agent.pid, signal.SIGKILL)
    wait_for(lambda: len(_pids(tmp_path / "sss")) == 2, 15, "the restartable SSS job to start again")
    second = psutil.Process(_pids(tmp_path / "sss")[1])
    assert _agent_of(second)[1] != node and job.status.state is psij.JobState.ACTIVE
    ex.cancel(job)
    status = job.wait(timeout=20)
    assert status is not None and status.state is psij.JobState.CANCELED


def test_retries_zero_fails_on_node_loss(
    start_pilot: Callable[..., Pilot], tmp_path: Path, orphans: list[psutil.Process]
) -> None:
    p = start_pilot(CONFIG)
    ex = p.executor()
    agents_active(ex, 3)
    job = _sleeper(tmp_path, "once", restartable=True, retries=0)
    ex.submit(job)
    reach(job, psij.JobState.ACTIVE)
    task = read_pid(tmp_path / "once")
    agent, node = _agent_of(task)
    orphans.append(task)
    os.kill(agent.pid, signal.SIGKILL)
    status = job.wait(timeout=15)
    assert status is not None and status.state is psij.JobState.FAILED and node in (status.message or "")
    assert len(_pids(tmp_path / "once")) == 1


def test_frozen_agent_is_lost_its_task_ended_and_its_node_back_in_service(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    p = start_pilot(CONFIG)
    ex = p.executor()
    agents_active(ex, 3)
    job = _sleeper(tmp_path, "frozen")
    ex.submit(job)
    reach(job, psij.JobState.ACTIVE)
    task = read_pid(tmp_path / "frozen")
    agent, node = _agent_of(task)
    os.kill(agent.pid, signal.SIGSTOP)
    try:
        status = job.wait(timeout=15)
        assert status is not None and status.state is psij.JobState.FAILED and node in (status.message or "")
        # Declared lost: on a local allocation the node's leftovers are ended at once, agent frozen or not.
        wait_for(lambda: gone(task), 20, "the lost node's task to be killed")
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    # The node is back in service: its agent registered again.
    agents_active(ex, 3)
    again = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(again)
    status = again.wait(timeout=20)
    assert status is not None and status.state is psij.JobState.COMPLETED

"""A pilot on the real two-node Slurm cluster: agents on both nodes over CURVE, ranks where placed,
no srun per task, and a pilot cancelled from outside fails its jobs with Slurm's account of it."""

from __future__ import annotations

import collections
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from pilot_waits import agents_active, list_when_back
from slurm_fixture import slurm_cluster  # noqa: F401 - the session fixture

import client as psij
from pilot.rundir import RunDir

CONFIG = '[allocation]\nlrm = "slurm"\nnodes = 2\nwalltime = "30m"\npartition = "debug"\npoll_interval = 1\n'


def _run(ex: psij.JobExecutor, out: Path, launcher: str, res: psij.ResourceSpecV1, cmd: str, **kw: Any) -> list[str]:
    job = psij.Job(psij.JobSpec("/bin/sh", ["-c", cmd], launcher=launcher, stdout_path=out, resources=res, **kw))
    ex.submit(job)
    status = job.wait(timeout=60)
    assert status is not None and status.state is psij.JobState.COMPLETED, (launcher, status)
    return out.read_text().split()


def test_slurm_pilot_runs_ranks_on_both_nodes_and_fails_jobs_when_cancelled(
    slurm_cluster: dict[str, str],  # noqa: F811
    start_pilot: Any,
    tmp_path: Path,
) -> None:
    pilot = start_pilot(CONFIG)
    assert str(pilot.info["agent_url"]).startswith("tcp://")
    ex = pilot.executor()
    st = agents_active(ex, 2)
    assert sorted(n["name"] for n in st["nodes"]) == ["node1", "node2"]
    four = psij.ResourceSpecV1(process_count=4)
    seen = _run(ex, tmp_path / "m.out", "multiple", four, "echo $SLURMD_NODENAME")
    assert collections.Counter(seen) == {"node1": 2, "node2": 2}
    seen = _run(ex, tmp_path / "s.out", "srun", four, "echo $SLURMD_NODENAME")
    assert collections.Counter(seen) == {"node1": 2, "node2": 2}
    root_ok = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}  # CI runs as root
    seen = _run(
        ex,
        tmp_path / "p.out",
        "mpirun",
        psij.ResourceSpecV1(node_count=2, processes_per_node=1),
        "echo rank-$OMPI_COMM_WORLD_RANK-$SLURMD_NODENAME",
        environment=root_ok,
    )
    assert sorted(w.split("-")[1] for w in seen) == ["0", "1"], seen  # both ranks printed
    assert sorted(w.split("-")[2] for w in seen) == ["node1", "node2"], seen  # one on each node
    jobs = [psij.Job(psij.JobSpec("/bin/true")) for _ in range(200)]
    for job in jobs:
        ex.submit(job)
    assert all((s := job.wait(timeout=120)) is not None and s.state is psij.JobState.COMPLETED for job in jobs)
    native = str(st["allocation"]["native_id"])
    steps = subprocess.run(
        ["squeue", "-h", "-s", "-j", native, "-o", "%i"], capture_output=True, text=True
    ).stdout.split()
    assert len(steps) <= 3, f"tasks ran through srun steps: {steps}"  # the agents' step and the batch step
    running = psij.Job(psij.JobSpec("/bin/sleep", ["60"]))
    ex.submit(running)
    running.wait(timeout=30, target_states=[psij.JobState.ACTIVE])
    subprocess.run(["scancel", native], check=True)
    status = running.wait(timeout=8)  # under the 10 s agent timeout: the allocation's end is noticed itself
    assert status is not None and status.state is psij.JobState.FAILED, status
    assert "cancelled" in (status.message or "").lower(), status.message
    late = psij.Job(psij.JobSpec("/bin/true"))
    try:
        ex.submit(late)
        raise AssertionError("a job was accepted by a pilot whose allocation ended")
    except psij.SubmitException as exc:
        assert exc.transient and "allocation has ended" in str(exc)


def test_a_pilot_with_a_bad_partition_fails_at_up_with_slurms_error(
    slurm_cluster: dict[str, str],  # noqa: F811
    pilot_home: Path,
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(CONFIG.replace('partition = "debug"', 'partition = "nosuchpartition"'))
    proc = subprocess.run(
        [sys.executable, "-m", "pilot", "up", "--config", str(cfg), "--rundir", str(pilot_home / "bad")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc
    assert "refused the pilot" in proc.stderr and "invalid partition" in proc.stderr.lower(), proc.stderr
    assert RunDir(pilot_home / "bad").read_info() is None  # no daemon left running


def test_a_one_minute_slurm_pilot_honours_its_walltime(
    slurm_cluster: dict[str, str],  # noqa: F811
    start_pilot: Any,
) -> None:
    config = CONFIG.replace('walltime = "30m"', 'walltime = "1m"').replace(
        "[allocation]", "[pilot]\nwalltime_margin = 50\n[allocation]"
    )
    pilot = start_pilot(config)
    ex = pilot.executor()
    agents_active(ex, 2)
    five = psij.Job(psij.JobSpec("/bin/true", attributes=psij.JobAttributes(duration=timedelta(minutes=5))))
    ex.submit(five)
    status = five.wait(timeout=10)
    assert status is not None and status.state is psij.JobState.FAILED, status
    assert "cannot finish before the allocation's walltime ends" in (status.message or "")
    long_task = psij.Job(
        psij.JobSpec("/bin/sleep", ["120"], attributes=psij.JobAttributes(duration=timedelta(seconds=40)))
    )
    ex.submit(long_task)
    status = long_task.wait(timeout=40)
    assert status is not None and status.state is psij.JobState.FAILED, status
    assert "walltime" in (status.message or "") and "allocation ends" in (status.message or ""), status.message
    a = ex.pilot_status()["allocation"]
    assert a["walltime"] == 60 and status.time < float(a["started"]) + 60


def test_slurm_pilot_restarted_after_sigkill_keeps_its_allocation_and_running_tasks(
    slurm_cluster: dict[str, str],  # noqa: F811
    start_pilot: Any,
    tmp_path: Path,
) -> None:
    """The agents on both nodes (over CURVE/TCP) keep their tasks while the daemon is dead, and reconnect
    to the restarted one on the same endpoint; the Slurm job is re-attached, not requested again."""
    pilot = start_pilot(CONFIG)
    ex = pilot.executor()
    st = agents_active(ex, 2)
    native = str(st["allocation"]["native_id"])
    url = pilot.info["agent_url"]
    jobs = [
        psij.Job(psij.JobSpec("/bin/sh", ["-c", f"echo $SLURMD_NODENAME >> {tmp_path}/m{i}; sleep 6"]))
        for i in range(2)
    ]
    for job in jobs:
        ex.submit(job)
    for job in jobs:
        job.wait(timeout=30, target_states=[psij.JobState.ACTIVE])
    ids = [job.native_id for job in jobs]
    ex.close()
    pilot.kill9()
    pilot.up_again()
    assert pilot.info["agent_url"] == url
    ex2 = pilot.executor()
    assert set(list_when_back(ex2)) == set(ids)
    st = agents_active(ex2, 2)
    assert str(st["allocation"]["native_id"]) == native
    for i, native_id in enumerate(ids):
        job = psij.Job()
        assert native_id is not None
        ex2.attach(job, native_id)
        status = job.wait(timeout=60)
        assert status is not None and status.state is psij.JobState.COMPLETED, status
        assert (tmp_path / f"m{i}").read_text().split() in (["node1"], ["node2"]), "ran exactly once"
    queue = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    assert queue == [native], f"the restarted daemon asked Slurm for another allocation: {queue}"

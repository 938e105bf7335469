"""A pilot on the real two-node Slurm cluster: agents on both nodes over CURVE, ranks where placed,
no srun per task, and a pilot cancelled from outside fails its jobs with Slurm's account of it."""

from __future__ import annotations

import collections
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pilot_waits import agents_active, list_when_back, wait_for
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
        psij.ResourceSpecV1(node_count=2, processes_per_node=2),
        "echo rank-$OMPI_COMM_WORLD_RANK-$SLURMD_NODENAME",
        environment=root_ok,
    )
    assert sorted(w.split("-")[1] for w in seen) == ["0", "1", "2", "3"], seen  # every rank printed
    assert collections.Counter(w.split("-")[2] for w in seen) == {"node1": 2, "node2": 2}, seen  # 2 per node
    # A job naming the pilot's partition runs; another partition is refused, saying what the pilot has.
    debug = psij.JobAttributes(queue_name="debug")
    assert _run(ex, tmp_path / "q.out", "single", psij.ResourceSpecV1(), "echo in-debug", attributes=debug) == [
        "in-debug"
    ]
    with pytest.raises(psij.InvalidJobException, match=r"queue_name = 'batch'.*\(slurm\): partition 'debug'"):
        ex.submit(psij.Job(psij.JobSpec("/bin/true", attributes=psij.JobAttributes(queue_name="batch"))))
    jobs = [psij.Job(psij.JobSpec("/bin/true")) for _ in range(500)]
    for job in jobs:
        ex.submit(job)
    assert all((s := job.wait(timeout=120)) is not None and s.state is psij.JobState.COMPLETED for job in jobs)
    native = str(st["allocation"]["native_id"])
    steps = subprocess.run(
        ["squeue", "-h", "-s", "-j", native, "-o", "%i"], capture_output=True, text=True
    ).stdout.split()
    assert len(steps) <= 3, f"tasks ran through srun steps: {steps}"  # the agents' step and the batch step
    # Slurm numbers a job's steps in order: an srun per task would have used 500 step ids by now.
    step_ids = _run(ex, tmp_path / "step.out", "srun", psij.ResourceSpecV1(process_count=2), "echo $SLURM_STEP_ID")
    assert all(int(i) < 10 for i in step_ids), f"the 500 tasks went through srun steps: next step is {step_ids}"
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


def test_two_slurm_allocations_in_one_pilot_each_job_runs_inside_one(
    slurm_cluster: dict[str, str],  # noqa: F811
    start_pilot: Any,
    tmp_path: Path,
) -> None:
    """``pilots = 2``: two Slurm jobs of one node each, both used; every task's SLURM_JOB_ID is the
    allocation its node belongs to, and a parallel srun launch stays inside one of them."""
    pilot = start_pilot(CONFIG.replace("nodes = 2", "nodes = 1\npilots = 2"))
    ex = pilot.executor()
    st = agents_active(ex, 2)
    allocations = {a["name"]: str(a["native_id"]) for a in st["allocations"]}
    assert sorted(allocations) == ["a1", "a2"] and len(set(allocations.values())) == 2, st["allocations"]
    names = sorted(n["name"] for n in st["nodes"])
    assert not names[0].endswith("@a2") and names[1].endswith("@a2"), names  # host@a2 even on a shared host
    cores = min(int(n["cores"]) for n in st["nodes"])
    whole = psij.ResourceSpecV1(cpu_cores_per_process=cores)  # a whole node: one such job per allocation
    jobs = []
    for i in range(2):
        out = tmp_path / f"w{i}.out"
        job = psij.Job(
            psij.JobSpec("/bin/sh", ["-c", "echo $PILOT_NODE $SLURM_JOB_ID; sleep 2"], stdout_path=out, resources=whole)
        )
        ex.submit(job)
        jobs.append((job, out))
    for job, _ in jobs:
        status = job.wait(timeout=60)
        assert status is not None and status.state is psij.JobState.COMPLETED, status
    ran = dict(out.read_text().split() for _, out in jobs)
    assert sorted(ran) == names, ran  # one on each allocation's node, at the same time
    for node, job_id in ran.items():
        assert job_id == allocations["a2" if node.endswith("@a2") else "a1"], (node, job_id, allocations)
    seen = _run(ex, tmp_path / "s.out", "srun", psij.ResourceSpecV1(process_count=2), "echo $SLURM_JOB_ID")
    assert len(set(seen)) == 1 and seen[0] in allocations.values(), seen


def test_slurm_autoscale_submits_another_pilot_for_waiting_work_and_releases_it_when_idle(
    slurm_cluster: dict[str, str],  # noqa: F811
    start_pilot: Any,
    tmp_path: Path,
) -> None:
    config = CONFIG.replace("nodes = 2", "nodes = 1") + (
        "[autoscale]\nmax_pilots = 2\ngrow_after = 0.5\nidle_timeout = 3\nmin_pilots = 1\n"
    )
    pilot = start_pilot(config)
    ex = pilot.executor()
    st = agents_active(ex, 1)
    first = str(st["allocations"][0]["native_id"])
    whole = psij.ResourceSpecV1(cpu_cores_per_process=int(st["nodes"][0]["cores"]))
    jobs = []
    for i in range(2):
        out = tmp_path / f"g{i}.out"
        # Each holds its whole node until the other has started: they run at once, so on two allocations
        # (a fixed sleep let the second run on the first's node when the new pilot came late, under load).
        mine, other = tmp_path / f"started{i}", tmp_path / f"started{1 - i}"
        script = (
            f"echo $SLURM_JOB_ID; touch {mine}; "
            f"for n in $(seq 600); do [ -e {other} ] && exit 0; sleep 0.1; done; exit 1"
        )
        job = psij.Job(psij.JobSpec("/bin/sh", ["-c", script], stdout_path=out, resources=whole))
        ex.submit(job)
        jobs.append((job, out))
    for job, _ in jobs:
        status = job.wait(timeout=90)
        assert status is not None and status.state is psij.JobState.COMPLETED, status
    used = {out.read_text().strip() for _, out in jobs}
    st = ex.pilot_status()
    natives = [str(a["native_id"]) for a in st["allocations"]]
    assert len(natives) == 2 and natives[0] == first and used == set(natives), (used, natives)

    def released() -> bool:
        return sorted(a["state"] for a in ex.pilot_status()["allocations"]) == ["active", "done"]

    # Idle: the one ending first (here the older) is released, min_pilots = 1 is kept.
    wait_for(released, timeout=40, what="one idle allocation to be released")
    mine = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    assert sum(n in mine for n in natives) == 1, (mine, natives)


def test_slurm_autoscale_stops_after_refused_pilots_and_fails_waiting_jobs_with_slurms_words(
    slurm_cluster: dict[str, str],  # noqa: F811
    start_pilot: Any,
) -> None:
    config = CONFIG.replace('partition = "debug"', 'partition = "nosuchpartition"\npilots = 0') + (
        "[autoscale]\nmax_pilots = 4\nmax_failures = 2\ngrow_after = 0\n"
    )
    pilot = start_pilot(config)
    ex = pilot.executor()
    job = psij.Job(psij.JobSpec("/bin/true"))
    ex.submit(job)
    status = job.wait(timeout=60)
    assert status is not None and status.state is psij.JobState.FAILED, status
    message = (status.message or "").lower()
    assert "2 allocations in a row failed to start" in message and "invalid partition" in message, message
    st = ex.pilot_status()
    assert [a["state"] for a in st["allocations"]] == ["failed", "failed"], st["allocations"]
    assert st["autoscale"]["stopped"]

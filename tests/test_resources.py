"""Resources end to end: the local LRM's virtual nodes, and exact placement of cores, GPUs and
memory as seen from inside the tasks themselves (affinity, GPU variables, start/end times)."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from itertools import combinations
from pathlib import Path
from typing import Any

import psutil
import pytest
from pilot_waits import agents_active, callbacks_settled, ends, reach

import client as psij

PYTHON = sys.executable
NCPU = len(os.sched_getaffinity(0))
GiB = 1024**3

#: A task that records what it was given: its cpus, GPU variables and when it ran.
PROBE = """
import json, os, sys, time
t0 = time.time()
seen = {
    "cpus": sorted(os.sched_getaffinity(0)),
    "gpu_env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")},
    "rank": os.environ.get("PILOT_RANK"),
    "pid": os.getpid(),
}
time.sleep(float(sys.argv[2]))
seen["start"], seen["end"] = t0, time.time()
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump(seen, f)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


def config(nodes: int, **options: Any) -> str:
    lines = ["[allocation]", 'lrm = "local"', f"nodes = {nodes}"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in options.items()]
    return "\n".join(lines) + "\n"


def probe_job(out: Path, seconds: float, *, launcher: str | None = None, **resources: Any) -> psij.Job:
    spec = psij.JobSpec(
        executable=PYTHON,
        arguments=["-c", PROBE, str(out), str(seconds)],
        resources=psij.ResourceSpecV1(**resources) if resources else None,
        launcher=launcher,
    )
    return psij.Job(spec)


def run_all(ex: psij.JobExecutor, jobs: list[psij.Job], timeout: float = 60) -> None:
    for job in jobs:
        ex.submit(job)
    for job in jobs:
        status = job.wait(timeout=timeout)
        assert status is not None and status.state is psij.JobState.COMPLETED, (job, status)


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def agent_processes(daemon_pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(daemon_pid).children() if p.cmdline()[1:3] == ["-m", "agent"]]


# -- the local LRM: virtual nodes ---------------------------------------------------------------------------


@pytest.mark.skipif(NCPU < 2, reason="needs at least 2 cpus to split")
def test_local_nodes_split_the_machine_cpus(start_pilot: Any, tmp_path: Path) -> None:
    n = 2
    pilot = start_pilot(config(n))
    ex = pilot.executor()
    st = agents_active(ex, n)
    # one agent process per virtual node, each started for its own node
    agents = agent_processes(pilot.pid)
    assert len(agents) == n
    assert sorted(p.environ()["PILOT_AGENT_NODE"] for p in agents) == ["local-0", "local-1"]
    # the machine's cpus are shared out: every one in exactly one node
    assert sum(node["cores"] for node in st["nodes"]) == NCPU
    assert all(node["cores"] >= NCPU // n for node in st["nodes"])
    # and each node's tasks run on its own cpus: one exclusive job per node, recording its affinity
    outs = [tmp_path / f"n{i}.json" for i in range(n)]
    jobs = [probe_job(out, 0.0, exclusive_node_use=True) for out in outs]
    run_all(ex, jobs)
    nodes = [job.status.metadata["nodes"] for job in jobs]  # type: ignore[index]
    assert sorted(x[0] for x in nodes) == ["local-0", "local-1"]
    seen = [set(read(out)["cpus"]) for out in outs]
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] <= set(os.sched_getaffinity(0))


def test_cores_per_node_declares_virtual_cores_and_agents_register_their_facts(start_pilot: Any) -> None:
    pilot = start_pilot(config(3, cores_per_node=4, gpus_per_node=2, memory_per_node="512M", features=["ssd", "ib"]))
    ex = pilot.executor()
    st = agents_active(ex, 3)
    agents = agent_processes(pilot.pid)
    assert len(agents) == 3 and len({p.pid for p in agents}) == 3
    assert sorted(p.environ()["PILOT_AGENT_NODE"] for p in agents) == ["local-0", "local-1", "local-2"]
    assert sorted(node["name"] for node in st["nodes"]) == ["local-0", "local-1", "local-2"]
    expected_os = f"{platform.system()} {platform.release()}"
    for node in st["nodes"]:
        # SSS Node Configured facts, as the agent registered them
        assert node["cores"] == 4 and node["free_cores"] == 4
        assert node["gpus"] == 2 and node["free_gpus"] == 2
        assert node["memory"] == 512 * 1024**2
        assert node["os"] == expected_os
        assert node["architecture"] == platform.machine()
        assert node["features"] == ["ssd", "ib"]
        assert node["hostname"] == platform.node()
    # 12 declared cores in all, whatever the machine has: 12 one-core tasks hold them at once
    assert st["allocation"]["nodes"] == 3


def test_nodes_without_declared_gpus_report_the_gpus_found(start_pilot: Any) -> None:
    from agent.probe import detect_gpus

    pilot = start_pilot(config(1, cores_per_node=2))
    st = agents_active(pilot.executor(), 1)
    node = st["nodes"][0]
    assert node["gpus"] == node["free_gpus"] == len(detect_gpus())
    assert node["cores"] == 2 and node["features"] == []


# -- exact cores ----------------------------------------------------------------------------------------------


def test_no_two_concurrent_tasks_share_a_core(start_pilot: Any, tmp_path: Path) -> None:
    cores = min(NCPU, 4)  # declared cores mapped 1:1 onto real cpus, so affinities are comparable
    pilot = start_pilot(config(1, cores_per_node=cores))
    ex = pilot.executor()
    agents_active(ex, 1)
    wanted: list[int] = []
    jobs = []
    for i in range(3 * cores + 2):
        c = 2 if (cores >= 2 and i % 3 == 2) else 1
        wanted.append(c)
        jobs.append(probe_job(tmp_path / f"t{i}.json", 0.4, cpu_cores_per_process=c))
    run_all(ex, jobs)
    seen = [read(tmp_path / f"t{i}.json") for i in range(len(jobs))]
    machine = set(os.sched_getaffinity(0))
    for want, s, job in zip(wanted, seen, jobs, strict=True):
        assert len(s["cpus"]) == want, f"task asked for {want} core(s) and was pinned to {s['cpus']}"
        assert set(s["cpus"]) <= machine
        assert job.status.metadata["processors"] == want  # type: ignore[index]
    concurrent = 0
    for a, b in combinations(seen, 2):
        if overlap(a, b):
            concurrent += 1
            assert not set(a["cpus"]) & set(b["cpus"]), f"concurrent tasks share cores: {a} {b}"
    if cores > 1:
        assert concurrent, "no two tasks ever ran at the same time; the test proved nothing"
    # at any moment no more cores were in use than the node has
    for s in seen:
        at = s["start"] + 1e-6
        assert sum(len(o["cpus"]) for o in seen if o["start"] <= at < o["end"]) <= cores


def test_tasks_that_do_not_fit_wait_queued_and_start_when_cores_free(start_pilot: Any, tmp_path: Path) -> None:
    pilot = start_pilot(config(1, cores_per_node=2))
    ex = pilot.executor()
    agents_active(ex, 1)
    history: dict[str, list[tuple[psij.JobState, float]]] = {}

    def record(job: psij.Job, status: psij.JobStatus) -> None:
        history.setdefault(job.id, []).append((status.state, time.time()))

    ex.set_job_status_callback(record)
    outs = [tmp_path / f"q{i}.json" for i in range(3)]
    jobs = [probe_job(out, 1.0) for out in outs]
    for job in jobs[:2]:
        ex.submit(job)
    for job in jobs[:2]:
        reach(job, psij.JobState.ACTIVE)
    ex.submit(jobs[2])
    # both cores are held: the pilot keeps the third job queued
    st = ex.pilot_status()
    assert st["nodes"][0]["free_cores"] == 0
    assert st["queued"] == 1 and st["jobs"].get("QUEUED") == 1
    assert jobs[2].status.state is psij.JobState.QUEUED
    for job in jobs:
        ends(job, psij.JobState.COMPLETED)
    a, b, c = (read(out) for out in outs)
    first_end = min(a["end"], b["end"])
    assert overlap(a, b)
    assert c["start"] >= first_end, "the third task started before a core was free"
    assert c["start"] - first_end < 2.0, f"the third task waited {c['start'] - first_end:.2f} s for a free core"
    # the client saw it: QUEUED, then ACTIVE only after one of the others ended
    callbacks_settled(lambda: [state for state, _ in history[jobs[2].id]], "the third job")
    third = history[jobs[2].id]
    assert [s for s, _ in third] == [psij.JobState.QUEUED, psij.JobState.ACTIVE, psij.JobState.COMPLETED]
    assert set(c["cpus"]) <= set(a["cpus"]) | set(b["cpus"])


def test_multi_rank_job_gets_one_core_per_rank_across_nodes(start_pilot: Any, tmp_path: Path) -> None:
    cores = min(NCPU, 2)
    pilot = start_pilot(config(2, cores_per_node=cores))
    ex = pilot.executor()
    agents_active(ex, 2)
    out = tmp_path / "rank"
    script = f"import os; open('{out}' + os.environ['PILOT_RANK'], 'w').write(repr(sorted(os.sched_getaffinity(0))))"
    job = psij.Job(
        psij.JobSpec(
            executable=PYTHON,
            arguments=["-c", script],
            launcher="multiple",
            resources=psij.ResourceSpecV1(process_count=2, processes_per_node=1),
        )
    )
    run_all(ex, [job])
    md = job.status.metadata or {}
    assert md["nodes"] == ["local-0", "local-1"] and md["processes"] == 2 and md["processors"] == 2
    for r in range(2):
        assert len(eval(Path(f"{out}{r}").read_text())) == 1


# -- GPUs -----------------------------------------------------------------------------------------------------


def test_gpus_are_bound_exclusively_through_visible_devices(start_pilot: Any, tmp_path: Path) -> None:
    pilot = start_pilot(config(1, cores_per_node=4, gpus_per_node=2))
    ex = pilot.executor()
    agents_active(ex, 1)
    g = [probe_job(tmp_path / f"g{i}.json", 1.0, gpu_cores_per_process=1) for i in range(2)]
    cpu_only = probe_job(tmp_path / "cpu.json", 0.0)
    for job in g:
        ex.submit(job)
    for job in g:
        reach(job, psij.JobState.ACTIVE)
    third = probe_job(tmp_path / "g2.json", 0.0, gpu_cores_per_process=1)
    ex.submit(third)
    ex.submit(cpu_only)
    # the CPU-only job runs beside the GPU jobs; the third GPU job waits for a GPU (proven below from
    # the times the tasks recorded, not from when this process happens to look)
    ends(cpu_only, psij.JobState.COMPLETED)
    for job in [*g, third]:
        ends(job, psij.JobState.COMPLETED)
    a, b, c = (read(tmp_path / f"g{i}.json") for i in range(3))
    cpu = read(tmp_path / "cpu.json")
    for s in (a, b, c):
        env = s["gpu_env"]
        assert env["CUDA_VISIBLE_DEVICES"] in ("0", "1")
        assert env["ROCR_VISIBLE_DEVICES"] == env["ZE_AFFINITY_MASK"] == env["CUDA_VISIBLE_DEVICES"]
    assert overlap(a, b)
    assert {a["gpu_env"]["CUDA_VISIBLE_DEVICES"], b["gpu_env"]["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}
    assert c["start"] >= min(a["end"], b["end"])
    # c got a GPU that no task running beside it held (when both were free by then, either one)
    for other in (a, b):
        if overlap(c, other):
            assert c["gpu_env"]["CUDA_VISIBLE_DEVICES"] != other["gpu_env"]["CUDA_VISIBLE_DEVICES"], (c, other)
    # a job without GPUs on a GPU node sees none (set, but empty), for every vendor's runtime
    assert cpu["gpu_env"] == {"CUDA_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": "", "ZE_AFFINITY_MASK": ""}
    assert (third.status.metadata or {})["gpus"] == 1 and (cpu_only.status.metadata or {})["gpus"] == 0


def test_two_gpus_per_process_see_both(start_pilot: Any, tmp_path: Path) -> None:
    pilot = start_pilot(config(1, cores_per_node=2, gpus_per_node=2))
    ex = pilot.executor()
    agents_active(ex, 1)
    job = probe_job(tmp_path / "both.json", 0.0, gpu_cores_per_process=2)
    run_all(ex, [job])
    assert read(tmp_path / "both.json")["gpu_env"]["CUDA_VISIBLE_DEVICES"] == "0,1"


# -- memory ---------------------------------------------------------------------------------------------------


def test_memory_is_consumable(start_pilot: Any, tmp_path: Path) -> None:
    pilot = start_pilot(config(1, cores_per_node=4, memory_per_node="1G"))
    ex = pilot.executor()
    agents_active(ex, 1)
    big = [probe_job(tmp_path / f"m{i}.json", 0.5, memory=600 * 1024**2) for i in range(2)]
    small = probe_job(tmp_path / "small.json", 0.5, memory=300 * 1024**2)
    run_all(ex, [*big, small])
    a, b, s = (read(tmp_path / f) for f in ("m0.json", "m1.json", "small.json"))
    assert not overlap(a, b), "two tasks holding 600M each ran together on a 1G node"
    # the small one fits beside the first big one: memory did not serialise everything
    assert overlap(a, s)
    st = ex.pilot_status()
    assert st["nodes"][0]["free_memory"] == st["nodes"][0]["memory"] == GiB


# -- refused at submit -------------------------------------------------------------------------------------


NEVER_FITS = [
    ({"cpu_cores_per_process": 5}, "asks for 5 cores but the largest node has 4"),
    ({"gpu_cores_per_process": 3}, "asks for 3 GPUs but the most any node has is 2"),
    ({"memory": 2 * GiB}, "bytes of memory but the largest node has 1073741824"),
    ({"node_count": 3}, "asks for 3 nodes but the allocation has 2"),
    ({"process_count": 9}, "holds at most 8 such processes"),
    ({"process_count": 2, "gpu_cores_per_process": 2, "processes_per_node": 2}, "holds at most 2 such processes"),
]


def test_a_job_that_can_never_fit_is_refused_at_submit(start_pilot: Any) -> None:
    pilot = start_pilot(config(2, cores_per_node=4, gpus_per_node=2, memory_per_node="1G"))
    ex = pilot.executor()
    for resources, reason in NEVER_FITS:
        job = psij.Job(psij.JobSpec(executable="/bin/true", resources=psij.ResourceSpecV1(**resources)))
        with pytest.raises(psij.InvalidJobException) as info:
            ex.submit(job)
        message = str(info.value)
        assert "can never run in this allocation" in message and reason in message, (resources, message)
        assert job.native_id is None and job.status.state is psij.JobState.NEW
    st = ex.pilot_status()
    assert st["jobs"] == {} and st["queued"] == 0
    # what does fit is accepted, by the same pilot, right after
    fits = psij.Job(
        psij.JobSpec(
            executable="/bin/true",
            resources=psij.ResourceSpecV1(process_count=8, cpu_cores_per_process=1, node_count=2),
            launcher="multiple",
        )
    )
    ex.submit(fits)
    ends(fits, psij.JobState.COMPLETED)

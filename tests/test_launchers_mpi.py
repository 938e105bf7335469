"""The parallel launchers: the commands ``mpirun`` and ``srun`` plans produce, and real runs of both
(Open MPI's ``mpirun`` here and across the 2-node Slurm cluster, ``srun`` inside a real Slurm pilot)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from lrm_standin import standin_request
from slurm_fixture import slurm_cluster

import client as psij
from pilot.launchers.mpirun import MpirunLauncher
from pilot.launchers.srun import SrunLauncher, cpu_bind
from pilot.lrm import create
from pilot.lrm.base import AllocationState
from pilot.lrm.slurm import SlurmExecutor
from pilot.model.job_description import JobDescription
from pilot.scheduler.placement import RankPlacement

__all__ = ["slurm_cluster"]

MB = 2**20


def rp(node: str, cores: list[int], gpus: list[int] | None = None) -> RankPlacement:
    return RankPlacement(node=node, cores=cores, gpus=gpus or [], memory=MB)


def job(executable: str = "/bin/app", *args: str, **env: str) -> JobDescription:
    return JobDescription(executable=executable, arguments=list(args), environment=dict(env))


def hosts_of(ranks: list[RankPlacement]) -> list[str]:
    return [f"{r.node}.cluster" for r in ranks]


# -- srun: generated commands --------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_srun_one_launching_process_on_the_first_node_holding_every_rank() -> None:
    ranks = [rp("node1", [0]), rp("node1", [1]), rp("node2", [0]), rp("node2", [1])]
    (plan,) = SrunLauncher().plan(
        job_id="7", description=job("/bin/app", "-x"), ranks=ranks, hosts=hosts_of(ranks), environment=None
    )
    assert plan.node == "node1" and plan.holds == [0, 1, 2, 3]
    order = plan.order
    assert order.executable == "srun"
    assert order.cores == [0, 1]
    assert order.rank_environment == {"PILOT_JOB_ID": "7", "PILOT_SIZE": "4"}
    assert order.nodefile_hosts == hosts_of(ranks)
    assert order.arguments == [
        "--jobid=${SLURM_JOB_ID}",
        "--overlap",
        "--whole",
        "--nodes=2",
        "--ntasks=4",
        "--cpus-per-task=1",
        "--distribution=arbitrary",
        "--nodelist=node1,node1,node2,node2",
        "--cpu-bind=map_cpu:0,1",
        "/bin/app",
        "-x",
    ]


@pytest.mark.timeout(10)
def test_srun_groups_interleaved_ranks_node_by_node_and_binds_multi_core_ranks_by_mask() -> None:
    ranks = [rp("b", [2, 3]), rp("a", [0, 1]), rp("b", [0, 1]), rp("a", [2, 3])]
    args = SrunLauncher().arguments(job(), ranks, hosts_of(ranks))
    assert "--nodelist=b,b,a,a" in args and "--nodes=2" in args
    assert "--cpus-per-task=2" in args
    assert "--cpu-bind=mask_cpu:0x3,0xc" in args
    assert args[-1] == "/bin/app"


@pytest.mark.timeout(10)
def test_srun_pins_each_rank_itself_when_nodes_disagree_on_cores() -> None:
    ranks = [rp("node1", [0]), rp("node1", [1]), rp("node2", [1])]
    args = SrunLauncher().arguments(job("/bin/app", "a b"), ranks, hosts_of(ranks))
    assert "--cpu-bind=none" in args
    i = args.index("/bin/sh")
    assert args[i + 1] == "-c" and args[i + 3] == "pilot-rank" and args[i + 4 :] == ["/bin/app", "a b"]
    script = args[i + 2]
    assert "0) c=0;; 1) c=1;; 2) c=1;;" in script and 'exec taskset -c "$c" "$@"' in script
    # The script itself works: rank 2 would run `taskset -c 1 /bin/app 'a b'`.
    out = subprocess.run(
        ["/bin/sh", "-c", script.replace("exec taskset", "exec echo taskset"), "pilot-rank", "/bin/app", "a b"],
        env={"SLURM_PROCID": "2", "PATH": os.defpath},
        capture_output=True,
        text=True,
        timeout=5,
    )
    assert out.stdout.strip() == "taskset -c 1 /bin/app a b"


@pytest.mark.timeout(10)
def test_srun_gives_each_rank_its_own_gpus() -> None:
    ranks = [rp("node1", [0], [0]), rp("node1", [1], [1]), rp("node2", [0], [0]), rp("node2", [1], [1])]
    args = SrunLauncher().arguments(job(), ranks, hosts_of(ranks))
    assert "--cpu-bind=map_cpu:0,1" in args
    script = args[args.index("-c") + 1]
    out = subprocess.run(
        ["/bin/sh", "-c", script, "pilot-rank", "/bin/sh", "-c", "echo $CUDA_VISIBLE_DEVICES $ROCR_VISIBLE_DEVICES"],
        env={"SLURM_PROCID": "3", "PATH": os.defpath},
        capture_output=True,
        text=True,
        timeout=5,
    )
    assert out.stdout.strip() == "1 1"


@pytest.mark.timeout(10)
def test_cpu_bind_is_one_list_for_all_nodes() -> None:
    from pilot.launchers._parallel import group_by_node

    same = [rp("a", [4]), rp("a", [5]), rp("b", [4])]
    assert cpu_bind(group_by_node(same, hosts_of(same))) == "map_cpu:4,5"
    differ = [rp("a", [4]), rp("b", [5])]
    assert cpu_bind(group_by_node(differ, hosts_of(differ))) is None


# -- mpirun: generated commands ------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_mpirun_openmpi_host_list_and_forwarded_environment() -> None:
    ranks = [rp("node1", [0]), rp("node2", [0]), rp("node1", [1]), rp("node2", [1])]
    (plan,) = MpirunLauncher().plan(
        job_id="9",
        description=job("/bin/app", "--in", "x", OMP_NUM_THREADS="1"),
        ranks=ranks,
        hosts=hosts_of(ranks),
        environment=None,
    )
    order = plan.order
    assert plan.node == "node1" and plan.holds == [0, 1, 2, 3] and order.cores == [0, 1]
    assert order.executable == "mpirun"
    assert order.arguments == [
        "-n", "4",
        "--host", "node1.cluster:2,node2.cluster:2",
        "--map-by", "slot",
        "--bind-to", "none",
        "--oversubscribe",
        "-x", "OMP_NUM_THREADS",
        "-x", "PILOT_JOB_ID",
        "-x", "PILOT_SIZE",
        "-x", "PSIJ_NODEFILE",
        "/bin/app", "--in", "x",
    ]  # fmt: skip


@pytest.mark.timeout(10)
def test_mpirun_forwards_what_pre_launch_set_but_not_the_batch_systems_variables() -> None:
    ranks = [rp("node1", [0])]
    env = {"PATH": "/opt/mpi/bin:/usr/bin", "LD_LIBRARY_PATH": "/opt/mpi/lib", "SLURM_JOB_ID": "3", "PWD": "/x"}
    args = MpirunLauncher().arguments(job(), ranks, hosts_of(ranks), env)
    forwarded = [args[i + 1] for i, a in enumerate(args) if a == "-x"]
    assert "PATH" in forwarded and "LD_LIBRARY_PATH" in forwarded
    assert "SLURM_JOB_ID" not in forwarded and "PWD" not in forwarded


@pytest.mark.timeout(10)
def test_mpirun_mpich_flavour_and_virtual_nodes_sharing_a_host() -> None:
    ranks = [rp("local-0", [0]), rp("local-0", [1]), rp("local-1", [2])]
    launcher = MpirunLauncher(flavor="mpich")
    args = launcher.arguments(job("/bin/app"), ranks, ["login1", "login1", "login1"], None)
    assert launcher.command == "mpiexec"
    assert args == ["-n", "3", "-hosts", "login1:3", "/bin/app"]
    with pytest.raises(ValueError, match="allowed: openmpi, mpich"):
        MpirunLauncher(flavor="lam")


# -- real runs -------------------------------------------------------------------------------------------


def _mpirun_env() -> dict[str, str]:
    env = dict(os.environ)
    if os.geteuid() == 0:  # CI runs as root; Open MPI refuses that unless told twice
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


RANK_PRINTER = (
    'echo "rank=${OMPI_COMM_WORLD_RANK:-$SLURM_PROCID} size=${OMPI_COMM_WORLD_SIZE:-$SLURM_NTASKS}'
    ' node=${SLURMD_NODENAME:-$(hostname)} cpus=$(grep Cpus_allowed_list /proc/self/status | cut -f2)"'
)


def _lines(text: str) -> dict[int, dict[str, str]]:
    out = {}
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        if "rank" in fields:
            out[int(fields["rank"])] = fields
    return out


@pytest.mark.timeout(60)
def test_real_mpirun_starts_two_ranks_that_print_their_rank(tmp_path: Path) -> None:
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed (CI installs Debian's openmpi-bin through .ci/slurm.sh)")
    host = socket.gethostname()
    ranks = [rp("local-0", [0]), rp("local-0", [0])]
    (plan,) = MpirunLauncher().plan(
        job_id="1", description=job("/bin/sh", "-c", RANK_PRINTER), ranks=ranks, hosts=[host, host], environment=None
    )
    nodefile = tmp_path / "nodes"
    nodefile.write_text(f"{host}\n{host}\n")
    env = _mpirun_env() | plan.order.rank_environment | {"PSIJ_NODEFILE": str(nodefile)}
    proc = subprocess.run(
        [plan.order.executable, *plan.order.arguments], env=env, capture_output=True, text=True, timeout=50
    )
    assert proc.returncode == 0, proc.stderr
    lines = _lines(proc.stdout)
    assert sorted(lines) == [0, 1] and all(v["size"] == "2" for v in lines.values()), proc.stdout


async def _run_in_pilot(tmp_path: Path, argv: list[str], env: dict[str, str]) -> dict[str, object]:
    """Submit a 2-node Slurm pilot whose stand-in agent on node1 runs ``argv`` as an agent would run the
    launcher's process order (inside the agents' step, with their environment); its result."""
    ex = create("slurm", options={"poll_interval": 0.2}, source="test")
    assert isinstance(ex, SlurmExecutor)
    reports = tmp_path / "reports"
    request = standin_request(
        tmp_path,
        TEST_ORDER=json.dumps({"argv": argv, "env": env}),
        TEST_ORDER_NODE="node1",
        TEST_SLEEP="60",
    )
    alloc = await ex.submit(request)
    try:
        assert alloc.state is AllocationState.QUEUED, alloc.message
        for _ in range(500):
            if (reports / "order.json").exists():
                break
            await anyio.sleep(0.1)
        result: dict[str, object] = json.loads((reports / "order.json").read_text())
        return result
    finally:
        (reports / "stop").touch()
        await ex.cancel(alloc)


@pytest.mark.timeout(90)
async def test_real_srun_places_ranks_on_the_nodes_and_cores_of_the_placement(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    ranks = [rp("node1", [0]), rp("node2", [1]), rp("node1", [1]), rp("node2", [0])]
    (plan,) = SrunLauncher().plan(
        job_id="5", description=job("/bin/sh", "-c", RANK_PRINTER), ranks=ranks, hosts=hosts_of(ranks), environment=None
    )
    result = await _run_in_pilot(tmp_path, [plan.order.executable, *plan.order.arguments], plan.order.rank_environment)
    assert result["rc"] == 0, result
    lines = _lines(str(result["stdout"]))
    assert {r: v["node"] for r, v in lines.items()} == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}, result
    assert all(v["size"] == "4" for v in lines.values())
    # node1 has cores 0,1 and node2 cores 0,1 but in another rank order: the same local map holds,
    # so Slurm binds (here task/none ignores binding: the ranks' cpus are checked where taskset pins).
    assert "--cpu-bind=map_cpu:0,1" in plan.order.arguments


@pytest.mark.timeout(90)
async def test_real_srun_pins_ranks_itself_when_nodes_disagree(slurm_cluster: dict[str, str], tmp_path: Path) -> None:
    ranks = [rp("node1", [0]), rp("node1", [1]), rp("node2", [1])]
    (plan,) = SrunLauncher().plan(
        job_id="6", description=job("/bin/sh", "-c", RANK_PRINTER), ranks=ranks, hosts=hosts_of(ranks), environment=None
    )
    result = await _run_in_pilot(tmp_path, [plan.order.executable, *plan.order.arguments], plan.order.rank_environment)
    assert result["rc"] == 0, result
    lines = _lines(str(result["stdout"]))
    assert {r: (v["node"], v["cpus"]) for r, v in lines.items()} == {
        0: ("node1", "0"),
        1: ("node1", "1"),
        2: ("node2", "1"),
    }, result


@pytest.mark.timeout(90)
@pytest.mark.parametrize("per_node", [1, 2])
async def test_real_mpirun_across_two_slurm_nodes_prints_its_ranks(
    slurm_cluster: dict[str, str], tmp_path: Path, per_node: int
) -> None:
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed (CI installs Debian's openmpi-bin through .ci/slurm.sh)")
    ranks = [rp(node, [core]) for node in ("node1", "node2") for core in range(per_node)]
    (plan,) = MpirunLauncher().plan(
        job_id="8",
        description=job("/bin/sh", "-c", RANK_PRINTER),
        ranks=ranks,
        hosts=[r.node for r in ranks],
        environment=None,
    )
    env = dict(plan.order.rank_environment, PSIJ_NODEFILE="/dev/null")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    result = await _run_in_pilot(tmp_path, [plan.order.executable, *plan.order.arguments], env)
    assert result["rc"] == 0, result["stderr"]
    lines = _lines(str(result["stdout"]))
    assert {r: v["node"] for r, v in lines.items()} == {i: r.node for i, r in enumerate(ranks)}, result
    assert all(v["size"] == str(len(ranks)) for v in lines.values()), result


@pytest.mark.timeout(60)
def test_pilot_mpi_flavor_mpich_runs_hydras_mpiexec_with_the_placements_hosts(
    start_pilot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The config's ``pilot.mpi_flavor`` reaches the daemon's plans. MPICH is not installed next to Open MPI
    here: an ``mpiexec`` earlier on PATH records the command line the agent ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mpiexec").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (bin_dir / "mpiexec").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    pilot = start_pilot('[pilot]\nmpi_flavor = "mpich"\n[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 2\n')
    ex = pilot.executor()
    out = tmp_path / "out"
    j = psij.Job(
        psij.JobSpec(
            "/bin/app",
            ["x"],
            launcher="mpirun",
            stdout_path=out,
            resources=psij.ResourceSpecV1(node_count=2, processes_per_node=2),
        )
    )
    ex.submit(j)
    status = j.wait(timeout=30)
    assert status is not None and status.state is psij.JobState.COMPLETED, status
    host = socket.gethostname()
    assert out.read_text().split() == ["-n", "4", "-hosts", f"{host}:4", "/bin/app", "x"]

"""PBS (Pro and Torque), LSF, Flux and Grid Engine executors against mock commands replaying recorded
output (tests/mockbin, tests/data/lrm); plus the Slurm paths a healthy test cluster never takes
(accounting, a controller that does not answer), option validation and the site configs.

PBS, LSF and Flux cannot run on one CI machine; what is tested here is everything this side of their
commands: the generated batch scripts (executed for real, with mock launchers that start the agent
stand-in once per pretend host), the submit/status/cancel commands issued, and how their answers map
onto allocation states and messages.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from lrm_standin import standin_request
from structlog.testing import capture_logs

from pilot import config as config_mod
from pilot.config import ConfigError
from pilot.lrm import _batch, create
from pilot.lrm._batch import BatchExecutor, decode_wait_status, expand_hostlist, hosts_of, parse_clock
from pilot.lrm.base import Allocation, AllocationRequest, AllocationState
from pilot.lrm.flux import f58_to_int, parse_flux_jobs
from pilot.lrm.slurm import parse_squeue, slurm_time

HERE = Path(__file__).resolve().parent
MOCKBIN = HERE / "mockbin"
DATA = HERE / "data" / "lrm"
CONFIGS = HERE.parent / "configs"

pytestmark = pytest.mark.timeout(30)


class Mock:
    """The mock commands' state folder: answers to give, calls made."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def answer(self, key: str, *replies: dict[str, Any]) -> None:
        (self.folder / f"{key}.json").write_text(json.dumps(list(replies)))

    def calls(self, cmd: str | None = None) -> list[dict[str, Any]]:
        path = self.folder / "calls.jsonl"
        if not path.exists():
            return []
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return [r for r in rows if cmd is None or r["cmd"] == cmd]


def out(name: str, rc: int = 0) -> dict[str, Any]:
    return {"stdout": (DATA / name).read_text(), "rc": rc}


def err(name: str, rc: int) -> dict[str, Any]:
    return {"stderr": (DATA / name).read_text(), "rc": rc}


@pytest.fixture
def mock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Mock:
    folder = tmp_path / "mock"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{MOCKBIN}:{os.environ['PATH']}")
    monkeypatch.setenv("MOCK_LRM_DIR", str(folder))
    monkeypatch.setenv("MOCK_PYTHON", sys.executable)
    return Mock(folder)


@dataclass
class System:
    """One batch system's commands and recorded answers."""

    lrm: str
    options: dict[str, Any]
    native_id: str
    submit: tuple[str, dict[str, Any]]
    refused: dict[str, Any]
    query: str
    queued: dict[str, Any]
    running: dict[str, Any]
    finished: dict[str, Any]
    killed: dict[str, Any]
    unknown: dict[str, Any]
    cancel: list[str]
    killed_words: str
    hosts: list[str]
    #: Environment the batch system gives the script (its own variables), given the work directory.
    batch_env: dict[str, str]


def systems() -> dict[str, System]:
    flux_id = str(f58_to_int("ƒ2Xz7rE1Q"))
    return {
        "pbspro": System(
            lrm="pbs",
            options={"queue": "workq", "account": "abc123", "project": "proj9"},
            native_id="4242.pbs-server",
            submit=("qsub", out("pbs/qsub.out")),
            refused=err("pbs/qsub-bad-queue.err", 169),
            query="qstat",
            queued=out("pbs/qstat-f-queued.out"),
            running=out("pbs/qstat-f-running.out"),
            finished=out("pbs/qstat-fx-finished.out"),
            killed=out("pbs/qstat-fx-killed.out"),
            unknown=err("pbs/qstat-unknown.err", 35),
            cancel=["qdel", "4242.pbs-server"],
            killed_words="killed by signal 15",
            hosts=["cn001", "cn002"],
            batch_env={"PBS_JOBID": "4242.pbs-server"},
        ),
        "torque": System(
            lrm="pbs",
            options={"flavor": "torque", "queue": "batch", "reservation": "maint"},
            native_id="77.torque-server.example.com",
            submit=("qsub", {"stdout": "77.torque-server.example.com\n"}),
            refused={"stderr": "qsub: submit error (Unknown queue MSG=requested queue not found)\n", "rc": 1},
            query="qstat",
            queued={"stdout": (DATA / "pbs/torque-qstat-f-running.out").read_text().replace("= R", "= Q")},
            running=out("pbs/torque-qstat-f-running.out"),
            finished={"stdout": (DATA / "pbs/torque-qstat-f-completed.out").read_text().replace("= 3", "= 0")},
            killed=out("pbs/torque-qstat-f-completed.out"),
            unknown=err("pbs/torque-qstat-unknown.err", 153),
            cancel=["qdel", "77.torque-server.example.com"],
            killed_words="failed (exit code 3)",
            hosts=["n01", "n02"],
            batch_env={"PBS_JOBID": "77.torque-server.example.com"},
        ),
        "lsf": System(
            lrm="lsf",
            options={"queue": "normal", "project": "CSC123"},
            native_id="5151",
            submit=("bsub", out("lsf/bsub.out")),
            refused=err("lsf/bsub-bad-queue.err", 255),
            query="bjobs",
            queued=out("lsf/bjobs-pend.json"),
            running=out("lsf/bjobs-run.json"),
            finished=out("lsf/bjobs-done.json"),
            killed=out("lsf/bjobs-exit-killed.json"),
            unknown={**out("lsf/bjobs-notfound.json"), "rc": 255},
            cancel=["bkill", "5151"],
            killed_words="TERM_OWNER: job killed by owner",
            hosts=["cn001", "cn002"],
            batch_env={"LSB_JOBID": "5151", "LSB_HOSTS": "mock1 mock1 mock2 mock2"},
        ),
        "flux": System(
            lrm="flux",
            options={"queue": "pbatch", "account": "physics"},
            native_id=flux_id,
            submit=("flux-batch", out("flux/batch.out")),
            refused={"stderr": "flux-batch: ERROR: invalid queue 'nosuch' specified\n", "rc": 1},
            query="flux-jobs",
            queued=out("flux/jobs-sched.out"),
            running=out("flux/jobs-run.out"),
            finished=out("flux/jobs-completed.out"),
            killed=out("flux/jobs-canceled.out"),
            unknown=err("flux/jobs-unknown.err", 1),
            cancel=["cancel", flux_id],
            killed_words="was canceled outside the pilot",
            hosts=["cn001", "cn002"],
            batch_env={"FLUX_JOB_ID": flux_id},
        ),
        "sge": System(
            lrm="sge",
            options={"pe": "pilot", "queue": "all.q", "project": "p1"},
            native_id="6",
            submit=("qsub", {"stdout": "6\n"}),
            refused={"stderr": (DATA / "sge/qsub-bad-queue.err").read_text(), "rc": 1},
            query="qstat",
            queued={
                "stdout": (DATA / "sge/qstat-running-pending.xml")
                .read_text()
                .replace(">6<", ">66<")
                .replace(">7<", ">6<")
            },
            running=out("sge/qstat-running-pending.xml"),
            finished=out("sge/qacct-5.txt"),
            killed=out("sge/qacct-6-qdel.txt"),
            unknown={"stdout": (DATA / "sge/qstat-empty.xml").read_text()},
            cancel=["qdel", "6"],
            killed_words="qacct failed: 100 : assumedly after job",
            hosts=["localhost"],
            batch_env={"JOB_ID": "6"},
        ),
    }


SYSTEMS = systems()


def request(tmp_path: Path, nodes: int = 2, walltime: float | None = 600) -> AllocationRequest:
    return standin_request(
        tmp_path,
        nodes=nodes,
        walltime=walltime,
        url="tcp://login1:7777",
        PILOT_CURVE_SECRET_KEY="s3cret",
        TEST_SLEEP="0",
    )


def executor(system: System, **options: Any) -> BatchExecutor:
    ex = create(system.lrm, options={**system.options, "poll_interval": 0.1, "cancel_wait": 2, **options}, source="t")
    assert isinstance(ex, BatchExecutor)
    return ex


def answer_query(mock: Mock, system: System, reply: dict[str, Any]) -> None:
    """Make the status query give ``reply`` (Grid Engine: finished jobs come from qacct, not qstat)."""
    if system.lrm == "sge" and reply in (system.finished, system.killed):
        mock.answer("qstat", system.unknown)
        mock.answer("qacct", reply)
    else:
        mock.answer(system.query, reply)


async def poll(ex: BatchExecutor, *allocs: Allocation) -> None:
    ex._force = True
    await ex.poll(list(allocs))


# -- submit and the generated batch script --------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SYSTEMS))
async def test_submit_writes_the_script_and_keeps_secrets_off_command_lines(
    name: str, mock: Mock, tmp_path: Path
) -> None:
    system = SYSTEMS[name]
    mock.answer(*system.submit)
    ex = executor(system)
    alloc = await ex.submit(request(tmp_path))
    assert alloc.state is AllocationState.QUEUED, alloc.message
    assert alloc.native_id == system.native_id
    assert system.native_id in alloc.message
    (call,) = mock.calls(system.submit[0].split("-")[0])
    assert all("s3cret" not in a and "login1:7777" not in a for a in call["argv"])
    sub = ex.submission(alloc.native_id)
    assert sub is not None
    script = sub.script.read_text()
    assert "s3cret" not in script and "login1:7777" not in script
    if ex.env_in_file:
        # qstat shows a job's environment to everyone here: the settings go through a 0600 file.
        assert "PILOT_CURVE_SECRET_KEY" not in call["env"]
        assert stat.S_IMODE(sub.env_file.stat().st_mode) == 0o600
        assert "PILOT_CURVE_SECRET_KEY=s3cret" in sub.env_file.read_text()
    else:
        assert call["env"]["PILOT_CURVE_SECRET_KEY"] == "s3cret"
        assert not sub.env_file.exists()
    if name == "lsf":
        assert call["argv"] == [] and call["stdin"] == script  # bsub reads the script on stdin
    else:
        assert str(sub.script) in call["argv"]


@pytest.mark.parametrize("name", sorted(SYSTEMS))
async def test_generated_batch_script_starts_one_agent_per_host(name: str, mock: Mock, tmp_path: Path) -> None:
    system = SYSTEMS[name]
    mock.answer(*system.submit)
    ex = executor(system)
    alloc = await ex.submit(request(tmp_path))
    sub = ex.submission(alloc.native_id)
    assert sub is not None
    # Run the script as the batch system would: its own variables, plus the submission environment for
    # the systems that copy it into the job.
    (call,) = mock.calls(system.submit[0].split("-")[0])
    env = {"PATH": os.environ["PATH"], "MOCK_LRM_DIR": str(mock.folder), "MOCK_PYTHON": sys.executable}
    env.update(system.batch_env)
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("mock1\nmock2\n")
    env["PBS_NODEFILE"] = str(nodefile)
    hostfile = tmp_path / "pe_hostfile"
    hostfile.write_text("mock1 1 all.q@mock1 UNDEFINED\nmock2 1 all.q@mock2 UNDEFINED\n")
    env["PE_HOSTFILE"] = str(hostfile)
    if not ex.env_in_file:
        env.update(call["env"])
    proc = await anyio.run_process(["bash", str(sub.script)], env=env, check=False, cwd=sub.workdir)
    assert proc.returncode == 0, proc.stderr.decode()
    reports = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "reports").glob("agent-*.json")}
    assert sorted(reports) == ["agent-mock1", "agent-mock2"]
    for report in reports.values():
        assert report["url"] == "tcp://login1:7777"
        assert not any("login1:7777" in a for a in report["cmdline"])
    assert sub.exit_file.read_text().strip() == "0"
    logs = sorted(p.name for p in sub.workdir.glob(f"{sub.tag}-agent-*.log"))
    assert logs, "each agent's output goes to a log in the run directory"


@pytest.mark.parametrize("name", sorted(SYSTEMS))
async def test_refused_submission_fails_at_once_with_the_batch_systems_words(
    name: str, mock: Mock, tmp_path: Path
) -> None:
    system = SYSTEMS[name]
    mock.answer(system.submit[0], system.refused)
    alloc = await executor(system).submit(request(tmp_path))
    assert alloc.state is AllocationState.FAILED
    assert alloc.native_id == ""
    said = (system.refused.get("stderr") or "").strip().splitlines()[0]
    assert said in alloc.message and "refused the pilot" in alloc.message


# -- status -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SYSTEMS))
async def test_status_follows_queued_running_finished(name: str, mock: Mock, tmp_path: Path) -> None:
    system = SYSTEMS[name]
    mock.answer(*system.submit)
    ex = executor(system)
    alloc = await ex.submit(request(tmp_path))
    answer_query(mock, system, system.queued)
    await poll(ex, alloc)
    assert alloc.state is AllocationState.QUEUED, alloc.message
    assert alloc.message.startswith("queued in")
    if name in ("pbspro", "lsf", "flux"):
        assert alloc.reason and alloc.reason in alloc.message
    answer_query(mock, system, system.running)
    await poll(ex, alloc)
    assert alloc.state is AllocationState.ACTIVE, alloc.message
    assert alloc.hosts == system.hosts
    assert alloc.started is not None
    if name != "sge":
        assert alloc.walltime == 600
    answer_query(mock, system, system.finished)
    await poll(ex, alloc)
    assert alloc.state is AllocationState.DONE, alloc.message
    assert "agents exited" in alloc.message


@pytest.mark.parametrize("name", sorted(SYSTEMS))
async def test_killed_outside_the_pilot_fails_with_the_reason(name: str, mock: Mock, tmp_path: Path) -> None:
    system = SYSTEMS[name]
    mock.answer(*system.submit)
    ex = executor(system)
    alloc = await ex.submit(request(tmp_path))
    sub = ex.submission(alloc.native_id)
    assert sub is not None
    sub.stderr.write_text("=>> PBS: job killed: walltime exceeded\n")
    (sub.workdir / f"{sub.tag}-agent-cn001.log").write_text("agent: lost the daemon\n")
    answer_query(mock, system, system.killed)
    await poll(ex, alloc)
    assert alloc.state is AllocationState.FAILED, alloc.message
    assert system.killed_words in alloc.message
    assert "batch stderr" in alloc.message and "job killed: walltime exceeded" in alloc.message
    assert "agent on cn001: agent: lost the daemon" in alloc.message


@pytest.mark.parametrize("name", sorted(SYSTEMS))
async def test_job_vanishing_from_the_queue(name: str, mock: Mock, tmp_path: Path) -> None:
    """Gone from the queue: ENDING while accounting may still tell; its exit file decides; without one,
    FAILED saying the end is unknown."""
    system = SYSTEMS[name]
    mock.answer(*system.submit)
    mock.answer("qacct", {"stderr": (DATA / "sge/qacct-unknown.txt").read_text(), "rc": 1})
    for folder, wait in (("a", 60.0), ("b", 0.0)):
        ex = executor(system, accounting_wait=wait)
        alloc = await ex.submit(request(tmp_path / folder))
        answer_query(mock, system, system.running)
        await poll(ex, alloc)
        assert alloc.state is AllocationState.ACTIVE, alloc.message
        mock.answer(system.query, system.unknown)
        await poll(ex, alloc)
        if wait:
            assert alloc.state is AllocationState.ENDING and "left the queue" in alloc.message
            sub = ex.submission(alloc.native_id)
            assert sub is not None
            sub.exit_file.write_text("7\n")  # what the batch script leaves behind
            await poll(ex, alloc)
            assert alloc.state is AllocationState.FAILED and "exit code 7" in alloc.message
        else:
            assert alloc.state is AllocationState.FAILED
            assert "neither accounting nor its exit file" in alloc.message


@pytest.mark.parametrize("name", ["pbspro", "torque", "lsf", "flux"])
async def test_one_status_query_for_all_pilots(name: str, mock: Mock, tmp_path: Path) -> None:
    system = SYSTEMS[name]
    mock.answer(*system.submit)
    ex = executor(system)
    allocs = [await ex.submit(request(tmp_path / str(i))) for i in range(3)]
    answer_query(mock, system, system.running)
    await poll(ex, *allocs)
    calls = [c for c in mock.calls(system.query.split("-")[0]) if name != "flux" or c["argv"][0] == "jobs"]
    assert len(calls) == 1
    assert calls[0]["argv"].count(system.native_id) == 3 or calls[0]["argv"][-3:] == [system.native_id] * 3


@pytest.mark.parametrize("name", sorted(SYSTEMS))
async def test_cancel_releases_the_allocation(name: str, mock: Mock, tmp_path: Path) -> None:
    system = SYSTEMS[name]
    mock.answer(*system.submit)
    ex = executor(system)
    alloc = await ex.submit(request(tmp_path))
    answer_query(mock, system, system.running)
    await poll(ex, alloc)
    mock.answer(system.cancel[0] if name != "flux" else "flux-cancel", {"stdout": ""})
    answer_query(mock, system, system.killed)
    await ex.cancel(alloc)
    if name == "flux":
        (call,) = [c for c in mock.calls("flux") if c["argv"][0] == "cancel"]
        assert call["argv"] == system.cancel
    else:
        (call,) = mock.calls(system.cancel[0])
        assert call["argv"] == system.cancel[1:]
    assert alloc.state is AllocationState.DONE, alloc.message
    assert "released by the pilot" in alloc.message


# -- system-specific details ----------------------------------------------------------------------------


async def test_pbs_directives_pbspro_and_torque(mock: Mock, tmp_path: Path) -> None:
    pro = executor(SYSTEMS["pbspro"], cores_per_node=64, gpus_per_node=4, memory_per_node="256G")
    sub = pro.prepare(request(tmp_path, nodes=3, walltime=5400))
    script = pro.render_script(sub)
    for line in (
        "#PBS -l select=3:mpiprocs=1:ncpus=64:ngpus=4:mem=262144mb",
        "#PBS -l place=scatter:excl",
        "#PBS -l walltime=01:30:00",
        "#PBS -q workq",
        "#PBS -A abc123",
        "#PBS -P proj9",
        "#PBS -r n",
        f"pbsdsh -- /bin/sh {sub.agent_script}",
    ):
        assert line in script, line
    torque = executor(SYSTEMS["torque"], cores_per_node=16)
    script = torque.render_script(torque.prepare(request(tmp_path, nodes=2, walltime=60)))
    for line in ("#PBS -l nodes=2:ppn=16", "#PBS -n", "#PBS -W x=FLAGS:ADVRES:maint", "pbsdsh -u /bin/sh"):
        assert line in script, line
    mpi = executor(SYSTEMS["pbspro"], agent_launcher="mpiexec")
    assert "mpiexec -n 2 --ppn 1 /bin/sh" in mpi.render_script(mpi.prepare(request(tmp_path)))


async def test_lsf_directives_blaunch_and_jsrun(mock: Mock, tmp_path: Path) -> None:
    ex = executor(SYSTEMS["lsf"], cores_per_node=4, reservation="res7")
    script = ex.render_script(ex.prepare(request(tmp_path, nodes=2, walltime=5400)))
    for line in ("#BSUB -n 8", '#BSUB -R "span[ptile=4]"', "#BSUB -W 1:30", "#BSUB -x", "#BSUB -U res7", "blaunch -z"):
        assert line in script, line
    js = executor(SYSTEMS["lsf"], agent_launcher="jsrun")
    script = js.render_script(js.prepare(request(tmp_path, nodes=4)))
    assert "#BSUB -nnodes 4" in script and "#BSUB -x" not in script
    assert "jsrun --nrs 4 --rs_per_host 1 --tasks_per_rs 1" in script


async def test_flux_and_sge_directives(mock: Mock, tmp_path: Path) -> None:
    fx = executor(SYSTEMS["flux"])
    script = fx.render_script(fx.prepare(request(tmp_path, nodes=2, walltime=90.5)))
    for line in (
        "#flux: --nodes=2",
        "#flux: --exclusive",
        "#flux: --time-limit=91s",
        "#flux: --queue=pbatch",
        "#flux: --setattr=system.bank=physics",
        "flux run --nodes=2 --ntasks=2 /bin/sh",
    ):
        assert line in script, line
    sge = executor(SYSTEMS["sge"], slots_per_node=8, reservation="42", exclusive=True)
    script = sge.render_script(sge.prepare(request(tmp_path, nodes=3, walltime=3600)))
    for line in (
        "#$ -pe pilot 24",
        "#$ -l h_rt=01:00:00",
        "#$ -ar 42",
        "#$ -l exclusive=true",
        "#$ -S /bin/bash",
        "qrsh -inherit -nostdin",
    ):
        assert line in script, line


async def test_lsf_and_torque_jobs_jsrun_and_mpiexec_start_agents(mock: Mock, tmp_path: Path) -> None:
    for name, opts in (("lsf", {"agent_launcher": "jsrun"}), ("pbspro", {"agent_launcher": "mpiexec"})):
        system = SYSTEMS[name]
        mock.answer(*system.submit)
        ex = executor(system, **opts)
        folder = tmp_path / name
        alloc = await ex.submit(request(folder))
        sub = ex.submission(alloc.native_id)
        assert sub is not None
        (call,) = mock.calls(system.submit[0])[-1:]
        env = {"PATH": os.environ["PATH"], "MOCK_LRM_DIR": str(mock.folder), "MOCK_PYTHON": sys.executable}
        if not ex.env_in_file:
            env.update(call["env"])
        proc = await anyio.run_process(["bash", str(sub.script)], env=env, check=False)
        assert proc.returncode == 0, proc.stderr.decode()
        assert len(list((folder / "reports").glob("agent-*.json"))) == 2


async def test_flux_ids_are_kept_in_decimal() -> None:
    assert f58_to_int("ƒ1") == 0 and f58_to_int("f2") == 1 and f58_to_int("ƒ21") == 58
    with pytest.raises(ValueError):
        f58_to_int("ƒ0OIl")


# -- Slurm paths the test cluster never takes -----------------------------------------------------------


async def test_slurm_job_gone_from_squeue_is_looked_up_in_sacct_once(mock: Mock, tmp_path: Path) -> None:
    ex = create("slurm", options={"poll_interval": 0.1}, source="t")
    assert isinstance(ex, BatchExecutor)
    mock.answer("sbatch", {"stdout": "12\n"})
    alloc = await ex.submit(request(tmp_path))
    mock.answer("squeue", {"stdout": (DATA / "slurm/squeue-running-pending.out").read_text()})
    await poll(ex, alloc)
    assert alloc.state is AllocationState.ACTIVE and alloc.hosts == ["node1"] and alloc.walltime == 60
    mock.answer("squeue", err("slurm/squeue-unknown.err", 1))
    mock.answer("sacct", {"stdout": "12|TIMEOUT|0:15|node1|2026-11-21T20:43:04|00:01:00\n"})
    await poll(ex, alloc)
    assert alloc.state is AllocationState.FAILED
    assert "reached its time limit (TIMEOUT)" in alloc.message
    (call,) = mock.calls("sacct")
    assert "--jobs=12" in call["argv"]


async def test_slurm_without_accounting_stops_asking_sacct(mock: Mock, tmp_path: Path) -> None:
    ex = create("slurm", options={"poll_interval": 0.1, "accounting_wait": 0}, source="t")
    assert isinstance(ex, BatchExecutor)
    mock.answer("sbatch", {"stdout": "12;ci\n"}, {"stdout": "13\n"})
    one = await ex.submit(request(tmp_path / "1"))
    two = await ex.submit(request(tmp_path / "2"))
    assert one.native_id == "12"
    mock.answer("squeue", err("slurm/squeue-unknown.err", 1))
    mock.answer("sacct", err("slurm/sacct-disabled.err", 1))
    await poll(ex, one)
    await poll(ex, two)
    assert len(mock.calls("sacct")) == 1
    assert one.state is AllocationState.FAILED and two.state is AllocationState.FAILED


async def test_slurm_pilot_does_not_inherit_the_daemons_own_slurm_job(
    mock: Mock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon started inside an salloc must not export SLURM_NTASKS & co. into the pilot's job."""
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/site.conf")
    monkeypatch.setenv("SBATCH_ACCOUNT", "mine")
    ex = create("slurm", options={}, source="t")
    mock.answer("sbatch", {"stdout": "12\n"})
    await ex.submit(request(tmp_path))
    (call,) = mock.calls("sbatch")
    assert "SLURM_NTASKS" not in call["env"] and "SLURM_JOB_ID" not in call["env"]
    assert call["env"]["SLURM_CONF"] == "/etc/slurm/site.conf" and call["env"]["SBATCH_ACCOUNT"] == "mine"
    assert call["argv"][:2] == ["--parsable", "--export=ALL"]


async def test_slurm_controller_not_answering_keeps_states(mock: Mock, tmp_path: Path) -> None:
    ex = create("slurm", options={"poll_interval": 0.1}, source="t")
    assert isinstance(ex, BatchExecutor)
    mock.answer("sbatch", {"stdout": "12\n"})
    alloc = await ex.submit(request(tmp_path))
    mock.answer("squeue", {"stdout": (DATA / "slurm/squeue-running-pending.out").read_text()})
    await poll(ex, alloc)
    mock.answer("squeue", {"stderr": "squeue: error: slurm_receive_msg: Socket timed out on send/recv\n", "rc": 1})
    await poll(ex, alloc)
    assert alloc.state is AllocationState.ACTIVE


async def test_slurm_refusal_and_missing_command(mock: Mock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = create("slurm", options={}, source="t")
    mock.answer("sbatch", err("slurm/sbatch-bad-partition.err", 1))
    alloc = await ex.submit(request(tmp_path))
    assert alloc.state is AllocationState.FAILED
    assert "invalid partition specified: nope" in alloc.message
    monkeypatch.setenv("PATH", "/nonexistent")
    alloc = await ex.submit(request(tmp_path))
    assert alloc.state is AllocationState.FAILED and "command not found" in alloc.message
    with pytest.raises(ConfigError, match="needs sbatch, squeue, scancel on PATH"):
        ex.validate(nodes=2)


def test_recorded_squeue_lines_map_to_states() -> None:
    final = parse_squeue((DATA / "slurm/squeue-final.out").read_text(), {"3", "4", "5", "11"})
    assert final["11"].state is AllocationState.DONE and final["11"].exit_code == 0
    assert final["3"].state is AllocationState.FAILED and final["3"].exit_code == 3
    assert final["4"].native_state == "CANCELLED" and final["4"].signal == 15
    assert final["5"].signal == 9
    ids = (DATA / "slurm/ids-running-pending.txt").read_text().split()
    live = parse_squeue((DATA / "slurm/squeue-running-pending.out").read_text(), set(ids))
    assert live[ids[0]].state is AllocationState.ACTIVE and live[ids[0]].walltime == 60
    assert live[ids[1]].state is AllocationState.QUEUED and live[ids[1]].reason == "PartitionConfig"


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        # Slurm's SLURM_JOB_NODELIST and squeue/sacct NodeList: zero padding kept, several groups
        ("n[01-03,07],gpu[1-2]", ["n01", "n02", "n03", "n07", "gpu1", "gpu2"]),
        ("node[01-03,7],gpu[1-2]a,login", ["node01", "node02", "node03", "node7", "gpu1a", "gpu2a", "login"]),
        ("nid[001998-002001]", ["nid001998", "nid001999", "nid002000", "nid002001"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("node1", ["node1"]),
        ("node[1-2]\n", ["node1", "node2"]),
        ("login1.cluster.example.org,cn-ib[3-4]", ["login1.cluster.example.org", "cn-ib3", "cn-ib4"]),
        ("", []),
        # Flux's {nodelist} (RFC 29 hostlists): a prefix, one range list, an optional suffix
        ("cn[001-002]", ["cn001", "cn002"]),
        ("fluke[0-3,5]", ["fluke0", "fluke1", "fluke2", "fluke3", "fluke5"]),
        ("corona[171,173],lassen[7-8]-ib", ["corona171", "corona173", "lassen7-ib", "lassen8-ib"]),
    ],
)
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("node[1-3", "unbalanced brackets"),
        ("node1-3]", "unbalanced brackets"),
        ("node[3-1]", "start > stop"),
        ("node[a-c]", "bad range"),
        ("node[[1-2]]", "nested brackets"),
    ],
)
def test_expand_hostlist_errors(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"cannot expand the host list {text!r}: {why}")):
        expand_hostlist(text)


def test_hosts_of_what_the_lrms_report() -> None:
    assert hosts_of("(null)", lrm="slurm") is None and hosts_of("None assigned", lrm="slurm") is None
    assert hosts_of("  ", lrm="flux") is None
    with capture_logs() as logs:
        assert hosts_of("cn[001-002", lrm="slurm") is None  # a poll carries on without the hosts
    assert logs[0]["log_level"] == "warning" and "unbalanced brackets" in logs[0]["error"]
    slurm = parse_squeue("7|RUNNING|None|0|n[01-02,07],gpu[1-2]|2026-11-21T20:43:04|1:00|\n", {"7"})
    assert slurm["7"].hosts == ["n01", "n02", "n07", "gpu1", "gpu2"]
    assert slurm["7"].state is AllocationState.ACTIVE
    flux = parse_flux_jobs("42|RUN|||fluke[0-1,5]|1795293123.4|1795293723.4|||\n", {"42"})
    assert flux["42"].hosts == ["fluke0", "fluke1", "fluke5"]


def test_decode_wait_status() -> None:
    """Slurm's exit_code field is the raw wait status of the batch script."""
    assert decode_wait_status(0) == (0, None) and decode_wait_status(3 << 8) == (3, None)
    assert decode_wait_status(15) == (None, 15) and decode_wait_status(0x80 | 11) == (None, 11)  # core dumped
    assert decode_wait_status(0x137F) == (None, None)  # stopped: neither an exit nor a signal
    assert decode_wait_status(0xFFFFFFFE) == (None, None)  # Slurm's NO_VAL


def test_helpers() -> None:
    assert parse_clock("1:00") == 60 and parse_clock("2-01:00:00") == 2 * 86400 + 3600
    assert parse_clock("UNLIMITED") is None and parse_clock("30") == 1800
    # After a day count Slurm's fields are hours first: D-HH, D-HH:MM
    assert parse_clock("1-02") == 86400 + 2 * 3600 and parse_clock("0-02:30") == 2 * 3600 + 30 * 60
    assert slurm_time(60) == "00:01:00" and slurm_time(90061) == "1-01:01:01" and slurm_time(0.5) == "00:00:01"


# -- options and site configs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lrm", "options", "message"),
    [
        ("slurm", {"queue": "debug"}, "allocation.queue is not a slurm key; Slurm calls it allocation.partition"),
        ("slurm", {"partiton": "x"}, "unknown key allocation.partiton for lrm 'slurm'; allowed: lrm, nodes, walltime"),
        ("slurm", {"exclusive": "yes"}, "allocation.exclusive = 'yes' must be true or false"),
        ("slurm", {"poll_interval": 0.01}, "allocation.poll_interval = 0.01 must be at least 0.1"),
        ("slurm", {"directives": "--x\n--y"}, "allocation.directives"),
        ("pbs", {"flavor": "lsf"}, "allocation.flavor = 'lsf'; allowed: pbspro, torque"),
        ("pbs", {"reservation": "r1"}, "on PBS Pro submit to the reservation's queue"),
        ("pbs", {"memory_per_node": "lots"}, "allocation.memory_per_node = 'lots'"),
        ("lsf", {"account": "a"}, "LSF charges allocation.project"),
        ("flux", {"reservation": "r"}, "Flux has no reservations"),
        ("sge", {}, "allocation.pe is required for lrm 'sge'"),
        ("sge", {"pe": "mpi", "slots_per_node": 0}, "allocation.slots_per_node = 0 must be at least 1"),
    ],
)
def test_bad_options_name_the_key_and_what_is_allowed(lrm: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=r"^t: ") as exc:
        create(lrm, options=options, source="t")
    assert message in str(exc.value)


@pytest.mark.parametrize("kind", ["slurm", "pbs", "lsf", "flux", "sge"])
def test_site_configs_load_and_document_every_key(kind: str) -> None:
    path = CONFIGS / f"{kind}.toml"
    cfg = config_mod.load(path)
    assert cfg.allocation.lrm == kind
    ex = create(kind, options=cfg.allocation.options, source=str(path))
    assert isinstance(ex, BatchExecutor)
    text = path.read_text()
    for key in ex.opts:
        assert f"{key} =" in text, f"{path.name} does not document allocation.{key}"


def test_run_command_reports_missing_programs_and_timeouts() -> None:
    async def main() -> None:
        missing = await _batch.run_command(["/nonexistent/sbatch"])
        assert missing.returncode == 127 and "command not found" in missing.explain()
        slow = await _batch.run_command(["sleep", "5"], time_limit=0.2)
        assert slow.returncode == 124 and "no answer within 0.2 s" in slow.stderr

    anyio.run(main)


def test_mock_commands_are_executable() -> None:
    for path in MOCKBIN.iterdir():
        if not path.name.startswith("_"):
            assert os.access(path, os.X_OK), path
    assert (
        subprocess.run(
            [str(MOCKBIN / "qsub")],
            env={"MOCK_LRM_DIR": "/nonexistent", "PATH": os.defpath, "MOCK_PYTHON": sys.executable},
            capture_output=True,
            timeout=10,
        ).returncode
        != 0
    )

"""The Slurm LRM executor against a real 2-node Slurm cluster (../shared/slurm), nothing mocked.

Each test submits real ``sbatch`` pilots whose payload is either the real ``python -m agent`` (talking
to a ZeroMQ ROUTER bound here) or a stand-in agent that reports what it sees on its node.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import zmq
import zmq.asyncio
from lrm_standin import standin_request, until
from slurm_fixture import slurm_cluster

from pilot import wire
from pilot.lrm import _batch, create
from pilot.lrm.base import Allocation, AllocationRequest, AllocationState
from pilot.lrm.slurm import SlurmExecutor

__all__ = ["slurm_cluster"]


def executor(**options: Any) -> SlurmExecutor:
    ex = create("slurm", options={"poll_interval": 0.2, **options}, source="test")
    assert isinstance(ex, SlurmExecutor)
    return ex


def standin(tmp_path: Path, *, nodes: int = 2, walltime: float | None = 120, **env: str) -> AllocationRequest:
    return standin_request(tmp_path, nodes=nodes, walltime=walltime, url="tcp://daemon.invalid:5555", **env)


async def reports(tmp_path: Path, count: int, limit: float = 30) -> dict[str, dict[str, Any]]:
    folder = tmp_path / "reports"
    for _ in range(int(limit * 10)):
        found = sorted(folder.glob("agent-*.json"))
        if len(found) >= count:
            return {p.stem[len("agent-") :]: json.loads(p.read_text()) for p in found}
        await anyio.sleep(0.1)
    raise AssertionError(f"only {len(found)} of {count} agents reported within {limit} s")


@pytest.fixture
async def submitted() -> AsyncIterator[list[Allocation]]:
    """Allocations a test submitted; any still in Slurm afterwards are scancelled."""
    allocs: list[Allocation] = []
    yield allocs
    ids = [a.native_id for a in allocs if a.native_id]
    if ids:
        await anyio.run_process(["scancel", *ids], check=False)


@pytest.mark.timeout(60)
async def test_real_agents_register_under_their_slurm_node_names(
    slurm_cluster: dict[str, str], tmp_path: Path, submitted: list[Allocation]
) -> None:
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        ex = executor()
        request = AllocationRequest(
            nodes=2,
            walltime=120,
            agent_argv=[sys.executable, "-m", "agent"],
            agent_env={"PILOT_AGENT_URL": f"tcp://127.0.0.1:{port}", "PILOT_AGENT_HEARTBEAT": "0.5"},
            workdir=tmp_path / "agents",
        )
        alloc = await ex.submit(request)
        submitted.append(alloc)
        assert alloc.state is AllocationState.QUEUED, alloc.message
        registered: dict[str, str] = {}
        with anyio.fail_after(40):
            while len(registered) < 2:
                ident, frame = await sock.recv_multipart()
                msg = wire.decode(frame, allowed=wire.AGENT_KINDS)
                if msg.kind == wire.Kind.REGISTER:
                    registered[ident.decode()] = msg.body["node"]["name"]
                    await sock.send_multipart([ident, wire.encode(wire.Kind.REGISTERED, {"heartbeat_interval": 0.5})])
        assert registered == {"node1": "node1", "node2": "node2"}
        await until(ex, alloc, lambda a: a.state is AllocationState.ACTIVE)
        assert alloc.hosts == ["node1", "node2"]
        for name in registered:
            await sock.send_multipart([name.encode(), wire.encode(wire.Kind.STOP, {"reason": "test over"})])
        await until(ex, alloc, lambda a: a.state.final)
        assert alloc.state is AllocationState.DONE, alloc.message
        assert "its agents exited" in alloc.message
        assert alloc.exit_code == 0
    finally:
        sock.close(linger=0)
        ctx.term()


@pytest.mark.timeout(60)
async def test_one_agent_per_node_settings_from_the_environment_only(
    slurm_cluster: dict[str, str], tmp_path: Path, submitted: list[Allocation]
) -> None:
    ex = executor()
    alloc = await ex.submit(standin(tmp_path))
    submitted.append(alloc)
    seen = await reports(tmp_path, 2)
    assert set(seen) == {"node1", "node2"}
    for node, report in seen.items():
        assert report["url"] == "tcp://daemon.invalid:5555"
        assert not any("daemon.invalid" in arg for arg in report["cmdline"]), report["cmdline"]
        # The agents' step shape does not leak into what tasks inherit.
        assert "SLURM_NTASKS" not in report["env"] and "SLURM_NTASKS_PER_NODE" not in report["env"]
        assert report["env"]["SLURM_JOB_ID"] == alloc.native_id
        assert report["env"]["SLURMD_NODENAME"] == node if "SLURMD_NODENAME" in report["env"] else True
    sub = ex.submission(alloc.native_id)
    assert sub is not None
    script = sub.script.read_text()
    assert "daemon.invalid" not in script
    assert "--ntasks-per-node=1" in script and "#SBATCH --nodes=2" in script
    (tmp_path / "reports" / "stop").touch()
    await until(ex, alloc, lambda a: a.state.final)
    assert alloc.state is AllocationState.DONE, alloc.message


@pytest.mark.timeout(60)
async def test_bulk_poll_uses_one_squeue_for_all_pilots(
    slurm_cluster: dict[str, str], tmp_path: Path, submitted: list[Allocation], monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = executor()
    allocs = []
    for i in range(3):
        sub_dir = tmp_path / f"p{i}"
        sub_dir.mkdir()
        alloc = await ex.submit(standin(sub_dir, nodes=1))
        submitted.append(alloc)
        allocs.append(alloc)
    calls: list[list[str]] = []
    real = _batch.run_command

    async def counting(argv: list[str], **kw: Any) -> _batch.CommandResult:
        calls.append(list(argv))
        return await real(argv, **kw)

    monkeypatch.setattr("pilot.lrm.slurm.run_command", counting)
    monkeypatch.setattr("pilot.lrm._batch.run_command", counting)
    # The 2-node cluster runs two of the three exclusive pilots; the third waits (other test runs on
    # the same cluster may hold nodes too, so one running pilot is enough here).
    for _ in range(150):
        before = len(calls)
        await ex.poll(allocs)
        assert [c[0] for c in calls[before:]] in ([], ["squeue"]), calls[before:]
        if any(a.state is AllocationState.ACTIVE for a in allocs):
            break
        await anyio.sleep(0.2)
    assert any(a.state is AllocationState.ACTIVE for a in allocs), [a.message for a in allocs]
    squeues = [c for c in calls if c[0] == "squeue"]
    assert squeues and all(len(c[3].split("=")[1].split(",")) >= 2 for c in squeues)
    # Rate limit: polling again at once asks nobody.
    before = len(calls)
    ex.poll_interval = 60
    await ex.poll(allocs)
    assert len(calls) == before
    for alloc in allocs:
        await ex.cancel(alloc)
        assert alloc.state is AllocationState.DONE, alloc.message
        assert "released by the pilot (scancel)" in alloc.message


@pytest.mark.timeout(60)
async def test_scancel_from_outside_fails_the_allocation_naming_the_cancellation(
    slurm_cluster: dict[str, str], tmp_path: Path, submitted: list[Allocation]
) -> None:
    ex = executor()
    alloc = await ex.submit(standin(tmp_path))
    submitted.append(alloc)
    await until(ex, alloc, lambda a: a.state is AllocationState.ACTIVE)
    await reports(tmp_path, 2)
    await anyio.run_process(["scancel", alloc.native_id])
    t0 = time.monotonic()
    await until(ex, alloc, lambda a: a.state.final)
    assert time.monotonic() - t0 < 10
    assert alloc.state is AllocationState.FAILED
    assert alloc.native_state == "CANCELLED"
    assert "cancelled outside the pilot" in alloc.message and alloc.native_id in alloc.message


@pytest.mark.timeout(30)
async def test_bad_partition_fails_at_once_with_sbatchs_error(slurm_cluster: dict[str, str], tmp_path: Path) -> None:
    ex = executor(partition="nosuchpartition")
    t0 = time.monotonic()
    alloc = await ex.submit(standin(tmp_path))
    assert time.monotonic() - t0 < 5
    assert alloc.state is AllocationState.FAILED
    assert alloc.native_id == ""
    assert "invalid partition" in alloc.message.lower() and "sbatch" in alloc.message


@pytest.mark.timeout(60)
async def test_walltime_of_one_minute_reaches_slurm(
    slurm_cluster: dict[str, str], tmp_path: Path, submitted: list[Allocation]
) -> None:
    ex = executor()
    alloc = await ex.submit(standin(tmp_path, nodes=1, walltime=60))
    submitted.append(alloc)
    await until(ex, alloc, lambda a: a.state is AllocationState.ACTIVE)
    assert alloc.walltime == 60
    assert alloc.started is not None and abs(alloc.started - time.time()) < 30
    status = alloc.to_status()
    assert status["remaining"] is not None and 0 < status["remaining"] <= 60
    shown = await anyio.run_process(["scontrol", "show", "job", alloc.native_id])
    assert "TimeLimit=00:01:00" in shown.stdout.decode()
    await ex.cancel(alloc)
    assert alloc.state is AllocationState.DONE


@pytest.mark.timeout(60)
async def test_pending_pilot_shows_slurms_reason_and_can_be_released(
    slurm_cluster: dict[str, str], tmp_path: Path, submitted: list[Allocation]
) -> None:
    nodes = len(slurm_cluster["SLURM_CI_NODE_NAMES"].split(",")) + 1
    ex = executor()
    alloc = await ex.submit(standin(tmp_path, nodes=nodes))
    submitted.append(alloc)
    await until(ex, alloc, lambda a: a.native_state == "PENDING" and a.reason not in ("", "None"))
    assert alloc.state is AllocationState.QUEUED
    assert alloc.reason in alloc.message and alloc.native_id in alloc.message
    await ex.cancel(alloc)
    assert alloc.state is AllocationState.DONE, alloc.message


@pytest.mark.timeout(60)
async def test_failing_agents_fail_the_allocation_with_exit_code_and_their_output(
    slurm_cluster: dict[str, str], tmp_path: Path, submitted: list[Allocation]
) -> None:
    ex = executor()
    alloc = await ex.submit(standin(tmp_path, nodes=2, TEST_SLEEP="0", TEST_EXIT="3"))
    submitted.append(alloc)
    await until(ex, alloc, lambda a: a.state.final)
    assert alloc.state is AllocationState.FAILED
    assert alloc.exit_code == 3
    assert "exit code 3" in alloc.message
    assert "agent on node1" in alloc.message and "exiting with 3 as told" in alloc.message

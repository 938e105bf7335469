"""The Grid Engine executor against a real Son of Grid Engine (Debian's gridengine-*, set up by .ci/sge.sh).

One execution host only: SGE names an execution host after the machine, so one machine cannot pose as
several nodes (unlike Slurm's multiple-slurmd mode). Multi-host launching is covered by the mock tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from lrm_standin import standin_request, until
from machine_wide import machine_wide

from pilot.lrm import create
from pilot.lrm.base import Allocation, AllocationRequest, AllocationState
from pilot.lrm.sge import SgeExecutor

HERE = Path(__file__).resolve().parent
SETUP = HERE.parent / ".ci" / "sge.sh"


@pytest.fixture
def sge_cluster(sge_cell: str) -> Iterator[str]:
    """The Grid Engine cell, this test's alone while it runs (see machine_wide)."""
    with machine_wide("sge"):
        yield sge_cell


@pytest.fixture(scope="session")
def sge_cell() -> str:
    """Install (if needed) and start the single-host Grid Engine; its host name."""
    with machine_wide("sge"):
        return _start()


def _start() -> str:
    if os.geteuid() != 0:
        pytest.skip(".ci/sge.sh installs and starts Grid Engine as root; not root here")
    try:
        proc = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=400)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f".ci/sge.sh did not finish within 400 s:\n{exc.stdout}\n{exc.stderr}", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f".ci/sge.sh failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    os.environ.setdefault("SGE_ROOT", "/var/lib/gridengine")
    os.environ.setdefault("SGE_CELL", "default")
    return proc.stdout.strip().splitlines()[-1].split("=", 1)[1]


def executor(**options: Any) -> SgeExecutor:
    ex = create("sge", options={"pe": "pilot", "poll_interval": 0.2, **options}, source="test")
    assert isinstance(ex, SgeExecutor)
    return ex


def request(tmp_path: Path, **env: str) -> AllocationRequest:
    return standin_request(tmp_path, nodes=1, walltime=300, **env)


@pytest.fixture
async def submitted() -> AsyncIterator[list[Allocation]]:
    allocs: list[Allocation] = []
    yield allocs
    for a in allocs:
        if a.native_id:
            await anyio.run_process(["qdel", a.native_id], check=False)


@pytest.mark.timeout(60)
async def test_agent_starts_through_qrsh_inherit_and_the_job_ends_done(
    sge_cluster: str, tmp_path: Path, submitted: list[Allocation]
) -> None:
    ex = executor(slots_per_node=2)
    alloc = await ex.submit(request(tmp_path))
    submitted.append(alloc)
    assert alloc.state is AllocationState.QUEUED, alloc.message
    await until(ex, alloc, lambda a: a.state is AllocationState.ACTIVE)
    assert alloc.hosts == [sge_cluster]
    for _ in range(300):
        if list((tmp_path / "reports").glob("agent-*.json")):
            break
        await anyio.sleep(0.1)
    (report,) = [json.loads(p.read_text()) for p in (tmp_path / "reports").glob("agent-*.json")]
    assert report["url"] == "tcp://daemon.invalid:1"  # from the 0600 file, not qsub -v
    assert not any("daemon.invalid" in a for a in report["cmdline"])
    shown = await anyio.run_process(["qstat", "-j", alloc.native_id])
    assert b"daemon.invalid" not in shown.stdout, "qstat -j shows the environment to every user"
    (tmp_path / "reports" / "stop").touch()
    await until(ex, alloc, lambda a: a.state.final)
    assert alloc.state is AllocationState.DONE, alloc.message
    assert alloc.exit_code == 0


@pytest.mark.timeout(60)
async def test_qdel_from_outside_fails_the_allocation(
    sge_cluster: str, tmp_path: Path, submitted: list[Allocation]
) -> None:
    ex = executor()
    alloc = await ex.submit(request(tmp_path))
    submitted.append(alloc)
    await until(ex, alloc, lambda a: a.state is AllocationState.ACTIVE)
    await anyio.run_process(["qdel", alloc.native_id])
    t0 = time.monotonic()
    await until(ex, alloc, lambda a: a.state.final)
    assert time.monotonic() - t0 < 20
    assert alloc.state is AllocationState.FAILED
    assert "qacct failed: 100" in alloc.message and "qdel outside the pilot" in alloc.message


@pytest.mark.timeout(30)
async def test_bad_queue_fails_at_once(sge_cluster: str, tmp_path: Path) -> None:
    alloc = await executor(queue="nosuchqueue").submit(request(tmp_path))
    assert alloc.state is AllocationState.FAILED
    assert 'unknown queue "nosuchqueue"' in alloc.message


@pytest.mark.timeout(60)
async def test_waiting_pilot_is_queued_and_released_by_cancel(
    sge_cluster: str, tmp_path: Path, submitted: list[Allocation]
) -> None:
    ex = executor(slots_per_node=4096)
    alloc = await ex.submit(request(tmp_path))
    submitted.append(alloc)
    await until(ex, alloc, lambda a: a.native_state == "qw")
    assert alloc.state is AllocationState.QUEUED
    await ex.cancel(alloc)
    assert alloc.state is AllocationState.DONE, alloc.message
    assert "released by the pilot (qdel)" in alloc.message

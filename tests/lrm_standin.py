"""The agent stand-in the LRM tests run inside real (or mock) batch jobs, and waiting on an allocation."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import anyio

from pilot.lrm.base import Allocation, AllocationRequest, LrmExecutor

STANDIN = Path(__file__).resolve().parent / "data" / "lrm" / "agent_standin.py"


def standin_request(
    tmp_path: Path,
    *,
    nodes: int = 2,
    walltime: float | None = 120,
    url: str = "tcp://daemon.invalid:1",
    **env: str,
) -> AllocationRequest:
    """An allocation whose 'agents' are the stand-in: each reports what it saw into ``reports/``."""
    reports = tmp_path / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    return AllocationRequest(
        nodes=nodes,
        walltime=walltime,
        agent_argv=[sys.executable, str(STANDIN)],
        agent_env={"PILOT_AGENT_URL": url, "TEST_REPORT_DIR": str(reports), **env},
        workdir=tmp_path / "agents",
    )


async def until(ex: LrmExecutor, alloc: Allocation, pred: Callable[[Allocation], bool], limit: float = 30) -> None:
    """Poll the batch system (as the daemon does) until ``pred`` holds; fail after ``limit`` seconds."""
    with anyio.fail_after(limit):
        while not pred(alloc):
            await ex.poll([alloc])
            if pred(alloc):
                return
            await anyio.sleep(0.2)

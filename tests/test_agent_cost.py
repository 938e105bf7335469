"""bench/agent_cost.py: the agent it times in this process does the whole work -- every order decoded,
spawned as a real ``/bin/true`` through its spawn helper, reaped, and its exit reported to the daemon
this process plays -- so its figure is the agent's cost. Run as the bench runs (its own process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("window", "cores"), [(1, 1), (8, min(2, len(os.sched_getaffinity(0))))])
def test_agent_cost_runs_every_order_as_a_real_process(tmp_path: Path, window: int, cores: int) -> None:
    # (the bench frees each exit's core by the job's own record: an exit reported twice, or of a job it
    # never ordered, fails the run)
    out = tmp_path / "cost.json"
    args = ["--tasks", "200", "--cores", str(cores), "--window", str(window), "--repeat", "1", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.agent_cost", *args], cwd=ROOT, capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert run["exited_ok"] == 200  # each order ran, exited 0, and was reported once
    assert run["us_per_task"] > 0

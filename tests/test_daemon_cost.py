"""bench/daemon_cost.py: the in-process daemon it times does the whole work -- every job journaled,
placed, its exit taken, COMPLETED and logged as ended -- on its real sockets and journal, so its figure
is the daemon's cost. Run as the bench runs (its own process: it tunes the collector and the logs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(120)
def test_daemon_cost_runs_every_job_through_a_real_daemon(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    args = ["--tasks", "300", "--batch", "100", "--nodes", "2", "--cores", "4", "--repeat", "1", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.daemon_cost", *args], cwd=ROOT, capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert run["completed"] == 300
    assert run["logged_ended"] == 300
    assert run["turns"] >= 300 // (2 * 4 * 8)  # orders go at most a few slots deep per core and turn
    assert run["us_per_task"] > 0

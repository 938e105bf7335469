"""bench/client_cost.py: the real client, against the stand-in daemon it plays, takes every job from
submit() to its COMPLETED callback, one at a time, with the native id submit() returned. Run as the
bench runs (its own process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(120)
def test_client_cost_completes_every_job(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    args = ["--jobs", "100", "--warm", "5", "--repeat", "1", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.client_cost", *args], cwd=ROOT, capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert run["completed"] == 100
    assert run["threads"] >= 2  # the client's two workers at least
    assert run["us_per_task"] > 0

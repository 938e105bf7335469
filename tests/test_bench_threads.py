"""bench/threads.py: the threads it reads are the pilot's real ones, named, and every job ran. Run as the
bench runs (its own process, an embedded pilot of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(180)
def test_threads_attributes_each_process_cpu_to_named_threads(tmp_path: Path) -> None:
    out = tmp_path / "threads.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.threads", "--tasks", "200", "--repeat", "2", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, run = json.loads(out.read_text())["runs"]
    assert first["failed"] == run["failed"] == 0 and run["tasks_per_s"] > 0
    threads = run["threads"]
    # The agent's loop ran its turns; the orders went through a chain or a spawner, by the machine.
    assert threads["agent/pilot-loop"]["cpu_us"] > 0, threads
    assert any(
        k.startswith(("agent/pilot-chain", "agent/pilot-spawner")) and v["cpu_us"] > 0 for k, v in threads.items()
    )
    assert threads["helper/forkserver"]["cpu_us"] > 0, threads
    # The processes are looked up at each sample: a spawn helper that started with its cpu's first order
    # during the first run (the warm-up's one job used one cpu) counts in the second.
    if len(os.sched_getaffinity(0)) >= 2:
        assert run["processes"]["helper"] > first["processes"]["helper"], (first["processes"], run["processes"])
    assert threads["daemon/python"]["cpu_us"] > 0  # the daemon's main thread: its I/O loop and core
    assert threads["client/pilot-client"]["voluntary"] > 0  # the client's workers waited for statuses
    assert "cpu us per task by process" in proc.stdout

"""Stress (not in CI): kill -9 of the daemon and ``pilot up`` again, many times, while a stream of short
and long jobs runs with the backlog on (orders wait at the agent behind busy cores and are taken back
to free ones). Every job must end, and its marker file must show exactly one run.

    python tests/stress/restart_race.py [--cycles 30] [--jobs 400] [--seed 1] [--cores 4] [--interval 1.0]

Every job exits 0. Prints the counts and exits 1 if any job ran twice, never ran, did not end, or did
not end COMPLETED.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

import client as psij
from pilot.rundir import RunDir

CONFIG = """
[pilot]
heartbeat_interval = 0.5
agent_timeout = 10
backlog = 4

[allocation]
lrm = "local"
nodes = 1
cores_per_node = {cores}
"""


def _pilot(*args: str, rundir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pilot", *args, "--rundir", str(rundir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cores", type=int, default=4)
    ap.add_argument("--interval", type=float, default=1.0, help="most seconds between two kills")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="restart-race-"))
    marks = work / "marks"
    marks.mkdir()
    cfg = work / "pilot.toml"
    cfg.write_text(textwrap.dedent(CONFIG.format(cores=args.cores)))
    rundir = work / "run"
    env = dict(os.environ, PILOT_HOME=str(work / "home"))
    up = ["up", "--config", str(cfg)]
    proc = _pilot(*up, rundir=rundir, env=env)
    if proc.returncode:
        print(proc.stdout, proc.stderr)
        return 2
    ex = psij.JobExecutor.get_instance("pilot", url=str(rundir))
    ids: dict[str, str] = {}
    for i in range(args.jobs):
        sleep = rng.choice(["0", "0", "0", "0", "0", "0.05", "0.3", "1", "2"])
        spec = psij.JobSpec(
            executable="/bin/sh", arguments=["-c", f"echo run >> {marks}/{i}; sleep {sleep}"], name=f"j{i}"
        )
        job = psij.Job(spec)
        ex.submit(job)
        assert job.native_id is not None
        ids[str(i)] = job.native_id
    ex.close()
    for cycle in range(args.cycles):
        time.sleep(rng.uniform(0.1, args.interval))
        info = RunDir(rundir).read_info()
        assert info is not None
        daemon = psutil.Process(int(info["pid"]))  # type: ignore[call-overload]
        daemon.kill()
        daemon.wait(timeout=30)
        time.sleep(rng.uniform(0.0, 1.0))  # the agents run on, starting what waits behind cores
        proc = _pilot(*up, rundir=rundir, env=env)
        if proc.returncode:
            print(f"cycle {cycle}: pilot up failed: {proc.stdout} {proc.stderr}")
            return 2
        print(f"cycle {cycle + 1}/{args.cycles}: killed and resumed", flush=True)
    ex = psij.JobExecutor.get_instance("pilot", url=str(rundir))
    states: dict[str, str] = {}
    deadline = time.monotonic() + 600
    for name, native in ids.items():
        job = psij.Job()
        ex.attach(job, native)
        status = job.wait(timeout=max(1.0, deadline - time.monotonic()))
        states[name] = status.state.name if status is not None else "NOT FINAL"
    ex.close()
    _pilot("down", rundir=rundir, env=env)
    runs = {name: (marks / name).read_text().count("run") if (marks / name).exists() else 0 for name in ids}
    twice = sorted((n for n, r in runs.items() if r > 1), key=int)
    never = sorted((n for n, r in runs.items() if r == 0), key=int)
    unfinished = sorted((n for n, s in states.items() if s not in ("COMPLETED", "FAILED", "CANCELED")), key=int)
    failed = sorted((n for n, s in states.items() if s in ("FAILED", "CANCELED")), key=int)  # every one exits 0
    counts: dict[str, int] = {}
    for s in states.values():
        counts[s] = counts.get(s, 0) + 1
    print(f"{args.jobs} jobs, {args.cycles} kill -9 / pilot up cycles: final states {counts}")
    print(f"ran exactly once: {sum(1 for r in runs.values() if r == 1)}; twice or more: {twice}; never: {never}")
    print(f"not final: {unfinished}; failed or canceled: {failed}")
    return 1 if twice or never or unfinished or failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Code written for psij-python, unchanged: the plain loop through psij-python itself and our plugin.

    python bench/psij_loop.py [--tasks 5000] [--repeat 3] [--json FILE]

Issue 24's row "psij-python code, unchanged": ``import psij``, ``psij.JobExecutor.get_instance("pilot")``
(our plugin, found by psij-python's own discovery), ``for j in jobs: ex.submit(j)`` then ``j.wait()``
each, next to this machine's raw spawn rate (Popen from 2 threads) and our own client's same loop
(``import client as psij``), alternating in one run. psij-python's own per-job work -- its type-checked
``Job``/``JobSpec`` constructors, its condition variable and three status transitions per job -- is
measured apart (CPU µs per job with no pilot at all), so that its share of the gap is known.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: bench/ importable
from bench.throughput import raw_spawn_rate


def loop_rate(psij: Any, ex: Any, n: int, timeout: float = 600.0) -> tuple[float, int]:
    """Tasks/s of the plain PSI/J loop through ``ex`` (``psij`` is the module its Job comes from)."""
    spec = psij.JobSpec(executable="/bin/true")
    jobs = [psij.Job(spec) for _ in range(n)]
    t0 = time.perf_counter()
    for j in jobs:
        ex.submit(j)
    deadline = t0 + timeout
    for j in jobs:
        j.wait(timeout=timedelta(seconds=max(0.0, deadline - time.perf_counter())))
    rate = n / (time.perf_counter() - t0)
    failed = sum(1 for j in jobs if j.status.state != psij.JobState.COMPLETED)
    return rate, failed


def psij_own_cost(n: int) -> float:
    """CPU µs per job psij-python spends by itself: a Job and JobSpec made, then QUEUED, ACTIVE and
    COMPLETED set and waited for, with no executor (what every job costs before any pilot work)."""
    import psij

    t0 = time.thread_time()
    for _ in range(n):
        job = psij.Job(psij.JobSpec(executable="/bin/true"))
        for state in (psij.JobState.QUEUED, psij.JobState.ACTIVE, psij.JobState.COMPLETED):
            job.status = psij.JobStatus(state)
        job.wait()
    return (time.thread_time() - t0) / n * 1e6


def ours_own_cost(n: int) -> float:
    """The same for our client's Job (``import client as psij``): its share of the same loop."""
    import client
    from client.job_status import JobStatus

    t0 = time.thread_time()
    for _ in range(n):
        job = client.Job(client.JobSpec(executable="/bin/true"))
        for state in (client.JobState.QUEUED, client.JobState.ACTIVE, client.JobState.COMPLETED):
            job._set_status(JobStatus(state))
        job.wait()
    return (time.thread_time() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import psij

    import client

    saved = {k: os.environ.get(k) for k in ("PILOT_HOME", "PILOT_CONFIG")}
    try:
        return _run(args, psij, client)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run(args: argparse.Namespace, psij: Any, client: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pilot-bench-psij-") as home:
        os.environ["PILOT_HOME"] = home
        cfg = Path(home) / "bench.toml"
        cfg.write_text('[allocation]\nlrm = "local"\nnodes = 1\n')
        os.environ["PILOT_CONFIG"] = str(cfg)
        ours = client.JobExecutor.get_instance("pilot")  # starts the embedded pilot both share
        theirs = psij.JobExecutor.get_instance("pilot")  # the same embedded pilot (one per process)
        if type(theirs).__module__.split(".")[0] != "client":
            raise SystemExit(f"psij-python found {type(theirs)!r} for 'pilot', not this project's plugin")
        try:
            for module, ex in ((client, ours), (psij, theirs)):
                warm = module.Job(module.JobSpec(executable="/bin/true"))
                ex.submit(warm)
                warm.wait(timeout=timedelta(seconds=60))
            raw: list[float] = []
            rates: dict[str, list[float]] = {"psij-python": [], "client": []}
            failures = 0
            for i in range(args.repeat):
                raw.append(raw_spawn_rate(args.tasks))
                for name, module, ex in (("psij-python", psij, theirs), ("client", client, ours)):
                    rate, failed = loop_rate(module, ex, args.tasks)
                    rates[name].append(rate)
                    failures += failed
                print(
                    f"  run {i + 1}: raw {raw[-1]:6.0f}/s | psij-python {rates['psij-python'][-1]:6.0f}/s"
                    f" | client {rates['client'][-1]:6.0f}/s",
                    file=sys.stderr,
                )
        finally:
            theirs.close()  # our plugin's (psij-python's ABC has none)
            ours.close()
    own = {"psij-python": psij_own_cost(args.tasks), "client": ours_own_cost(args.tasks)}
    r = statistics.median(raw)
    med = {k: statistics.median(v) for k, v in rates.items()}
    for name in ("psij-python", "client"):
        print(
            f"{args.tasks:,} x /bin/true, plain loop via {name:<12} {med[name]:7.0f} tasks/s  raw {r:6.0f}/s"
            f"  ratio {med[name] / r:.2f}   {name}'s own work: {own[name]:.0f} cpu us/job"
        )
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "tasks": args.tasks,
        "raw_spawn_per_s": raw,
        "per_s": rates,
        "ratio": {k: v / r for k, v in med.items()},
        "own_cpu_us_per_job": own,
        "failures": failures,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()

"""A full allocation: every core busy, a queue behind them, at 1,000 and at 8,000 nodes (null launches).

    python bench/full_allocation.py [--nodes 1000 8000] [--cores 8] [--waves 3] [--rate 4000] [--repeat 1]

The workload a big allocation is for: more short tasks than cores, so that every core is busy and
each task that ends makes room for one that waits. ``--waves`` x nodes x cores one-core tasks of a
simulated duration of nodes x cores / ``--rate`` seconds go in through ``submit_all``: at every size
the tasks end at about ``--rate`` per second, so each size's daemon works at the same pace and its CPU
per task compares. The figure is the daemon's CPU per task at the largest size next to the smallest
(the baseline, alternating): a scheduler that looks at every node to place each task on a full
allocation would grow with the node count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from bench.null_launch import null_run
    from bench.report import saved

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1000, 8000])
    ap.add_argument("--cores", type=int, default=8, help="cores per simulated node")
    ap.add_argument("--waves", type=int, default=3, help="tasks per core")
    ap.add_argument("--rate", type=float, default=4000.0, help="tasks ending per second once all cores are busy")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in args.nodes}
    with tempfile.TemporaryDirectory(prefix="pilot-bench-full-") as home:
        os.environ["PILOT_HOME"] = home
        os.environ.pop("PILOT_NAME", None)
        for i in range(args.repeat):
            for n in args.nodes:
                duration = n * args.cores / args.rate
                r = null_run(
                    Path(home),
                    nodes=n,
                    cores=args.cores,
                    tasks=args.waves * n * args.cores,
                    nodes_per_agent=1000,
                    duration=duration,
                    timeout=600 + 10 * duration * args.waves,
                )
                runs[n].append(r)
                print(
                    f"  run {i + 1}, {n:>5} nodes x {args.cores} cores, tasks of {duration:g} s: "
                    f"{r['tasks_per_s']:7.0f} tasks/s, daemon {r['daemon_us_per_task']:.0f} us/task, "
                    f"{r['failed']} failed",
                    file=sys.stderr,
                )
    med = {n: statistics.median(r["daemon_us_per_task"] for r in rs) for n, rs in runs.items()}
    small, big = min(args.nodes), max(args.nodes)
    print(f"{'workload':<66}{'figure':>8}{'baseline':>10}{'ratio':>7}")
    label = f"full allocation, {big} sim. nodes x {args.cores} cores, daemon us/task"
    print(f"{label:<66}{med[big]:>8.0f}{med[small]:>10.0f}{med[big] / med[small]:>7.2f}")
    print(f"baseline = the same at {small} nodes; {args.waves} tasks per core ending at ~{args.rate:.0f}/s")
    return saved({"runs": runs, "median_daemon_us_per_task": med}, args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()

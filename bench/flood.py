"""A flood of submissions from one client (issue 5): the daemon's RSS stays bounded and every job completes.

    python bench/flood.py [--jobs 200000] [--max-queued 100000] [--json FILE]

One ``JobExecutor`` submits ``--jobs`` ``/bin/true`` jobs as fast as ``submit()`` returns to an embedded
local pilot (1 node). Past ``pilot.max_queued`` unfinished jobs the daemon holds each submit until there
is room, so the client slows to the pace jobs end. The daemon's RSS is sampled every 0.2 s (psutil).
Baseline: the same daemon's RSS when idle, measured in the same run just before the flood. The bound
checked is the one the README states: idle RSS + 2 KiB x max_queued + 64 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def bound(idle_rss: int, max_queued: int) -> int:
    """The README's stated bound on the daemon's RSS under a flood."""
    return idle_rss + 2048 * max_queued + (64 << 20)


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--max-queued", type=int, default=100_000)
    ap.add_argument(
        "--task-seconds", type=float, default=0.0, help="each job sleeps this long (0: /bin/true); fills the queue"
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import client as psij
    from bench.throughput import warm_up

    with tempfile.TemporaryDirectory(prefix="pilot-flood-") as home:
        os.environ["PILOT_HOME"] = home
        cfg = Path(home) / "flood.toml"
        cfg.write_text(f'[pilot]\nmax_queued = {args.max_queued}\n[allocation]\nlrm = "local"\nnodes = 1\n')
        os.environ["PILOT_CONFIG"] = str(cfg)
        with psij.JobExecutor.get_instance("pilot") as ex:
            warm_up(ex, None)
            daemon = psutil.Process(int(ex.pilot_status()["pilot"]["pid"]))
            time.sleep(1.0)
            idle = daemon.memory_info().rss
            peak = [idle]
            stop = threading.Event()

            def sample() -> None:
                while not stop.wait(0.2):
                    try:
                        peak[0] = max(peak[0], daemon.memory_info().rss)
                    except psutil.Error:
                        return

            done = threading.Semaphore(0)
            counts = {"COMPLETED": 0, "other": 0}

            def cb(job: psij.Job, status: psij.JobStatus) -> None:
                if status.final:
                    counts["COMPLETED" if status.state is psij.JobState.COMPLETED else "other"] += 1
                    done.release()

            ex.set_job_status_callback(cb)
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            spec = (
                psij.JobSpec(executable="/bin/sleep", arguments=[str(args.task_seconds)])
                if args.task_seconds
                else psij.JobSpec(executable="/bin/true")
            )
            most = [0]

            def unfinished() -> None:
                while not stop.wait(1.0):
                    jobs = ex.pilot_status()["jobs"]
                    most[0] = max(most[0], jobs.get("QUEUED", 0) + jobs.get("ACTIVE", 0))

            counter = threading.Thread(target=unfinished, daemon=True)
            counter.start()
            t0 = time.perf_counter()
            refused = 0
            for i in range(args.jobs):
                while True:
                    try:
                        ex.submit(psij.Job(spec))
                        break
                    except psij.SubmitException as exc:
                        if not exc.transient:
                            raise
                        refused += 1  # held past the daemon's limit: submit again, as a user would
                if (i + 1) % 20_000 == 0:
                    print(
                        f"  {i + 1} submitted, {time.perf_counter() - t0:.0f} s, daemon RSS "
                        f"{daemon.memory_info().rss / 2**20:.0f} MiB",
                        file=sys.stderr,
                    )
            submitted = time.perf_counter() - t0
            for _ in range(args.jobs):
                done.acquire()
            elapsed = time.perf_counter() - t0
            stop.set()
            sampler.join()
            counter.join()
            ex.set_job_status_callback(None)
            final_rss = daemon.memory_info().rss
    limit = bound(idle, args.max_queued)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cpus, {sys.platform}, Python {sys.version.split()[0]}",
        "jobs": args.jobs,
        "max_queued": args.max_queued,
        "completed": counts["COMPLETED"],
        "not_completed": counts["other"],
        "refused_and_resubmitted": refused,
        "task_seconds": args.task_seconds,
        "most_unfinished_seen": most[0],
        "submit_seconds": submitted,
        "total_seconds": elapsed,
        "idle_rss": idle,
        "peak_rss": peak[0],
        "final_rss": final_rss,
        "bound": limit,
        "within_bound": peak[0] <= limit,
    }
    mib = 2**20
    print(f"{'workload':<52}{'figure':>12}{'baseline':>12}{'ratio':>8}")
    print(
        f"{args.jobs} submissions, daemon peak RSS (MiB){'':<9}{peak[0] / mib:>12.0f}{idle / mib:>12.0f}"
        f"{peak[0] / idle:>8.2f}"
    )
    print(
        f"baseline = the daemon's idle RSS; bound idle + 2 KiB x {args.max_queued} + 64 MiB = {limit / mib:.0f} MiB "
        f"({'within' if result['within_bound'] else 'EXCEEDED'}); {counts['COMPLETED']} of {args.jobs} completed "
        f"in {elapsed:.0f} s; at most {most[0]} unfinished seen (sampled each second); {refused} submits refused "
        f"and made again; RSS after {final_rss / mib:.0f} MiB"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()

"""End-to-end throughput of short tasks through the PSI/J client vs this machine's raw spawn rate.

    python bench/throughput.py [--tasks 2000] [--repeat 3] [--nodes 1] [--json FILE]

Baseline: ``Popen('/bin/true')`` + ``wait`` from 2 threads, nothing else. Pilot: the same number of
``/bin/true`` jobs submitted through ``client.JobExecutor`` to an embedded local pilot, timed from the
first submit to the last final state (pilot start-up excluded, one warm-up job first). Runs alternate
so that machine noise hits both; medians and their ratio are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def raw_spawn_rate(n: int, threads: int = 2) -> float:
    """Tasks/s for n Popen+wait of /bin/true spread over ``threads`` threads."""
    per = [n // threads + (1 if i < n % threads else 0) for i in range(threads)]

    def work(k: int) -> None:
        for _ in range(k):
            subprocess.Popen(["/bin/true"]).wait()

    ts = [threading.Thread(target=work, args=(k,)) for k in per]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return n / (time.perf_counter() - t0)


def pilot_rate(ex: object, n: int, spec: object = None, timeout: float | None = None) -> tuple[float, int]:
    """Tasks/s for n jobs (``spec``, default /bin/true) through the client; returns (rate, failures).

    ``timeout``: seconds to wait for all final states (TimeoutError beyond); None waits forever."""
    import client as psij

    assert isinstance(ex, psij.JobExecutor)
    done = threading.Semaphore(0)
    failures = [0]

    def cb(job: psij.Job, status: psij.JobStatus) -> None:
        if status.final:
            if status.state is not psij.JobState.COMPLETED:
                failures[0] += 1
            done.release()

    ex.set_job_status_callback(cb)
    if spec is None:
        spec = psij.JobSpec(executable="/bin/true")
    assert isinstance(spec, psij.JobSpec)
    t0 = time.perf_counter()
    deadline = None if timeout is None else t0 + timeout
    for _ in range(n):
        ex.submit(psij.Job(spec))
    for i in range(n):
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        if not done.acquire(timeout=left):
            ex.set_job_status_callback(None)
            raise TimeoutError(f"{n - i} of {n} jobs not final after {timeout} s")
    rate = n / (time.perf_counter() - t0)
    ex.set_job_status_callback(None)
    return rate, failures[0]


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=1, help="virtual nodes of the embedded pilot")
    ap.add_argument(
        "--agent-transport",
        choices=["ipc", "tcp"],
        default="ipc",
        help="tcp: agents over CURVE-encrypted, authenticated TCP (security on)",
    )
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)

    import client as psij

    with tempfile.TemporaryDirectory(prefix="pilot-bench-") as home:
        os.environ["PILOT_HOME"] = home
        cfg = Path(home) / "bench.toml"
        cfg.write_text(
            f'[pilot]\nagent_transport = "{args.agent_transport}"\n[allocation]\nlrm = "local"\nnodes = {args.nodes}\n'
        )
        os.environ["PILOT_CONFIG"] = str(cfg)
        with psij.JobExecutor.get_instance("pilot") as ex:
            warm = psij.Job(psij.JobSpec(executable="/bin/true"))
            ex.submit(warm)
            warm.wait(timeout=60)
            raw: list[float] = []
            pil: list[float] = []
            failures = 0
            for i in range(args.repeat):
                raw.append(raw_spawn_rate(args.tasks))
                rate, failed = pilot_rate(ex, args.tasks)
                pil.append(rate)
                failures += failed
                print(
                    f"  run {i + 1}: raw {raw[-1]:7.0f}/s   pilot {pil[-1]:7.0f}/s   ratio {pil[-1] / raw[-1]:.2f}",
                    file=sys.stderr,
                )
    r, p = statistics.median(raw), statistics.median(pil)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cpus, {sys.platform}, Python {sys.version.split()[0]}",
        "tasks": args.tasks,
        "repeat": args.repeat,
        "nodes": args.nodes,
        "agent_transport": args.agent_transport,
        "raw_spawn_per_s": raw,
        "pilot_per_s": pil,
        "median_raw_spawn_per_s": r,
        "median_pilot_per_s": p,
        "ratio": p / r,
        "failures": failures,
    }
    print(f"{'workload':<44}{'figure':>12}{'baseline':>12}{'ratio':>8}")
    print(
        f"{args.tasks} x /bin/true through the client (tasks/s){p:>12.0f}{r:>12.0f}{p / r:>8.2f}".replace(
            "(tasks/s)", "(tasks/s) "
        )
    )
    print(
        f"baseline = raw spawn rate, Popen from 2 threads; medians of {args.repeat} alternating runs; "
        f"{failures} failed tasks"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()

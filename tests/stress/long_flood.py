"""Stress (not in CI): a plain ``submit()`` loop held at the daemon's ``max_queued`` for a long time.

    python tests/stress/long_flood.py [--minutes 60] [--max-queued 1000] [--task-seconds 0.1] [--cores 2]

One default executor submits as fast as ``submit()`` returns to an embedded local pilot whose
``pilot.max_queued`` is small, so for the whole run the daemon holds the client's stream at its limit
and the client waits on it (the case where a waiting client once gave up jobs its live daemon held).
Each job appends one line to a marker file of its own and sleeps ``--task-seconds``. At the end every
job must have ended COMPLETED and its marker must hold exactly one line. Prints the counts, the most
unfinished jobs seen and the daemon's peak RSS; exits 1 on any job lost, failed or run twice.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

import client as psij


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0, help="how long to keep submitting")
    ap.add_argument("--max-queued", type=int, default=1000)
    ap.add_argument("--task-seconds", type=float, default=0.1)
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pilot-long-flood-") as tmp:
        home = Path(tmp)
        markers = home / "markers"
        markers.mkdir()
        os.environ["PILOT_HOME"] = str(home)
        os.environ.pop("PILOT_NAME", None)
        cfg = home / "flood.toml"
        cfg.write_text(
            f"[pilot]\nmax_queued = {args.max_queued}\n"
            f'[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = {args.cores}\n'
        )
        os.environ["PILOT_CONFIG"] = str(cfg)
        lock = threading.Lock()
        states: dict[str, int] = {}
        final = threading.Semaphore(0)

        def cb(job: psij.Job, status: psij.JobStatus) -> None:
            if status.final:
                with lock:
                    states[status.state.name] = states.get(status.state.name, 0) + 1
                final.release()

        with psij.JobExecutor.get_instance("pilot") as ex:
            ex.set_job_status_callback(cb)
            daemon = psutil.Process(int(ex.pilot_status()["pilot"]["pid"]))
            idle = daemon.memory_info().rss
            peak, most = [idle], [0]
            stop = threading.Event()

            def watch() -> None:
                while not stop.wait(1.0):
                    try:
                        peak[0] = max(peak[0], daemon.memory_info().rss)
                        jobs = ex.pilot_status()["jobs"]
                    except (psutil.Error, psij.SubmitException):
                        continue
                    most[0] = max(most[0], jobs.get("QUEUED", 0) + jobs.get("ACTIVE", 0))

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            t0 = time.monotonic()
            end = t0 + args.minutes * 60
            n = refused = 0
            while time.monotonic() < end:
                spec = psij.JobSpec(
                    executable="/bin/sh",
                    arguments=["-c", f'echo 1 >> "$0"; sleep {args.task_seconds}', str(markers / str(n))],
                )
                try:
                    ex.submit(psij.Job(spec))
                except psij.SubmitException as exc:
                    if not exc.transient:
                        raise
                    refused += 1  # held past the daemon's limit: submit the same again, as a user would
                    continue
                n += 1
                if n % 10_000 == 0:
                    print(
                        f"  {n} submitted, {time.monotonic() - t0:.0f} s, {most[0]} unfinished at most, "
                        f"daemon RSS {daemon.memory_info().rss / 2**20:.0f} MiB",
                        file=sys.stderr,
                        flush=True,
                    )
            submitted = time.monotonic() - t0
            ended = sum(1 for _ in range(n) if final.acquire(timeout=args.max_queued * args.task_seconds + 600))
            stop.set()
            watcher.join()
            ex.set_job_status_callback(None)
        lines = [(markers / str(i)).read_text().count("1") if (markers / str(i)).exists() else 0 for i in range(n)]
    never, twice = sum(1 for k in lines if k == 0), sum(1 for k in lines if k > 1)
    print(
        f"{n} jobs submitted in {submitted:.0f} s ({refused} submits refused and made again); {ended} ended: "
        f"{states}; markers: {never} never ran, {twice} ran twice; at most {most[0]} unfinished seen "
        f"(max_queued {args.max_queued}); daemon RSS idle {idle / 2**20:.0f} MiB, peak {peak[0] / 2**20:.0f} MiB"
    )
    ok = ended == n and states.get("COMPLETED", 0) == n and never == 0 and twice == 0
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

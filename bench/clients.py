"""Many clients at once (issue 24's "many clients" row): client processes each streaming its jobs into
one pilot with the plain PSI/J loop on a default executor (``for j in jobs: ex.submit(j)``, then
``wait()`` each), against one such client alone in the same run.

Each client is a fresh ``python -c`` process that imports ``client as psij``, opens the pilot by its run
directory, makes its jobs (named ``c<client>-<i>``: the exactly-once check reads them back) and says
so; then all are told to go at once, and the rate is every client's jobs over the time from that word to
the last client's last job final. Exactly once: every job a client submitted got its own id and ended
COMPLETED, and the pilot's own list ('pilot jobs --json') holds each name exactly once.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

#: One client: prints "ready" once its jobs are made, waits for a line on stdin, runs the plain loop,
#: then prints one JSON line: its end time, its jobs' ids and the states of those not COMPLETED.
CLIENT = r"""
import json, sys, time
import client as psij

url, k, n, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
ex = psij.JobExecutor.get_instance("pilot", url=url)
jobs = [psij.Job(psij.JobSpec(executable="/bin/true", name=f"c{k}-{i}")) for i in range(n)]
print("ready", flush=True)
sys.stdin.readline()
deadline = time.time() + timeout
for j in jobs:
    ex.submit(j)
for j in jobs:
    j.wait(timeout=max(0.0, deadline - time.time()))
end = time.time()
bad = {j.native_id or f"c{k}-{i}": j.status.state.name for i, j in enumerate(jobs)
       if j.status.state is not psij.JobState.COMPLETED}
print(json.dumps({"end": end, "ids": [j.native_id for j in jobs], "bad": bad}), flush=True)
ex.close()
"""


def _line(out: IO[str], deadline: float, what: str) -> str:
    """One line from a client's stdout, waiting until ``deadline`` (time.time()) at most."""
    left = deadline - time.time()
    if left <= 0 or not select.select([out], [], [], left)[0]:
        raise TimeoutError(f"no {what} from a client in time")
    line = out.readline()
    if not line:
        raise RuntimeError(f"a client ended before its {what}")
    return line


def streams(
    url: str, clients: int, per: int, *, first: int, timeout: float, daemon: int | None = None
) -> dict[str, Any]:
    """``clients`` client processes (numbered from ``first``) each streaming ``per`` jobs at once:
    tasks/s over all of them, the ids they got, what did not end COMPLETED, and with ``daemon`` (its pid)
    the daemon's CPU µs per job over the run (a figure a busy machine moves much less than tasks/s)."""
    import psutil

    proc = psutil.Process(daemon) if daemon is not None else None
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, url, str(first + k), str(per), str(timeout)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(clients)
    ]
    try:
        deadline = time.time() + max(120.0, clients * 5.0)
        for p in procs:
            assert p.stdout is not None
            if _line(p.stdout, deadline, "ready").strip() != "ready":
                raise RuntimeError("a client said something else than ready")
        cpu0 = sum(proc.cpu_times()[:2]) if proc is not None else 0.0
        go = time.time()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            assert p.stdout is not None
            results.append(json.loads(_line(p.stdout, go + timeout + 60, "result")))
        cpu = sum(proc.cpu_times()[:2]) - cpu0 if proc is not None else None
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    end = max(r["end"] for r in results)
    ids = [i for r in results for i in r["ids"]]
    bad = {i: s for r in results for i, s in r["bad"].items()}
    us = None if cpu is None else cpu / (clients * per) * 1e6
    return {"per_s": clients * per / (end - go), "seconds": end - go, "ids": ids, "bad": bad, "daemon_us": us}


def listed(rundir: Path, total: int) -> Counter[str]:
    """How many times each client job's name is in the pilot's own list of its jobs."""
    limit = ["--limit", str(total + 1000)]
    out = subprocess.run(
        [sys.executable, "-m", "pilot", "jobs", "--rundir", str(rundir), "--json", "--job-name", "c*", *limit],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return Counter(str(row.get("name")) for row in json.loads(out.stdout))


def exactly_once(runs: list[tuple[int, int, dict[str, Any]]], names: Counter[str]) -> list[str]:
    """What breaks exactly-once, over runs of (first client, clients, what :func:`streams` said): jobs
    without an id or sharing one, jobs not COMPLETED, names the pilot lists not once."""
    faults: list[str] = []
    ids = [i for _, _, r in runs for i in r["ids"]]
    if None in ids:
        faults.append(f"{ids.count(None)} job(s) without an id")
    twice = [i for i, c in Counter(ids).items() if c > 1 and i is not None]
    if twice:
        faults.append(f"{len(twice)} id(s) given to more than one job, e.g. {twice[:3]}")
    bad = {i: s for _, _, r in runs for i, s in r["bad"].items()}
    if bad:
        faults.append(f"{len(bad)} job(s) not COMPLETED, e.g. {list(bad.items())[:3]}")
    want = {
        f"c{first + k}-{i}"
        for first, clients, r in runs
        for k in range(clients)
        for i in range(len(r["ids"]) // clients)
    }
    missing = want - set(names)
    extra = set(names) - want
    many = [n for n, c in names.items() if c > 1]
    for what, which in (
        ("not in the pilot's list", missing),
        ("listed but never sent", extra),
        ("listed more than once", many),
    ):
        if which:
            faults.append(f"{len(which)} job(s) {what}, e.g. {sorted(which)[:3]}")
    return faults

"""Stress (issue 19, not in CI): a daemon paused again and again under a stream of jobs blames no one.

    python tests/stress/daemon_pauses.py [--pauses 10] [--min 15] [--max 30] [--json FILE]

A local pilot (``pilot up``: its own daemon process, 2 nodes of 2 cores, default heartbeat, agent and
request timeouts) takes jobs from three clients at once -- a pipelined executor streaming short jobs,
a thread calling ``submit()`` one job at a time, and a thread calling ``submit_all()`` with batches --
plus long jobs that run across the pauses (at most 2 at a time: half the cores). Meanwhile the daemon
is stopped (SIGSTOP of its pid) for ``--min`` to ``--max`` seconds, ``--pauses`` times, a few seconds of
running between two pauses.

Every job appends a line to its own marker file when it starts. At the end, each job is checked
against what its client was told: COMPLETED means it ran exactly once; a submit that raised or a job
that ended FAILED means it never ran; no message may say "may"; the pilot holds no job that no client
knows (run with nobody following); and the daemon's log declares no agent lost. Exit status 1 if any
of that fails. Counts are printed (and written to ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

import client as psij

CONFIG = '[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 2\n'


class Jobs:
    """Every job made, by name, with its marker file; and every submit that raised."""

    def __init__(self, markers: Path) -> None:
        self.markers = markers
        self.lock = threading.Lock()
        self.jobs: dict[str, psij.Job] = {}
        self.raised: dict[str, str] = {}
        self._count = 0

    def make(self, kind: str, seconds: float = 0.0) -> psij.Job:
        with self.lock:
            self._count += 1
            name = f"{kind}-{self._count}"
        mark = self.markers / name
        script = f"echo ran >> {mark}" + (f"; sleep {seconds:g}" if seconds else "")
        job = psij.Job(psij.JobSpec(executable="/bin/sh", arguments=["-c", script], name=name))
        with self.lock:
            self.jobs[name] = job
        return job

    def refused(self, job: psij.Job, exc: BaseException) -> None:
        with self.lock:
            self.raised[job.spec.name or ""] = f"{type(exc).__name__}: {exc}"  # type: ignore[union-attr]

    def runs(self, name: str) -> int:
        mark = self.markers / name
        return len(mark.read_text().split()) if mark.exists() else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pauses", type=int, default=10)
    ap.add_argument("--min", type=float, default=15.0, dest="low")
    ap.add_argument("--max", type=float, default=30.0, dest="high")
    ap.add_argument("--rate", type=float, default=20.0, help="short jobs per second on the pipelined stream")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)

    with tempfile.TemporaryDirectory(prefix="pilot-pauses-") as tmp:
        home = Path(tmp)
        env = dict(os.environ, PILOT_HOME=str(home / "home"))
        os.environ["PILOT_HOME"] = env["PILOT_HOME"]
        cfg = home / "pilot.toml"
        cfg.write_text(CONFIG)
        rundir = home / "home" / "pauses"
        pilot = [sys.executable, "-m", "pilot"]
        up = subprocess.run([*pilot, "up", "--config", str(cfg), "--rundir", str(rundir)], env=env, timeout=120)
        if up.returncode != 0:
            sys.exit("pilot up failed")
        markers = home / "markers"
        markers.mkdir()
        jobs = Jobs(markers)
        try:
            report = _run(args, rng, rundir, jobs)
        finally:
            subprocess.run([*pilot, "down", "--rundir", str(rundir)], env=env, timeout=120, check=False)
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["ok"] else 1


def _run(args: argparse.Namespace, rng: random.Random, rundir: Path, jobs: Jobs) -> dict[str, Any]:
    url = str(rundir)
    piped = psij.JobExecutor.get_instance("pilot", url=url, pipelined=True)
    lone = psij.JobExecutor.get_instance("pilot", url=url)
    info = json.loads((rundir / "pilot.json").read_text())
    pid = int(info["pid"])
    stop = threading.Event()

    def stream() -> None:  # the pipelined executor: submit() returns at once
        while not stop.is_set():
            job = jobs.make("stream")
            try:
                piped.submit(job)
            except psij.SubmitException as exc:
                jobs.refused(job, exc)
            time.sleep(1 / args.rate)

    longs: list[psij.Job] = []

    def one_by_one() -> None:  # submit() waiting for each answer
        while not stop.is_set():
            # At most 2 long jobs unfinished: half the cores. Unbounded, a tenth of this thread's jobs
            # (some 4 a second) at 10-40 s each asked for ~10 cores of the 4, and the long jobs' queue
            # outlived the final wait by minutes (every job ran once; the run ended before they did).
            long = rng.random() < 0.1 and sum(1 for j in longs if not j.status.final) < 2
            job = jobs.make("long" if long else "single", rng.uniform(10, 40) if long else 0.0)
            if long:
                longs.append(job)
            try:
                lone.submit(job)
            except psij.SubmitException as exc:
                jobs.refused(job, exc)
            time.sleep(0.2)

    def batches() -> None:  # submit_all() of 50
        while not stop.is_set():
            batch = [jobs.make("batch") for _ in range(50)]
            try:
                lone.submit_all(batch)
            except psij.BatchSubmitException as exc:
                for job, error in exc.failed:
                    jobs.refused(job, error)
            stop.wait(3.0)

    threads = [threading.Thread(target=t, name=t.__name__) for t in (stream, one_by_one, batches)]
    for t in threads:
        t.start()
    paused: list[float] = []
    try:
        for _ in range(args.pauses):
            time.sleep(rng.uniform(3, 6))
            seconds = rng.uniform(args.low, args.high)
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(seconds)
            finally:
                os.kill(pid, signal.SIGCONT)
            paused.append(round(seconds, 1))
            print(f"pause {len(paused)}: {seconds:.1f} s; {len(jobs.jobs)} jobs so far", file=sys.stderr)
        time.sleep(3)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    deadline = time.monotonic() + 300
    for job in list(jobs.jobs.values()):
        if job.spec is not None and job.spec.name not in jobs.raised:
            job.wait(timeout=max(0.0, deadline - time.monotonic()))
    pilot_ids = set(lone.list())
    known = {job.native_id for job in jobs.jobs.values() if job.native_id is not None}
    piped.close()
    lone.close()
    return _check(jobs, rundir, paused, pilot_ids, known)


def _check(jobs: Jobs, rundir: Path, paused: list[float], pilot_ids: set[str], known: set[str]) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    bad: list[str] = []
    for name, job in jobs.jobs.items():
        runs = jobs.runs(name)
        state = job.status.state
        message = job.status.message or jobs.raised.get(name) or ""
        if "may" in message.split():
            bad.append(f"{name}: a guess: {message}")
        if name in jobs.raised:
            counts["submit raised (never ran)" if runs == 0 else "MISREPORTED: raised, yet ran"] += 1
            if runs:
                bad.append(f"{name}: submit raised ({message}) yet it ran {runs} time(s)")
        elif state is psij.JobState.COMPLETED:
            counts["completed, ran once" if runs == 1 else "MISREPORTED: completed, ran != 1"] += 1
            if runs != 1:
                bad.append(f"{name}: COMPLETED but ran {runs} time(s)")
        elif state is psij.JobState.FAILED:
            counts["failed (never ran)" if runs == 0 else "MISREPORTED: failed, yet ran"] += 1
            bad.append(f"{name}: FAILED ({message}), ran {runs} time(s)")
        else:
            counts[f"MISREPORTED: not final ({state})"] += 1
            bad.append(f"{name}: still {state}")
    stray = sorted(pilot_ids - known, key=int)
    if stray:
        bad.append(f"jobs the pilot holds that no client follows: {stray[:20]}")
    log = (rundir / "daemon.log").read_text() if (rundir / "daemon.log").exists() else ""
    lost = [line for line in log.splitlines() if "agent gone" in line]
    stalls = [line for line in log.splitlines() if "agents are not blamed for it" in line]
    bad.extend(f"agent blamed: {line}" for line in lost[:5])
    return {
        "ok": not bad,
        "pauses_s": paused,
        "jobs": len(jobs.jobs),
        "counts": dict(counts),
        "pilot_jobs_nobody_follows": len(stray),
        "agents_declared_lost": len(lost),
        "pauses_measured_by_the_daemon": len(stalls),
        "problems": bad[:50],
    }


if __name__ == "__main__":
    sys.exit(main())

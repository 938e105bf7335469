"""``pilot run``: N short tasks through the PSI/J client, on the pilot the one rule picks (or an embedded
one, said so, when none of the user's pilots runs), with a progress bar on a terminal and a summary.

The first Ctrl-C cancels the run's unfinished jobs and prints what came of the run so far; a second one
exits at once (the embedded pilot, if any, notices its parent is gone and stops)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from pilot.cli.common import add_target, duration_arg, fail, pilot_name, positive_int, rundir_of
from pilot.model.job_description import RUN_TAG
from pilot.model.output_stream import STREAM_OUTPUT


def add_parsers(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="the main job: N short tasks through the PSI/J client",
        description="Run N copies of a command as jobs. Everything after the options (or after '--') is the "
        "command, '--' inside it included: pilot run -n 4 -- grep -e x -- file",
    )
    add_target(run)
    run.add_argument("-n", "--tasks", type=positive_int, default=1000, help="how many tasks (default 1000)")
    run.add_argument("--url", help="pilot address or run dir, given explicitly (over --name)")
    run.add_argument(
        "--embedded",
        action="store_true",
        help="start a private pilot for this run when the chosen one is not running, even though other pilots "
        "of yours are (without it, that is refused)",
    )
    run.add_argument("--config", type=Path, help="the embedded pilot's config (default: $PILOT_CONFIG)")
    run.add_argument(
        "--duration",
        type=duration_arg,
        help="each task's walltime (JobAttributes.duration: 90, 10m, HH:MM:SS); default PSI/J's 10 minutes",
    )
    run.add_argument("--json", action="store_true", help="print the summary as JSON")
    run.add_argument(
        "--no-output",
        action="store_true",
        help="discard the tasks' stdout and stderr (default: kept in the pilot's stream files; 'pilot logs ID')",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="command per task (default: /bin/true)")
    run.set_defaults(func=run_cmd)


def _target(args: argparse.Namespace) -> str | None:
    """The url to give the executor: the chosen pilot's run directory when it runs; None to start an
    embedded one (said on stderr) when no pilot of the user runs, or ``--embedded`` says so."""
    if args.url:
        return str(args.url)
    rundir = rundir_of(args)
    if rundir.read_info() is not None:
        return str(rundir.path)
    from pilot.cli.lifecycle import pilots

    others = [p for p in pilots() if p["state"] == "running" and not p["embedded"]]
    if others and not args.embedded:
        names = ", ".join(f"{p['name']} (pid {p['pid']})" for p in others)
        fail(
            f"no pilot is running in {rundir.path}, but these of yours are: {names}; pick one with --name NAME "
            "(or PILOT_NAME), or give --embedded to start a private pilot for this run"
        )
    if args.config:
        os.environ["PILOT_CONFIG"] = str(args.config.expanduser().resolve())
    # The client finds a running pilot by PILOT_NAME itself: it must look where this rule looked.
    os.environ["PILOT_NAME"] = rundir.path.name if args.rundir else pilot_name(args)[0]
    config = os.environ.get("PILOT_CONFIG") or "configs/local.toml"
    print(f"pilot run: no pilot is running; starting an embedded one for this run (config {config})", file=sys.stderr)
    return None


def run_cmd(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    import client as psij

    cmd = list(args.cmd)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]  # the separator only: a '--' inside the command is the command's
    cmd = cmd or ["/bin/true"]
    n = args.tasks
    url = _target(args)
    run_id = time.strftime("run-%Y%m%d-%H%M%S-") + str(os.getpid())
    done = threading.Semaphore(0)
    finals: dict[str, tuple[psij.Job, psij.JobStatus]] = {}
    lock = threading.Lock()

    def on_status(job: psij.Job, status: psij.JobStatus) -> None:
        if status.final:
            with lock:
                finals[job.id] = (job, status)
            done.release()

    t_start = time.monotonic()
    interrupted = False
    # Not pipelined: a bulk submit takes its ids from the pilot, and a pipelined executor would lease a block
    # of ids at once that nothing uses (each command's job ids would start 256 further on).
    with psij.JobExecutor.get_instance("pilot", url=url, pipelined=False) as ex:
        ex.set_job_status_callback(on_status)
        # Connect (starting the embedded pilot if none runs) and let its agents register, so start-up is
        # timed apart from the run and the progress bar starts when tasks can.
        deadline = time.monotonic() + 120
        while (ex.pilot_status().get("allocation") or {}).get("state") == "starting" and time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = t_submitted = time.monotonic()
        # Output is kept where 'pilot logs' reads it (one stream file per node), unless asked not to.
        attributes = psij.JobAttributes(custom_attributes={RUN_TAG: run_id, STREAM_OUTPUT: not args.no_output})
        if args.duration is not None:
            attributes.duration = timedelta(seconds=args.duration)
        jobs = [psij.Job(psij.JobSpec(executable=cmd[0], arguments=cmd[1:], attributes=attributes)) for _ in range(n)]
        print(f"pilot run: {run_id}: {n} task(s) of {' '.join(cmd)!r}", file=sys.stderr, flush=True)
        bar = tqdm(
            total=n, desc="tasks", unit="task", file=sys.stderr, mininterval=0.2, disable=not sys.stderr.isatty()
        )
        try:
            try:
                # One bulk submission, as a workflow engine with the jobs at hand would (requests pipelined).
                ex.submit_all(jobs)
            except psij.BatchSubmitException as exc:
                bar.close()
                _cancel(ex, [j.native_id for j in jobs if j.native_id is not None])  # all of the run or none
                invalid = all(isinstance(e, psij.InvalidJobException) for e in exc.exceptions)
                fail(f"{exc.message}; the run's other jobs were canceled", code=2 if invalid else 1)
            t_submitted = time.monotonic()
            for _ in range(n):
                done.acquire()
                bar.update(1)
        except KeyboardInterrupt:
            interrupted = True
            signal.signal(signal.SIGINT, _exit_now(run_id))
            bar.close()
            _cancel_unfinished(ex, jobs, run_id, done)
        t_end = time.monotonic()
        bar.close()
        pilot_status = ex.pilot_status()
        kept = _keep_embedded(url, n, finals)
    _summary(args, run_id, cmd, n, finals, pilot_status, interrupted, t_start, t0, t_submitted, t_end, kept)


def _keep_embedded(url: str | None, n: int, finals: dict[str, tuple[Any, Any]]) -> str | None:
    """An embedded pilot's run directory goes when it stops, and with it the jobs' output and history:
    when some job did not complete, it is kept, and the name to give 'pilot logs/show/history' is returned."""
    import client as psij
    from client import _embedded

    if url is not None or (len(finals) == n and all(s.state is psij.JobState.COMPLETED for _, s in finals.values())):
        return None
    rundir = _embedded.keep_rundir()
    if rundir is None:
        return None
    print(
        f"pilot run: the embedded pilot's run directory is kept for its jobs' output and history: {rundir.path} "
        "(remove it when done)",
        file=sys.stderr,
    )
    return rundir.path.name


def _exit_now(run_id: str) -> Any:
    def handler(signum: int, frame: FrameType | None) -> None:
        print(
            f"\npilot run: interrupted again: exiting now ('pilot cancel --run {run_id}' stops what is left)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(130)

    return handler


def _cancel(ex: Any, ids: list[str]) -> None:
    """One request per 5,000 jobs, not one per job: a run may have thousands left."""
    from pilot import wire

    for start in range(0, len(ids), 5000):
        ex._backend.request(wire.Kind.CANCEL, {"ids": ids[start : start + 5000]})


def _cancel_unfinished(ex: Any, jobs: list[Any], run_id: str, done: threading.Semaphore) -> None:
    ids = [j.native_id for j in jobs if j.native_id is not None and not j.status.final]
    print(
        f"\npilot run: interrupted: canceling the {len(ids)} unfinished job(s) of {run_id} "
        "(Ctrl-C again to exit at once)",
        file=sys.stderr,
        flush=True,
    )
    _cancel(ex, ids)
    deadline = time.monotonic() + 60
    while any(j.native_id is not None and not j.status.final for j in jobs) and time.monotonic() < deadline:
        done.acquire(timeout=0.2)


def _summary(
    args: argparse.Namespace,
    run_id: str,
    cmd: list[str],
    n: int,
    finals: dict[str, tuple[Any, Any]],
    pilot_status: dict[str, Any],
    interrupted: bool,
    t_start: float,
    t0: float,
    t_submitted: float,
    t_end: float,
    kept: str | None,
) -> None:
    import client as psij

    ended = list(finals.values())
    completed = sum(1 for _, s in ended if s.state is psij.JobState.COMPLETED)
    canceled = [(j, s) for j, s in ended if s.state is psij.JobState.CANCELED]
    failed = [(j, s) for j, s in ended if s.state is psij.JobState.FAILED]
    md = [s.metadata or {} for _, s in ended]
    summary: dict[str, Any] = {
        "run": run_id,
        "tasks": n,
        "completed": completed,
        "failed": len(failed),
        "canceled": len(canceled),
        "not_ended": n - len(ended),
        "interrupted": interrupted,
        "command": cmd,
        "nodes": len(pilot_status.get("nodes", [])),
        "startup_seconds": t0 - t_start,
        "submit_seconds": t_submitted - t0,
        "makespan_seconds": t_end - t0,
        "tasks_per_second": len(ended) / (t_end - t0) if t_end > t0 else 0.0,
        "delivered": {
            "wall_seconds": sum(m.get("wall_duration", 0.0) for m in md),
            "user_cpu_seconds": sum(m.get("user_cpu_time", 0.0) for m in md),
            "system_cpu_seconds": sum(m.get("system_cpu_time", 0.0) for m in md),
            "max_rss_bytes": max((m.get("max_rss", 0) for m in md), default=0),
            "processors": sum(m.get("processors", 0) for m in md),
        },
        "failures": [
            {"id": j.native_id, "state": str(s.state), "exit_code": s.exit_code, "message": s.message}
            for j, s in failed[:100]
        ],
    }
    code = 130 if interrupted else 1 if failed or canceled or len(ended) < n else 0
    if args.json:
        print(json.dumps(summary, indent=2))
        if code:
            sys.exit(code)
        return
    d = summary["delivered"]
    head = "interrupted: " if interrupted else ""
    tail = f", {len(canceled)} canceled" if canceled else ""
    tail += f", {summary['not_ended']} not ended" if summary["not_ended"] else ""
    print(
        f"{head}{n} tasks of {' '.join(cmd)!r} on {summary['nodes']} node(s) ({run_id}): {completed} completed, "
        f"{len(failed)} failed{tail}"
    )
    print(
        f"  {summary['tasks_per_second']:.0f} tasks/s end to end (submit {summary['submit_seconds']:.2f} s, "
        f"makespan {summary['makespan_seconds']:.2f} s, pilot start {summary['startup_seconds']:.2f} s)"
    )
    print(
        f"  Delivered: wall {d['wall_seconds']:.2f} s, user CPU {d['user_cpu_seconds']:.2f} s, "
        f"system CPU {d['system_cpu_seconds']:.2f} s, max RSS {d['max_rss_bytes'] / 2**20:.1f} MiB, "
        f"{d['processors']} processor-slots"
    )
    # An embedded pilot is gone by the time the user reads this: its kept run directory is named.
    name = f" --name {kept}" if kept else ""
    for j, s in failed[:5]:
        code_text = f"exit {s.exit_code}" if s.exit_code is not None else "no exit code"
        print(
            f"  failed: job {j.native_id}: {code_text}: {s.message}"
            f" ('pilot logs {j.native_id}{name}' for its output, 'pilot show {j.native_id}{name}' for more)"
        )
    if len(failed) > 5:
        listing = "history" if kept else "jobs"
        print(f"  ... and {len(failed) - 5} more: 'pilot {listing}{name} --run {run_id} --state FAILED'")
    if code:
        sys.exit(code)

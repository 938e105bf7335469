"""``pilot logs``: a job's output and how it ended, where a user looks first.

The output is what its agent appended to the node's stream files (jobs of ``pilot run`` and ``pilot
submit`` stream what they name no file for; others with ``pilot.stream_output``), read back from the
run directory, never through the daemon, and the files the job named (``--stdout``/``stdout_path``),
read where they are. By default the last lines of each; ``-f`` follows the streams until the job ends.
How it ended (state, exit code or signal, the pilot's message) comes from the daemon, or from the
job history once the pilot is down; it goes to stderr, after the output, so that stdout stays the
job's own.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from pilot.cli.common import add_target, fail, non_negative_int, rundir_of
from pilot.rundir import RunDir

#: Lines of each stream shown by default (``-n 0``: all of them).
DEFAULT_LINES = 100


def add_parsers(sub: Any) -> None:
    lg = sub.add_parser(
        "logs",
        help="a job's output (the last lines of its stdout and stderr) and how it ended",
        description="Print the end of a job's stdout (to stdout) and stderr (to stderr): what it streamed to "
        "its node's stream file (pilot run and pilot submit jobs do) and the files it named. Then, on "
        "stderr, how it ended: state, exit code or signal, and the pilot's message.",
    )
    add_target(lg)
    lg.add_argument("id")
    lg.add_argument("-f", "--follow", action="store_true", help="follow its streamed output until the job ends")
    lg.add_argument(
        "-n",
        "--lines",
        type=non_negative_int,
        default=DEFAULT_LINES,
        metavar="N",
        help=f"the last N lines of each of stdout and stderr (default {DEFAULT_LINES}; 0: all)",
    )
    lg.set_defaults(func=logs_cmd)


def logs_cmd(args: argparse.Namespace) -> None:
    from client.output import OutputReader

    rundir = rundir_of(args)
    job_id = str(args.id)
    job, earlier = _job(rundir, job_id)
    submitted = job.get("submitted") if earlier and job is not None else None
    reader = OutputReader(
        job_id, rundir=rundir.path, submitted=float(submitted) if isinstance(submitted, int | float) else None
    )
    records = reader.read()
    if job is None and not records:
        where = "its pilot" if rundir.read_info() is not None else "its job history"
        fail(
            f"no job {job_id!r} in {rundir.path}: neither {where} nor its stream files know it "
            "('pilot jobs' lists them)"
        )
    wrote = _print_tail(job_id, records, args.lines)
    end: dict[str, Any] | None = job
    if args.follow and not _final(job):
        end = _follow(rundir, job_id, reader) or job
        wrote = True
    wrote = _print_named_files(job_id, job, args.lines) or wrote
    if not wrote:
        print(f"pilot logs: job {job_id} has no output kept: {_why_none(job)}", file=sys.stderr)
    _say_how_it_ended(job_id, end, following=args.follow)


def _job(rundir: RunDir, job_id: str) -> tuple[dict[str, Any] | None, bool]:
    """What 'pilot show --json' says of the job: from the running pilot, else from its history (the
    latest life that had the id), and whether it came from the history."""
    from pilot import wire
    from pilot.cli.common import request
    from pilot.history import read

    if rundir.read_info() is not None:
        results = request(rundir, wire.Kind.SHOW, {"ids": [job_id]}, timeout=60.0).get("results", [])
        first = results[0] if isinstance(results, list) and results and isinstance(results[0], dict) else {}
        if isinstance(first.get("job"), dict):
            return dict(first["job"]), False
    rows = read(rundir.history_file, job_id=job_id)
    return (dict(rows[-1]), True) if rows else (None, False)


def _final(job: dict[str, Any] | None) -> bool:
    return job is not None and job.get("state") in ("COMPLETED", "FAILED", "CANCELED")


def _print_tail(job_id: str, records: list[tuple[int, str, bytes]], lines: int) -> bool:
    """The last ``lines`` lines of the streamed stdout and stderr (each to ours); whether there were any."""
    out = b"".join(data for _, stream, data in records if stream == "out")
    err = b"".join(data for _, stream, data in records if stream == "err")
    _write(sys.stdout.buffer, job_id, "streamed stdout", out, lines)
    _write(sys.stderr.buffer, job_id, "streamed stderr", err, lines)
    return bool(out or err)


def _write(to: Any, job_id: str, what: str, data: bytes, lines: int) -> None:
    if not data:
        return
    if lines:
        kept = data.splitlines(keepends=True)
        if len(kept) > lines:
            print(
                f"pilot logs: job {job_id}: the last {lines} of {len(kept):,} lines of its {what} (-n 0: all)",
                file=sys.stderr,
                flush=True,
            )
            data = b"".join(kept[-lines:])
    to.write(data)
    to.flush()


def _follow(rundir: RunDir, job_id: str, reader: Any) -> dict[str, Any] | None:
    """Print what the job streams until the daemon says it is final; how it ended, as a show row."""
    import client as psij

    ex = psij.JobExecutor.get_instance("pilot", url=str(rundir.path), pipelined=False)
    try:
        job = psij.Job()
        ex.attach(job, job_id)
        while job.wait(timeout=0.25) is None:
            _print_records(reader.read())
        status = job.status
        if status.state is psij.JobState.FAILED and (status.message or "").startswith("cannot attach"):
            fail(str(status.message))
        time.sleep(0.5)  # the agent appends what the job's pipes still held when it exited
        _print_records(reader.read())
    finally:
        ex.close()
    return {"state": str(status.state), "exit_code": status.exit_code, "message": status.message}


def _print_records(records: list[tuple[int, str, bytes]]) -> None:
    for _, stream, data in records:
        out = sys.stdout.buffer if stream == "out" else sys.stderr.buffer
        out.write(data)
    sys.stdout.buffer.flush()
    sys.stderr.buffer.flush()


def _print_named_files(job_id: str, job: dict[str, Any] | None, lines: int) -> bool:
    """The last lines of the stdout and stderr files the job named, read where they are (a path on a
    node's own disk is not readable from here: said so)."""
    description = (job or {}).get("description") or (job or {}).get("files")  # live, or kept in the history
    if not isinstance(description, dict):
        return False
    base = str(description.get("directory") or description.get("submit_directory") or "")
    wrote = False
    seen: set[str] = set()
    for key, to in (("stdout_path", sys.stdout.buffer), ("stderr_path", sys.stderr.buffer)):
        named = description.get(key)
        if not isinstance(named, str) or not named:
            continue
        path = os.path.join(base, os.path.expanduser(named))
        if path in seen:
            continue  # stdout and stderr to one file: shown once
        seen.add(path)
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            print(f"pilot logs: job {job_id}: cannot read its {key} {path}: {exc.strerror or exc}", file=sys.stderr)
            continue
        _write(to, job_id, f"{key} {path}", data, lines)
        wrote = wrote or bool(data)
    return wrote


def _why_none(job: dict[str, Any] | None) -> str:
    description = (job or {}).get("description")
    custom = description.get("custom_attributes") if isinstance(description, dict) else None
    if isinstance(custom, dict) and custom.get("pilot.stream_output") is False:
        return "it was submitted with its output discarded"
    if job is not None and job.get("started") is None and not _final(job):
        return "it has not started"
    return "it wrote none, or it was submitted without streaming and named no file (pilot.stream_output)"


def _say_how_it_ended(job_id: str, job: dict[str, Any] | None, *, following: bool) -> None:
    """One line on stderr: the job's state, exit code, and the pilot's message (the reason)."""
    if job is None:
        line = f"job {job_id}: its state is not known here (no running pilot, and no history of it)"
    elif not _final(job):
        hint = "" if following else f" ('pilot logs {job_id} -f' follows it)"
        line = f"job {job_id} is {job.get('state', '?')}: it has not ended{hint}"
    else:
        line = f"job {job_id} {job.get('state')}"
        if job.get("exit_code") is not None:
            line += f", exit {job['exit_code']}"
        if job.get("message"):
            line += f": {job['message']}"
    print(f"pilot logs: {line}", file=sys.stderr, flush=True)

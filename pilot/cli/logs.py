"""``pilot logs``: a streamed job's output (``pilot.stream_output``), read back from the stream files the
agents append to, never through the daemon; ``-f`` follows it until the job ends."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from pilot.cli.common import add_target, fail, rundir_of


def add_parsers(sub: Any) -> None:
    lg = sub.add_parser("logs", help="a streamed job's output (pilot.stream_output), read from the stream files")
    add_target(lg)
    lg.add_argument("id")
    lg.add_argument("-f", "--follow", action="store_true", help="follow it until the job ends")
    lg.set_defaults(func=logs_cmd)


def logs_cmd(args: argparse.Namespace) -> None:
    """Print a streamed job's stdout and stderr (to ours); with -f, follow it until the daemon says the job
    is final, then print what its agent wrote last."""
    from client.output import OutputReader

    rundir = rundir_of(args)
    reader = OutputReader(args.id, rundir=rundir.path)
    _print_records(reader.read())
    if not args.follow:
        return
    import client as psij

    ex = psij.JobExecutor.get_instance("pilot", url=str(rundir.path))
    try:
        job = psij.Job()
        ex.attach(job, args.id)
        while job.wait(timeout=0.25) is None:
            _print_records(reader.read())
        if job.status.state is psij.JobState.FAILED and (job.status.message or "").startswith("cannot attach"):
            fail(str(job.status.message))
        time.sleep(0.5)  # the agent appends what the job's pipes still held when it exited
        _print_records(reader.read())
    finally:
        ex.close()


def _print_records(records: list[tuple[int, str, bytes]]) -> None:
    for _, stream, data in records:
        out = sys.stdout.buffer if stream == "out" else sys.stderr.buffer
        out.write(data)
    sys.stdout.buffer.flush()
    sys.stderr.buffer.flush()

"""``pilot submit``: a job document (SSS, or any language the front-ends recognise) from a file or stdin."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pilot.cli.common import add_target, fail, request, rundir_of, warn


def add_parsers(sub: Any) -> None:
    sb = sub.add_parser("submit", help="submit a job document (SSS Job or JobGroup XML; - for stdin); prints the ids")
    add_target(sb)
    sb.add_argument("file", help="the job document (- for stdin)")
    sb.add_argument("--wait", action="store_true", help="wait until every job has ended; exit 1 if any failed")
    sb.set_defaults(func=submit_cmd)


def submit_cmd(args: argparse.Namespace) -> None:
    from pilot import wire

    try:
        document = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    except OSError as exc:
        fail(f"cannot read {args.file}: {exc.strerror or exc}", code=2)
    rundir = rundir_of(args)
    reply = request(rundir, wire.Kind.SUBMIT, {"jobs": [{"sss": document.decode("utf-8", "replace")}]})
    result = (reply.get("results") or [{}])[0]
    if "error" in result:
        fail(f"{args.file}: {result['error']}", code=2)
    for w in result.get("warnings", []):
        warn("submit", str(w))
    ids = [str(i) for i in result.get("ids", [])]
    print(" ".join(ids), flush=True)
    if args.wait:
        wait_for(rundir.path, ids)


def wait_for(rundir: Path, ids: list[str]) -> None:
    """Follow the jobs' status events (one connection, no polling) until each has ended, a line each;
    exit 1 when any FAILED."""
    import client as psij

    failed = False
    with psij.JobExecutor.get_instance("pilot", url=str(rundir)) as ex:
        jobs = []
        for native_id in ids:
            job = psij.Job()
            ex.attach(job, native_id)
            jobs.append(job)
        for job in jobs:
            st = job.wait() or job.status  # no timeout given: it returns once the job has ended
            failed = failed or st.state is not psij.JobState.COMPLETED
            print(f"{job.native_id} {st.state}" + (f": {st.message}" if st.message else ""), flush=True)
    if failed:
        raise SystemExit(1)

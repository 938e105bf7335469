"""``pilot submit``: a job document (SSS XML or JRDL, from a file or stdin), or jobs from the command line -- one
command (``-- CMD``), an array of them (``--array 1-N -- CMD {i}``), one per line of a file
(``--each-line FILE -- CMD {}``) or a JSON list (``--from-json FILE``) -- with their resources, duration,
directory, environment and output paths. ``--wait`` follows them to their end; its exit status counts
only real failures: a job skipped because its dependency's condition never came is not one."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from pilot.cli import bulk
from pilot.cli.common import (
    add_target,
    duration_arg,
    fail,
    non_negative_int,
    positive_int,
    print_json,
    request,
    rundir_of,
    running_info,
    warn,
)

#: How the core words the end of a job whose dependency can no longer be met (pilot.scheduler.dag):
#: skipped, not failed.
SKIPPED = "not started: dependency "
#: Up to this many jobs, --wait prints a line for each; beyond, only for those that did not complete.
_EVERY = 100


def add_parsers(sub: Any) -> None:
    sb = sub.add_parser(
        "submit",
        help="submit a job document (SSS XML, JRDL) or jobs from a command: --array, --each-line, --from-json",
        description="pilot submit FILE (an SSS Job or JobGroup, or a <jrdl> document; - for stdin), or "
        "pilot submit [options] -- CMD ARGS (one job), with --array 1-N (CMD may use {i}), "
        "--each-line FILE (CMD may use {} for the line and {i} for its number) "
        "or --from-json FILE (a list of jobs; keys: " + ", ".join(bulk.FIELDS) + "). "
        "Placeholders work in the arguments, --job-name and the --stdin/--stdout/--stderr paths.",
    )
    add_target(sb)
    many = sb.add_mutually_exclusive_group()
    many.add_argument("--array", metavar="RANGES", help="one job per index: 1-100, 0-99:10, 1,3,5-7")
    many.add_argument("--each-line", metavar="FILE", help="one job per non-blank line of FILE (- for stdin)")
    many.add_argument("--from-json", metavar="FILE", help="the jobs of a JSON file (- for stdin)")
    sb.add_argument("--job-name", help="the jobs' name (default: the executable)")
    sb.add_argument("--processes", type=positive_int, help="processes per job (default 1)")
    sb.add_argument("--cores", type=positive_int, help="cores per process (default 1)")
    sb.add_argument("--gpus", type=non_negative_int, help="GPUs per process (default 0)")
    sb.add_argument("--memory", type=_size, help="memory per job: bytes, 512M, 8G")
    sb.add_argument("--duration", type=duration_arg, help="walltime per job: 90, 10m, HH:MM:SS (default 10m)")
    sb.add_argument("--directory", help="working directory (default: this one)")
    sb.add_argument("--env", action="append", type=_env, metavar="NAME=VALUE", help="set in the jobs' environment")
    sb.add_argument("--stdin", metavar="PATH")
    sb.add_argument("--stdout", metavar="PATH", help="where the job's output goes, e.g. out/{i}.txt")
    sb.add_argument("--stderr", metavar="PATH")
    sb.add_argument(
        "--no-output",
        action="store_true",
        help="discard the output no --stdout/--stderr file takes (default: kept in the pilot's stream files, "
        "'pilot logs ID' prints it)",
    )
    sb.add_argument("--launcher", choices=["single", "multiple", "mpirun", "srun"])
    sb.add_argument("--depends-on", metavar="DEP", help="e.g. 12, OnFailure:12, OnSuccess:name=prep")
    sb.add_argument("--run", help="the run these jobs belong to (default: a new one)")
    sb.add_argument("--wait", action="store_true", help="wait until every job has ended; exit 1 if any failed")
    sb.add_argument("--json", action="store_true", help="the run, ids (and with --wait the ends) as JSON")
    sb.add_argument("words", nargs="*", metavar="FILE | -- CMD", help="a job document, or after -- a command")
    sb.set_defaults(func=submit_cmd)

    rs = sub.add_parser("resubmit", help="run the failed jobs of a run again, as a new run")
    add_target(rs)
    rs.add_argument("--failed", metavar="RUN", required=True, help="the run whose FAILED jobs to run again")
    rs.add_argument("--run", help="the new run's id (default: a new one)")
    rs.add_argument("--wait", action="store_true", help="wait until every job has ended; exit 1 if any failed")
    rs.add_argument("--json", action="store_true", help="the new run and its ids (and with --wait the ends)")
    rs.set_defaults(func=resubmit_cmd)


def _size(text: str) -> int:
    from pilot import config as config_mod

    try:
        return config_mod.parse_size(int(text) if text.isdigit() else text, key="--memory", source="the command line")
    except config_mod.ConfigError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: give bytes, or 512M, 8G") from None


def _env(text: str) -> tuple[str, str]:
    name, eq, value = text.partition("=")
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=VALUE")
    return name, value


def submit_cmd(args: argparse.Namespace) -> None:
    separated = "--" in (args.argv or [])
    if args.from_json or args.array or args.each_line or separated:
        _submit_commands(args)
    else:
        _submit_document(args)


# -- documents ------------------------------------------------------------------------------------------


def _submit_document(args: argparse.Namespace) -> None:
    """A job document (SSS or JRDL), through the client: one submit id for all its jobs, so a document
    in flight when its daemon dies is sent again to the next one (or withdrawn), never made twice."""
    import client as psij

    if len(args.words) != 1:
        fail(
            "give one job document (SSS XML or JRDL; - for stdin), or a command after -- (pilot submit -- CMD ARGS), "
            "with --array, --each-line or --from-json for many",
            code=2,
        )
    if args.no_output:
        fail("--no-output is for jobs from a command; a job document says itself where its output goes", code=2)
    path = args.words[0]
    try:
        document = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}", code=2)
    rundir = rundir_of(args)
    running_info(rundir)  # no pilot: say so, and how to start one
    with psij.JobExecutor.get_instance("pilot", url=str(rundir.path), pipelined=False) as ex:
        try:
            jobs = ex.submit_document(document)
        except psij.InvalidJobException as exc:
            fail(f"{path}: {exc}", code=2)
        for w in jobs.warnings:
            warn("submit", w)
        ids = [str(job.native_id) for job in jobs]
        if args.json and not args.wait:
            print_json({"ids": ids})
        elif not args.json:
            print(" ".join(ids), flush=True)
        if args.wait:
            _wait(args, list(jobs), run=None)


# -- commands -------------------------------------------------------------------------------------------


def _template(args: argparse.Namespace) -> dict[str, Any]:
    """The job map the command line's options make (checked like a --from-json job)."""
    job: dict[str, Any] = {"command": list(args.words)}
    for key, value in (
        ("name", args.job_name),
        ("directory", args.directory),
        ("stdin", args.stdin),
        ("stdout", args.stdout),
        ("stderr", args.stderr),
        ("processes", args.processes),
        ("cores", args.cores),
        ("gpus", args.gpus),
        ("memory", args.memory),
        ("duration", args.duration),
        ("launcher", args.launcher),
        ("depends_on", args.depends_on),
    ):
        if value is not None:
            job[key] = value
    if args.env:
        job["environment"] = dict(args.env)
    return job


def _jobs(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.from_json:
        if args.words:
            fail("--from-json takes its commands from the file: give no command after --", code=2)
        given = {k: v for k, v in _template(args).items() if k != "command"}
        return [given | job for job in bulk.from_json(args.from_json)]  # the file's keys win
    if not args.words:
        fail("give the command after -- (pilot submit --array 1-10 -- CMD {i})", code=2)
    template = bulk.check(_template(args), where="the command line")
    if args.array:
        return [bulk.fill(template, i=i) for i in bulk.array_indices(args.array)]
    if args.each_line:
        return [bulk.fill(template, i=n, line=line) for n, line in enumerate(bulk.each_line(args.each_line), 1)]
    return [template]


def _submit_commands(args: argparse.Namespace) -> None:
    import client as psij

    specs = _jobs(args)
    run = args.run or time.strftime("run-%Y%m%d-%H%M%S-") + str(os.getpid())
    rundir = rundir_of(args)
    if rundir.read_info() is None:
        fail(f"no pilot is running in {rundir.path} ('pilot ls' lists yours; 'pilot up' starts one)")
    with psij.JobExecutor.get_instance("pilot", url=str(rundir.path), pipelined=False) as ex:
        jobs = [bulk.psij_job(s, run=run, keep_output=not args.no_output) for s in specs]
        try:
            ex.submit_all(jobs)
        except psij.BatchSubmitException as exc:
            submitted = [j.native_id for j in jobs if j.native_id is not None]
            if submitted:
                ex._backend.request("cancel", {"ids": submitted})  # all of them or none
            invalid = all(isinstance(e, psij.InvalidJobException) for e in exc.exceptions)
            fail(f"{exc.message}; none was left to run", code=2 if invalid else 1)
        ids = [str(j.native_id) for j in jobs]
        if args.json and not args.wait:
            print_json({"run": run, "ids": ids})
        elif not args.json:
            print(f"{run}: {len(ids)} job(s): {_ids(ids)}", flush=True)
        if args.wait:
            _wait(args, jobs, run=run)


def _ids(ids: list[str]) -> str:
    """'12 13 14' as '12-14' when they follow each other."""
    if len(ids) > 2 and all(i.isdigit() for i in ids) and int(ids[-1]) - int(ids[0]) == len(ids) - 1:
        return f"{ids[0]}-{ids[-1]}"
    return " ".join(ids)


def _wait(args: argparse.Namespace, jobs: list[Any], *, run: str | None) -> None:
    """Until every job has ended: a line for each (beyond :data:`_EVERY` jobs, for each that did not
    complete), then the counts. Exit 1 when
    any FAILED (not counting those skipped for a dependency) or was CANCELED."""
    import client as psij

    ends = []
    counts = {"completed": 0, "failed": 0, "skipped": 0, "canceled": 0}
    for job in jobs:
        try:
            st = job.wait() or job.status  # no timeout given: it returns once the job has ended
        except KeyboardInterrupt:
            again = f"'pilot cancel --run {run}'" if run else "'pilot cancel ID...'"
            fail(f"interrupted: the jobs go on in the pilot ({again} stops them)", code=130)
        message = st.message or ""
        if st.state is psij.JobState.COMPLETED:
            kind = "completed"
        elif st.state is psij.JobState.FAILED and message.startswith(SKIPPED):
            kind = "skipped"
        elif st.state is psij.JobState.FAILED:
            kind = "failed"
        else:
            kind = "canceled"
        counts[kind] += 1
        ends.append({"id": job.native_id, "state": str(st.state), "exit_code": st.exit_code, "message": st.message})
        if (kind != "completed" or len(jobs) <= _EVERY) and not args.json:
            what = f"{st.state} (skipped, not a failure)" if kind == "skipped" else str(st.state)
            code = f", exit {st.exit_code}" if st.exit_code is not None and kind != "completed" else ""
            print(f"{job.native_id} {what}{code}" + (f": {message}" if message else ""), flush=True)
    if args.json:
        print_json({"run": run, "ids": [j.native_id for j in jobs], "counts": counts, "jobs": ends})
    else:
        print(", ".join(f"{v} {k}" for k, v in counts.items() if v or k == "completed"))
    if counts["failed"] or counts["canceled"]:
        if not args.json:
            print("pilot submit: 'pilot logs ID' prints a job's output and how it ended", file=sys.stderr, flush=True)
        raise SystemExit(1)


# -- resubmit -------------------------------------------------------------------------------------------


def resubmit_cmd(args: argparse.Namespace) -> None:
    """The FAILED jobs of a run, sent again with their own descriptions under a new run id. Jobs skipped
    for a dependency are left (they never ran; their dependency decides), and so are jobs that came as a
    document (submit the document again)."""
    from pilot import wire
    from pilot.model.job_description import RUN_TAG

    rundir = rundir_of(args)
    rows = request(rundir, wire.Kind.JOBS, {"states": ["FAILED"], "run": args.failed}, timeout=60.0)["jobs"]
    failed = [r for r in rows if not (r.get("message") or "").startswith(SKIPPED)]
    if not failed:
        known = request(rundir, wire.Kind.JOBS, {"run": args.failed, "limit": 1}, timeout=60.0)["jobs"]
        if not known:
            fail(f"no job of run {args.failed!r} in this pilot ('pilot jobs' shows each job's run)")
        left = f" ({len(rows)} skipped for a dependency)" if rows else ""
        print(f"no failed job in run {args.failed}{left}: nothing to resubmit")
        return
    shown = request(rundir, wire.Kind.SHOW, {"ids": [r["id"] for r in failed]}, timeout=60.0).get("results", [])
    run = args.run or time.strftime("run-%Y%m%d-%H%M%S-") + str(os.getpid())
    descriptions, documents = [], []
    for r in shown:
        d = (r.get("job") or {}).get("description")
        if not isinstance(d, dict):
            documents.append(str(r.get("id")))
            continue
        descriptions.append(d | {"custom_attributes": dict(d.get("custom_attributes") or {}) | {RUN_TAG: run}})
    if documents:
        warn("resubmit", f"job(s) {' '.join(documents)} came as a document: submit the document again")
    if not descriptions:
        return
    ids = _submit_descriptions(rundir, descriptions)
    if args.json and not args.wait:
        print_json({"run": run, "ids": ids, "from": args.failed})
    elif not args.json:
        print(f"{run}: {len(ids)} failed job(s) of {args.failed} submitted again: {_ids(ids)}", flush=True)
    if args.wait and ids:
        import client as psij

        with psij.JobExecutor.get_instance("pilot", url=str(rundir.path), pipelined=False) as ex:
            jobs = []
            for native_id in ids:
                job = psij.Job()
                ex.attach(job, native_id)
                jobs.append(job)
            _wait(args, jobs, run=run)
    if len(ids) < len(descriptions):
        raise SystemExit(1)


def _submit_descriptions(rundir: Any, descriptions: list[dict[str, Any]]) -> list[str]:
    """Submit job descriptions (wire form) through the client's batch path: each under a submit id, so a
    batch in flight when its daemon dies is sent again to the next one (or withdrawn), never made twice.
    Returns the ids made; says why for each one refused."""
    import client as psij

    made: dict[int, str] = {}

    def on_id(k: int, native_id: str) -> Any:
        made[k] = native_id
        return lambda _status: None  # the statuses are not followed here (--wait attaches)

    def on_outcome(k: int, outcome: Any) -> None:
        if isinstance(outcome, Exception):
            made.pop(k, None)
            warn("resubmit", f"not submitted again: {outcome}")

    with psij.JobExecutor.get_instance("pilot", url=str(rundir.path), pipelined=False) as ex:
        ex._backend.submit_many(descriptions, on_id, on_outcome)
    return [made[k] for k in sorted(made)]

"""Jobs from the command line: ``jobs`` (list, filtered), ``cancel``, ``show``, ``explain``, ``release``
and ``nodes``. Each is one or two requests to the pilot's read-only views (:mod:`pilot.views`)."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from pilot.cli.common import add_target, clock, fail, local, positive_int, print_json, request, rundir_of, table
from pilot.model.job_state import FINAL_NAMES, JobState

_STATES = [s.value for s in JobState]
_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])", re.ASCII)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def add_parsers(sub: Any) -> None:
    js = sub.add_parser("jobs", help="list jobs, filtered by state, name, run or submit time")
    add_target(js)
    add_filters(js)
    js.add_argument("--limit", type=positive_int, default=1000, help="show at most the last N (default 1000)")
    js.add_argument("--json", action="store_true", help="the rows as JSON")
    js.set_defaults(func=jobs_cmd)

    cn = sub.add_parser("cancel", help="cancel jobs: by id, or every unfinished one of a state or a run")
    add_target(cn)
    cn.add_argument("ids", nargs="*", metavar="ID")
    cn.add_argument("--state", type=states_arg, action="extend", help="every job in this state (QUEUED, ACTIVE)")
    cn.add_argument("--run", help="every unfinished job of this run (what 'pilot run' and 'pilot submit' print)")
    cn.add_argument("--json", action="store_true", help="what was done, as JSON")
    cn.set_defaults(func=cancel_cmd)

    sh = sub.add_parser("show", help="a job: node, cores, times, exit, Delivered (--xml: SSS Job XML)")
    add_target(sh)
    sh.add_argument("ids", nargs="+", metavar="ID")
    form = sh.add_mutually_exclusive_group()
    form.add_argument("--xml", action="store_true", help="SSS Job XML: State, Delivered and its placed Tasks")
    form.add_argument("--json", action="store_true", help="the same as JSON")
    sh.set_defaults(func=show_cmd)

    hi = sub.add_parser("history", help="every job of the pilot, also after 'pilot down' (its accounting)")
    add_target(hi)
    add_filters(hi)
    hi.add_argument("--limit", type=positive_int, default=1000, help="show at most the last N (default 1000)")
    hi.add_argument("--json", action="store_true", help="the rows as JSON")
    hi.set_defaults(func=history_cmd)

    ex = sub.add_parser("explain", help="why a job is still queued (or how it ended)")
    add_target(ex)
    ex.add_argument("ids", nargs="+", metavar="ID")
    ex.add_argument("--json", action="store_true")
    ex.set_defaults(func=explain_cmd)

    rl = sub.add_parser("release", help="let jobs submitted with an SSS <Hold> run")
    add_target(rl)
    rl.add_argument("ids", nargs="+", metavar="ID")
    rl.add_argument("--json", action="store_true")
    rl.set_defaults(func=release_cmd)

    nd = sub.add_parser("nodes", help="the nodes as SSS Node XML: Configured, Available, Utilized")
    add_target(nd)
    form = nd.add_mutually_exclusive_group()
    form.add_argument("--xml", action="store_true", help="SSS Node XML (the default)")
    form.add_argument("--json", action="store_true", help="the nodes of 'pilot status --json'")
    nd.set_defaults(func=nodes_cmd)


def add_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state",
        type=states_arg,
        action="extend",
        help="only jobs in these states (comma-separated, or the option again): " + ", ".join(_STATES),
    )
    p.add_argument("--job-name", metavar="GLOB", help="only jobs whose name matches (shell wildcards)")
    p.add_argument("--run", help="only the jobs of this run (what 'pilot run' and 'pilot submit' print)")
    p.add_argument(
        "--since",
        type=since_arg,
        metavar="WHEN",
        help="only jobs submitted since: a span back from now (90s, 10m, 2h, 1d), a time today (09:30), "
        "or a date and time (2026-11-26T09:30)",
    )


def states_arg(text: str) -> list[str]:
    out = []
    for part in text.split(","):
        state = part.strip().upper()
        if state not in _STATES:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not a job state; use one of {', '.join(_STATES)}")
        out.append(state)
    return out


def since_arg(text: str) -> float:
    t = text.strip()
    m = _SPAN.fullmatch(t)
    if m:
        return time.time() - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", t):
            today = datetime.now().strftime("%Y-%m-%d")
            return datetime.fromisoformat(f"{today}T{t}").timestamp()
        return datetime.fromisoformat(t).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: give a span back from now (90s, 10m, 2h, 1d), a time today (09:30) "
            "or a date and time (2026-11-26T09:30)"
        ) from None


def query(args: argparse.Namespace, *, limit: int | None) -> dict[str, Any]:
    from pilot import wire

    body = {
        "states": sorted(set(getattr(args, "state", None) or [])),
        "name": getattr(args, "job_name", None),
        "run": getattr(args, "run", None),
        "since": getattr(args, "since", None),
        "limit": limit,
    }
    return request(rundir_of(args), wire.Kind.JOBS, body, timeout=60.0)


# -- jobs ---------------------------------------------------------------------------------------------


def jobs_cmd(args: argparse.Namespace) -> None:
    reply = query(args, limit=args.limit)
    left_out = reply.get("left_out")
    print_rows(args, reply.get("jobs") or [], left_out if isinstance(left_out, int) else None)


def print_rows(args: argparse.Namespace, rows: list[dict[str, Any]], left_out: int | None) -> None:
    """Job rows as a table (or --json: always the list), as 'pilot jobs' and 'pilot history' print them.
    ``left_out``: how many earlier matching jobs were not shown (None: some, not counted), said on stderr."""
    if left_out != 0:
        count = f"{left_out} earlier job(s)" if left_out is not None else "earlier jobs"
        print(
            f"pilot {args.command}: {count} left out: --limit, or narrow with --state, --run, --since", file=sys.stderr
        )
    if args.json:
        print_json(rows)
        return
    if not rows:
        print("no jobs" + (" match" if _filtered(args) else ""))
        return
    out = [
        [
            r["id"],
            _clip(r.get("name") or "-", 20),
            r["state"],
            clock(r.get("submitted")),
            clock(r.get("started")),
            clock(r.get("ended")),
            _clip(",".join(r.get("nodes") or []) or "-", 24),
            str(r.get("cores") or "-"),
            "-" if r.get("exit_code") is None else str(r["exit_code"]),
            r.get("run") or "-",
        ]
        for r in rows
    ]
    header = ["id", "name", "state", "submitted", "started", "ended", "nodes", "cores", "exit", "run"]
    for line in table(header, out, right={0, 7, 8}):
        print(line)


def _filtered(args: argparse.Namespace) -> bool:
    return any(getattr(args, k, None) for k in ("state", "job_name", "run", "since"))


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# -- cancel -------------------------------------------------------------------------------------------


def cancel_cmd(args: argparse.Namespace) -> None:
    from pilot import job_ids, wire

    if not (args.ids or args.state or args.run):
        fail("name the jobs: IDs, --state STATE or --run RUN ('pilot jobs' lists them)", code=2)
    ended = set(FINAL_NAMES)
    if args.state and set(args.state) <= ended:
        fail(f"--state {','.join(args.state)}: those jobs have ended; nothing to cancel", code=2)
    rundir = rundir_of(args)
    report: list[dict[str, Any]] = []
    bad = False
    if args.state or args.run:  # picked by the pilot, which holds every unfinished job
        body = {"states": sorted(set(args.state or []) - ended), "run": args.run}
        canceled = request(rundir, wire.Kind.CANCEL_WHERE, body, timeout=60.0).get("canceled")
        try:
            if not isinstance(canceled, dict):
                raise ValueError(f"'canceled' must be a map of states, not {type(canceled).__name__}")
            was = sorted((int(i), str(state)) for state, runs in canceled.items() for i in job_ids.from_wire(runs))
        except ValueError as exc:
            fail(f"malformed answer from the pilot: {exc}")
        report += [{"id": str(i), "state": state, "canceled": True} for i, state in was]
    done = {r["id"] for r in report}
    named = [i for i in dict.fromkeys(args.ids) if i not in done]
    unfinished: list[tuple[str, str]] = []  # (id, state) of the jobs named by id that have not ended
    for job_id, r in zip(named, _show(rundir, named) if named else [], strict=False):
        if "error" in r:
            report.append({"id": job_id, "error": str(r["error"])})
            bad = True
        elif r["job"]["state"] in ended:
            report.append({"id": job_id, "state": r["job"]["state"], "canceled": False})
        else:
            unfinished.append((job_id, r["job"]["state"]))
    if unfinished:
        ids = [job_id for job_id, _ in unfinished]
        results = request(rundir, wire.Kind.CANCEL, {"ids": ids}, timeout=60.0).get("results", [])
        for (job_id, state), r in zip(unfinished, results, strict=False):
            if "error" in r:
                report.append({"id": job_id, "error": str(r["error"])})
                bad = True
            else:
                report.append({"id": job_id, "state": state, "canceled": True})
    if args.json:
        print_json(report)
    else:
        for r in report:
            if "error" in r:
                print(f"pilot cancel: {r['error']}", file=sys.stderr)
            elif r["canceled"]:
                print(f"job {r['id']}: canceled (was {r['state']})")
            else:
                print(f"job {r['id']}: had already ended {r['state']}; nothing to cancel")
        if not report:
            print("no unfinished job matches; nothing to cancel")
    if bad:
        raise SystemExit(1)


# -- show / explain / release / nodes -----------------------------------------------------------------


def _show(rundir: Any, ids: list[str]) -> list[dict[str, Any]]:
    from pilot import wire

    results: list[dict[str, Any]] = request(rundir, wire.Kind.SHOW, {"ids": ids}, timeout=60.0).get("results", [])
    return results


def _per_job(args: argparse.Namespace, kind: str, *, history: Path | None = None) -> tuple[list[dict[str, Any]], bool]:
    """One request about every id; the answers, and whether any was an error (said on stderr). With a
    ``history`` file, a job the pilot does not know is looked for there (an earlier life's)."""
    results = request(rundir_of(args), kind, {"ids": list(args.ids)}).get("results", [])
    good, bad = [], False
    for job_id, r in zip(args.ids, results, strict=False):
        kept = _kept(history, job_id) if "error" in r and history is not None else None
        if kept is not None:
            good.append(kept)
            continue
        if "error" in r:
            print(f"pilot {args.command}: {r['error']}", file=sys.stderr)
            bad = True
        else:
            good.append(r)
    return good, bad


def _kept(path: Path, job_id: str) -> dict[str, Any] | None:
    """The history's latest job of this id, as a 'show' result."""
    from pilot.history import read

    rows = read(path, job_id=job_id)
    return {"id": job_id, "job": rows[-1] | {"from_history": True}} if rows else None


def _from_history(args: argparse.Namespace, path: Path) -> tuple[list[dict[str, Any]], bool]:
    """'pilot show' of jobs the pilot's history keeps (its latest life's job of each id)."""
    if not path.exists():
        fail(
            f"no pilot is running in {path.parent}, and none there has kept a job history yet ('pilot ls' lists yours)"
        )
    if getattr(args, "xml", False):
        fail("no pilot is running: the SSS XML of a job is kept only while its pilot runs; drop --xml", code=2)
    good, bad = [], False
    for job_id in args.ids:
        kept = _kept(path, job_id)
        if kept is not None:
            good.append(kept)
        else:
            print(f"pilot {args.command}: no job {job_id!r} in the history of {path.parent}", file=sys.stderr)
            bad = True
    return good, bad


def show_cmd(args: argparse.Namespace) -> None:
    from pilot import wire

    rundir = rundir_of(args)
    if rundir.read_info() is None:
        results, bad = _from_history(args, rundir.history_file)
    else:
        results, bad = _per_job(args, wire.Kind.SHOW, history=rundir.history_file)
    if args.json:
        print_json([r.get("job", {"id": r["id"]}) for r in results])
    for i, r in enumerate(results):
        if args.xml:
            print(r["xml"])
        elif not args.json:
            if i:
                print()
            print("\n".join(human(r.get("job") or {"id": r["id"]})))
    if bad:
        raise SystemExit(1)


def human(job: dict[str, Any]) -> list[str]:
    """A job as a person reads it: what it ran, where, when (local time), how it ended, Delivered."""
    name = f" ({job['name']})" if job.get("name") else ""
    state = str(job.get("state", "?"))
    if job.get("exit_code") is not None:
        state += f", exit {job['exit_code']}"
    lines = [f"job {job['id']}{name}: {state}"]
    if job.get("message"):
        lines.append(f"  message:   {job['message']}")
    if job.get("command"):
        lines.append(f"  command:   {shlex.join(str(c) for c in job['command'])}")  # as a shell takes it back
    if job.get("run"):
        lines.append(f"  run:       {job['run']}")
    nodes = job.get("nodes") or []
    if nodes:
        gpus = f", {job['gpus']} GPU(s)" if job.get("gpus") else ""
        lines.append(f"  node(s):   {', '.join(nodes)}; {job.get('cores', 0)} core(s){gpus}")
    submitted, started, ended = job.get("submitted"), job.get("started"), job.get("ended")
    lines.append(f"  submitted: {local(submitted)}")
    if started is not None:
        waited = f" (waited {started - submitted:.2f} s)" if submitted is not None else ""
        lines.append(f"  started:   {local(started)}{waited}")
    if ended is not None:
        ran = f" (ran {ended - started:.2f} s)" if started is not None else ""
        lines.append(f"  ended:     {local(ended)}{ran}")
    d = job.get("delivered") or {}
    if d:
        lines.append(
            f"  Delivered: wall {float(d.get('wall_duration') or 0):.2f} s, "
            f"user CPU {float(d.get('user_cpu_time') or 0):.2f} s, "
            f"system CPU {float(d.get('system_cpu_time') or 0):.2f} s, "
            f"max RSS {int(d.get('max_rss') or 0) / 2**20:.1f} MiB, "
            f"{int(d.get('processors') or 0)} processor(s), {int(d.get('processes') or 0)} process(es)"
        )
    return lines


def history_cmd(args: argparse.Namespace) -> None:
    """Every job of the pilot's earlier lives (kept at each clean stop) and, while it runs, of this one."""
    from pilot.history import read

    rundir = rundir_of(args)
    states = sorted(set(args.state or []))
    rows = {
        (r["id"], r["submitted"]): r
        for r in read(rundir.history_file, states=states, name=args.job_name, run=args.run, since=args.since)
    }
    if rundir.read_info() is not None:
        for r in query(args, limit=args.limit).get("jobs", []):
            rows[(r["id"], r["submitted"])] = r
    elif not rows and not rundir.history_file.exists():
        fail(f"no job history in {rundir.path} yet: it is kept when a pilot there stops ('pilot down')")
    ordered = sorted(rows.values(), key=lambda r: (float(r["submitted"]), int(r["id"]) if r["id"].isdigit() else 0))
    left_out = max(0, len(ordered) - args.limit)
    print_rows(args, ordered[left_out:], left_out)


def explain_cmd(args: argparse.Namespace) -> None:
    from pilot import wire

    results, bad = _per_job(args, wire.Kind.EXPLAIN)
    if args.json:
        print_json(results)
    else:
        for r in results:
            print(f"job {r['id']} is {r['state']}:")
            for reason in r.get("reasons", []):
                print(f"  - {reason}")
    if bad:
        raise SystemExit(1)


def release_cmd(args: argparse.Namespace) -> None:
    from pilot import wire

    results, bad = _per_job(args, wire.Kind.RELEASE)
    if args.json:
        print_json(results)
        results = []
    for r in results:
        print(f"job {r['id']}: " + ("released" if r.get("released") else "was not held"))
    if bad:
        raise SystemExit(1)


def nodes_cmd(args: argparse.Namespace) -> None:
    from pilot import wire

    if args.json:
        print_json(request(rundir_of(args), wire.Kind.STATUS)["nodes"])
        return
    print(request(rundir_of(args), wire.Kind.NODES)["xml"])

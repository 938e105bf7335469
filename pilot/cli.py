"""``pilot``: up, status, down, run. The only module that prints."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pilot import config as config_mod
from pilot.rundir import RunDir
from pilot.security import SecurityError

if TYPE_CHECKING:
    from pilot.earlier_life import Start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="pilot", description="pilot-job execution manager")
    sub = parser.add_subparsers(dest="command", required=True)

    def where(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--name", default=os.environ.get("PILOT_NAME", "default"), help="pilot name (run dir under $PILOT_HOME)"
        )
        p.add_argument("--rundir", type=Path, help="explicit run directory")

    up = sub.add_parser("up", help="start the daemon and acquire its allocation")
    where(up)
    up.add_argument("--config", type=Path, help="TOML config (default: configs/local.toml)")
    up.add_argument("--foreground", action="store_true", help="stay attached; log to stderr")
    up.add_argument("--embedded", action="store_true", help=argparse.SUPPRESS)
    up.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    start = up.add_mutually_exclusive_group()
    start.add_argument(
        "--fresh",
        action="store_true",
        help="start anew over a run directory whose journal is missing or damaged: stop the agents and tasks "
        "the earlier pilot left running, keep its journal files in earlier/",
    )
    start.add_argument(
        "--restore",
        action="store_true",
        help="rebuild from the journal's last snapshot and what the agents still hold, when the journal is "
        "missing or damaged",
    )

    st = sub.add_parser("status", help="the pilot, its allocation, nodes and jobs")
    where(st)
    st.add_argument("--json", action="store_true")

    down = sub.add_parser("down", help="stop the daemon: running jobs end CANCELED, agents exit")
    where(down)
    down.add_argument(
        "--drain",
        action="store_true",
        help="refuse new jobs, let every accepted one (queued and running) finish, then stop",
    )
    down.add_argument(
        "--timeout", type=float, help="with --drain: give up waiting after this many seconds (the drain goes on)"
    )

    cred = sub.add_parser("credentials", help="write a remote client's access file (endpoint and keys, 0600)")
    where(cred)
    cred.add_argument("--client", type=Path, required=True, metavar="FILE", help="file to write (0600)")

    sb = sub.add_parser(
        "submit", help="submit an SSS Job or JobGroup, or a JRDL document (XML file, - for stdin); prints the job ids"
    )
    where(sb)
    sb.add_argument("file", help="SSS job XML (JobGroup or Job) or a <jrdl> document")
    sb.add_argument("--wait", action="store_true", help="wait until every job has ended; exit 1 if any failed")
    sh = sub.add_parser("show", help="a job as SSS Job XML: State, Delivered, and its placed Tasks")
    where(sh)
    sh.add_argument("ids", nargs="+")
    sh.add_argument("--xml", action="store_true", help="SSS XML (the default; the flag is accepted for clarity)")
    ex = sub.add_parser("explain", help="why a job is still queued (or how it ended)")
    where(ex)
    ex.add_argument("ids", nargs="+")
    nd = sub.add_parser("nodes", help="the nodes as SSS Node XML: Configured, Available, Utilized")
    where(nd)
    nd.add_argument("--xml", action="store_true", help="SSS Node XML (the default)")
    rl = sub.add_parser("release", help="let jobs submitted with an SSS <Hold> run")
    where(rl)
    rl.add_argument("ids", nargs="+")

    lg = sub.add_parser("logs", help="a streamed job's output (pilot.stream_output), read from the stream files")
    where(lg)
    lg.add_argument("id")
    lg.add_argument("-f", "--follow", action="store_true", help="follow it until the job ends")

    run = sub.add_parser("run", help="the main job: N short tasks through the PSI/J client")
    run.add_argument("-n", "--tasks", type=int, default=1000)
    run.add_argument("--url", help="pilot address or run dir (default: running pilot, else embedded)")
    run.add_argument("--json", action="store_true", help="print the summary as JSON")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="command per task (default: /bin/true)")

    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            _up(args)
        elif args.command == "status":
            _status(args)
        elif args.command == "down":
            _down(args)
        elif args.command == "run":
            _run(args)
        elif args.command == "submit":
            _submit(args)
        elif args.command in ("show", "explain", "release"):
            _per_job(args)
        elif args.command == "nodes":
            _nodes(args)
        elif args.command == "credentials":
            _credentials(args)
        elif args.command == "logs":
            _logs(args)
    except config_mod.ConfigError as exc:
        print(f"pilot: config error: {exc}", file=sys.stderr)
        sys.exit(2)
    except SecurityError as exc:
        print(f"pilot: {exc}", file=sys.stderr)
        sys.exit(1)


def _rundir(args: argparse.Namespace) -> RunDir:
    return RunDir(args.rundir.resolve()) if args.rundir else RunDir.named(args.name)


# -- up -----------------------------------------------------------------------------------------------


def _up(args: argparse.Namespace) -> None:
    cfg = config_mod.load(args.config.resolve() if args.config else None)
    rundir = _rundir(args) if (args.rundir or args.name != "default") else RunDir.named(cfg.pilot.name)
    start: Start = "fresh" if args.fresh else "restore" if args.restore else "resume"
    if args.foreground:
        _serve(cfg, rundir, embedded=args.embedded, parent_pid=args.parent_pid, start=start)
        return
    info = rundir.read_info()
    if info is not None:
        print(f"pilot: already running in {rundir.path} (pid {info['pid']})", file=sys.stderr)
        sys.exit(1)
    from pilot import lrm

    # Validate before forking, so a bad config fails here with exit code 2, not in the daemon's log.
    for site in cfg.sites:
        lrm.create(site.lrm, options=site.options, source=cfg.source, table=site.table).validate(nodes=site.nodes)
    rundir.create()
    cmd = [sys.executable, "-m", "pilot", "up", "--foreground", "--rundir", str(rundir.path)]
    if args.config:
        cmd += ["--config", str(args.config.resolve())]
    if start != "resume":
        cmd.append(f"--{start}")
    with open(rundir.log_file, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = rundir.read_info()
        if info is not None and info.get("pid") == proc.pid:
            print(f"pilot up: pid {proc.pid}, run directory {rundir.path}")
            print(f"  clients connect to {info['client_url']}; logs in {rundir.log_file}")
            return
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    print(f"pilot: the daemon did not start; last lines of {rundir.log_file}:", file=sys.stderr)
    print(_tail(rundir.log_file), file=sys.stderr)
    sys.exit(1)


def _serve(
    cfg: config_mod.Config, rundir: RunDir, *, embedded: bool, parent_pid: int | None, start: Start = "resume"
) -> None:
    import anyio

    from pilot.collector import collect_rarely
    from pilot.daemon import Daemon, DaemonError
    from pilot.logs import configure

    configure(level=cfg.pilot.log_level)
    collect_rarely()
    daemon = Daemon(config=cfg, rundir=rundir, embedded=embedded, start=start)

    async def serve() -> None:
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:

            async def signals() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
                    async for _ in sigs:
                        daemon.request_stop()

            async def watch_parent() -> None:
                while True:
                    await anyio.sleep(0.5)
                    if parent_pid is not None and os.getppid() != parent_pid:
                        daemon.request_stop()
                        return

            tg.start_soon(signals)
            tg.start_soon(watch_parent)
            try:
                await daemon.serve()
            except (DaemonError, SecurityError) as exc:
                failure = exc  # raised outside the task group: one clear line, not an exception group
            tg.cancel_scope.cancel()
        if failure is not None:
            raise failure

    try:
        anyio.run(serve)
    except (DaemonError, SecurityError) as exc:
        print(f"pilot: {exc}", file=sys.stderr)
        sys.exit(1)


# -- status / down ----------------------------------------------------------------------------------


def _request(rundir: RunDir, kind: str, body: dict[str, Any] | None = None, *, timeout: float = 10.0) -> dict[str, Any]:
    from client._connection import Connection
    from client.exceptions import SubmitException

    info = rundir.read_info()
    if info is None:
        print(f"pilot: no pilot is running in {rundir.path}", file=sys.stderr)
        sys.exit(1)
    conn = Connection(str(info["client_url"]))
    try:
        return conn.request(kind, body or {}, timeout=timeout)
    except SubmitException as exc:
        print(f"pilot: {exc}", file=sys.stderr)
        sys.exit(1)
    finally:
        conn.close()


def _status(args: argparse.Namespace) -> None:
    from pilot import wire

    st = _request(_rundir(args), wire.Kind.STATUS)
    st.pop("rid", None)
    if args.json:
        print(json.dumps(st, indent=2))
        return
    p = st["pilot"]
    flags = "".join(f"  [{w}]" for w in ("resumed", "draining") if p.get(w))
    if p.get("restored"):
        flags += f"  [restored from the journal snapshot of {_utc(p['restored'])}]"
    print(f"pilot {p['name']}  pid {p['pid']}  up {_dur(p['uptime'])}  run dir {p['rundir']}{flags}")
    journal = p.get("journal") or {}
    if journal.get("error"):
        held = f"; {journal['held']} change(s) held in memory until it can be written" if journal.get("held") else ""
        since = time.time() - float(journal.get("since") or time.time())
        print(f"journal: new jobs refused for {_dur(since)}: {journal['error']}{held}")
    allocations = st.get("allocations") or []
    if not allocations:
        print("allocation: none yet")
    for a in allocations:
        print(_allocation_line(a, several=len(allocations) > 1))
    auto = st.get("autoscale")
    if auto:
        limits = f"max {auto['max_pilots']} allocation(s)"
        if auto.get("max_nodes"):
            limits += f", {auto['max_nodes']} node(s)"
        state = "requesting one" if auto["growing"] else "on"
        if auto.get("stopped"):
            state = f"stopped: {auto['stopped']}"
        print(f"autoscale {state} ({limits})")
    print(f"{'node':<14}{'agent':<10}{'cores':>11}{'gpus':>8}{'memory':>20}  processes")
    for n in st["nodes"]:
        print(
            f"{n['name']:<14}{n['agent']:<10}{n['free_cores']:>5}/{n['cores']:<5}{n['free_gpus']:>3}/{n['gpus']:<4}"
            f"{_gib(n['free_memory']):>9}/{_gib(n['memory']):<10}  {n['processes']}"
        )
    jobs = st.get("jobs") or {}
    print("jobs: " + (", ".join(f"{k} {v}" for k, v in sorted(jobs.items())) or "none"))


def _allocation_line(a: dict[str, Any], *, several: bool) -> str:
    where = f" {a['name']} (site {a['site']})" if several and "name" in a else ""
    line = f"allocation{where} {a.get('lrm')} {a.get('native_id')}: {a.get('state')}, {a.get('nodes')} node(s)"
    if a.get("remaining") is not None:
        line += f", {_dur(a['remaining'])} of walltime left"
    native = " ".join(str(a[k]) for k in ("native_state", "reason") if a.get(k))
    if native and a.get("state") in ("queued", "starting"):
        line += f" [{a.get('lrm')}: {native}]"  # the batch system's own words: PENDING (Priority), ...
    if a.get("message"):
        line += f" ({a['message']})"
    return line


def _down(args: argparse.Namespace) -> None:
    from pilot import wire

    rundir = _rundir(args)
    reply = _request(rundir, wire.Kind.SHUTDOWN, {"drain": bool(args.drain)})
    pid = int(reply.get("pid", 0))
    if args.drain:
        left = reply.get("unfinished", 0)
        print(f"pilot down --drain: {left} accepted job(s) to finish; new submissions are refused", flush=True)
        wait = args.timeout
    else:
        wait = 30.0
    deadline = None if wait is None else time.monotonic() + wait
    from pilot.rundir import pid_alive

    while pid and pid_alive(pid) and (deadline is None or time.monotonic() < deadline):
        time.sleep(0.05)
    if pid and pid_alive(pid):
        what = "is still draining" if args.drain else "did not stop"
        print(f"pilot: daemon {pid} {what} after {wait:g} s ('pilot status' shows what is left)", file=sys.stderr)
        sys.exit(1)
    print(f"pilot down: {rundir.path} stopped")


# -- credentials ------------------------------------------------------------------------------------


def _credentials(args: argparse.Namespace) -> None:
    """A remote client needs the clients' CURVE endpoint, the daemon's key to pin and a client key pair:
    one private file it can be given (``scp -p``), named by ``PILOT_CREDENTIALS`` or the executor's url."""
    from pilot.security import ClientAccess, read_client_credentials, write_client_access

    rundir = _rundir(args)
    rundir.check()
    info = rundir.read_info()
    if info is None:
        print(f"pilot: no pilot is running in {rundir.path}", file=sys.stderr)
        sys.exit(1)
    endpoint = info.get("client_tcp_url")
    if not isinstance(endpoint, str):
        print(
            f'pilot: the pilot in {rundir.path} takes no remote clients; set client_transport = "tcp" under '
            "[pilot] in its config (and client_bind to the interface clients reach), then restart it",
            file=sys.stderr,
        )
        sys.exit(1)
    access = ClientAccess(endpoint, read_client_credentials(rundir.keys_dir))
    path = args.client.expanduser()
    write_client_access(path, access)
    print(f"pilot credentials: wrote {path} (mode 0600) for {endpoint}")
    print("  copy it privately (scp -p) and set PILOT_CREDENTIALS to its path, or pass the path as the url")


# -- SSS submit, show, explain, nodes, release -----------------------------------------------------------


def _submit(args: argparse.Namespace) -> None:
    from pilot import wire

    try:
        document = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    except OSError as exc:
        print(f"pilot submit: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        sys.exit(2)
    rundir = _rundir(args)
    text = document.decode("utf-8", "replace")
    reply = _request(rundir, wire.Kind.SUBMIT, {"jobs": [_document_entry(text)]})
    result = (reply.get("results") or [{}])[0]
    if "error" in result:
        print(f"pilot submit: {args.file}: {result['error']}", file=sys.stderr)
        sys.exit(2)
    for w in result.get("warnings", []):
        print(f"pilot submit: warning: {w}", file=sys.stderr)
    ids = [str(i) for i in result.get("ids", [])]
    print(" ".join(ids), flush=True)
    if not args.wait:
        return
    import client as psij

    # Follow the jobs' status events (one connection, no polling) until each has ended.
    failed = False
    with psij.JobExecutor.get_instance("pilot", url=str(rundir.path)) as ex:
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
        sys.exit(1)


def _document_entry(text: str) -> dict[str, Any]:
    """What SUBMIT carries for a document: a ``<jrdl>`` one with the submitter's HOME, LOGNAME and
    CUR_DIRL (its Table 1 names), anything else as SSS (whose reader names what is wrong with it)."""
    from client.job_executor import jrdl_submitter
    from pilot.formats.jrdl import is_jrdl

    if is_jrdl(text):
        return {"jrdl": text, "submitter": jrdl_submitter()}
    return {"sss": text}


def _per_job(args: argparse.Namespace) -> None:
    from pilot import wire

    kind = {"show": wire.Kind.SHOW, "explain": wire.Kind.EXPLAIN, "release": wire.Kind.RELEASE}[args.command]
    bad = False
    for r in _request(_rundir(args), kind, {"ids": list(args.ids)}).get("results", []):
        if "error" in r:
            print(f"pilot {args.command}: {r['error']}", file=sys.stderr)
            bad = True
        elif args.command == "show":
            print(r["xml"])
        elif args.command == "explain":
            print(f"job {r['id']} is {r['state']}:")
            for reason in r.get("reasons", []):
                print(f"  - {reason}")
        else:
            print(f"job {r['id']}: " + ("released" if r.get("released") else "was not held"))
    if bad:
        sys.exit(1)


def _nodes(args: argparse.Namespace) -> None:
    from pilot import wire

    print(_request(_rundir(args), wire.Kind.NODES)["xml"])


# -- run (the main job) -----------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> None:
    import threading

    from tqdm import tqdm

    import client as psij

    cmd = [c for c in args.cmd if c != "--"] or ["/bin/true"]
    n = args.tasks
    done = threading.Semaphore(0)
    finals: list[psij.JobStatus] = []
    lock = threading.Lock()

    def on_status(job: psij.Job, status: psij.JobStatus) -> None:
        if status.final:
            with lock:
                finals.append(status)
            done.release()

    t_start = time.monotonic()
    with psij.JobExecutor.get_instance("pilot", url=args.url) as ex:
        ex.set_job_status_callback(on_status)
        # Connect (starting the embedded pilot if none runs) and let its agents register, so start-up is
        # timed apart from the run and the progress bar starts when tasks can.
        deadline = time.monotonic() + 120
        while (ex.pilot_status().get("allocation") or {}).get("state") == "starting" and time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = time.monotonic()
        bar = tqdm(total=n, desc="tasks", unit="task", file=sys.stderr, mininterval=0.2)
        # One bulk submission, as a workflow engine with the jobs at hand would (requests pipelined).
        ex.submit_all([psij.Job(psij.JobSpec(executable=cmd[0], arguments=cmd[1:])) for _ in range(n)])
        t_submitted = time.monotonic()
        for _ in range(n):
            done.acquire()
            bar.update(1)
        t_end = time.monotonic()
        bar.close()
        pilot_status = ex.pilot_status()
    failed = [s for s in finals if s.state is not psij.JobState.COMPLETED]
    md = [s.metadata or {} for s in finals]
    summary = {
        "tasks": n,
        "completed": n - len(failed),
        "failed": len(failed),
        "command": cmd,
        "nodes": len(pilot_status.get("nodes", [])),
        "startup_seconds": t0 - t_start,
        "submit_seconds": t_submitted - t0,
        "makespan_seconds": t_end - t0,
        "tasks_per_second": n / (t_end - t0) if t_end > t0 else 0.0,
        "delivered": {
            "wall_seconds": sum(m.get("wall_duration", 0.0) for m in md),
            "user_cpu_seconds": sum(m.get("user_cpu_time", 0.0) for m in md),
            "system_cpu_seconds": sum(m.get("system_cpu_time", 0.0) for m in md),
            "max_rss_bytes": max((m.get("max_rss", 0) for m in md), default=0),
            "processors": sum(m.get("processors", 0) for m in md),
        },
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    d = summary["delivered"]
    print(
        f"{n} tasks of {' '.join(cmd)!r} on {summary['nodes']} node(s): {summary['completed']} completed, "
        f"{summary['failed']} failed"
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
    for s in failed[:5]:
        print(f"  failed: {s.state} exit {s.exit_code}: {s.message}")
    if failed:
        sys.exit(1)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _dur(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}G"


# -- logs (output streaming) --------------------------------------------------------------------------


def _logs(args: argparse.Namespace) -> None:
    """Print a streamed job's stdout and stderr (to ours); with -f, follow it until the daemon says the job
    is final, then print what its agent wrote last."""
    from client.output import OutputReader

    rundir = _rundir(args)
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
        time.sleep(0.5)  # the agent appends what the job's pipes still held when it exited
        _print_records(reader.read())
    except psij.InvalidJobException as exc:
        print(f"pilot: {exc}", file=sys.stderr)
        sys.exit(1)
    finally:
        ex.close()


def _print_records(records: list[tuple[int, str, bytes]]) -> None:
    for _, stream, data in records:
        out = sys.stdout.buffer if stream == "out" else sys.stderr.buffer
        out.write(data)
    sys.stdout.buffer.flush()
    sys.stderr.buffer.flush()

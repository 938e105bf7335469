"""The pilot itself: ``up``, ``down``, ``status``, ``ls`` and ``credentials``."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pilot import config as config_mod
from pilot.cli.common import (
    add_target,
    dur,
    fail,
    gib,
    print_json,
    request,
    rundir_of,
    running_info,
    table,
    tail,
    utc,
    warn,
)
from pilot.rundir import RunDir, pid_alive, root
from pilot.security import SecurityError

if TYPE_CHECKING:
    from pilot.earlier_life import Start


def add_parsers(sub: Any) -> None:
    up = sub.add_parser("up", help="start the daemon and acquire its allocation")
    add_target(up)
    up.add_argument("--config", type=Path, help="TOML config (default: $PILOT_CONFIG, else configs/local.toml)")
    up.add_argument("--foreground", action="store_true", help="stay attached; log to stderr")
    up.add_argument("--json", action="store_true", help="pid, run directory and client address as JSON")
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
    up.set_defaults(func=up_cmd)

    ck = sub.add_parser("check", help="check a config without starting anything: errors, then warnings")
    ck.add_argument("--config", type=Path, help="TOML config (default: $PILOT_CONFIG, else configs/local.toml)")
    ck.add_argument("--json", action="store_true", help="the config's source and its warnings as JSON")
    ck.set_defaults(func=check_cmd)

    st = sub.add_parser("status", help="the pilot, its allocation, nodes and jobs")
    add_target(st)
    st.add_argument("--json", action="store_true", help="the whole status as JSON")
    st.set_defaults(func=status_cmd)

    ls = sub.add_parser("ls", help="your pilots: those running, and stopped ones that left a journal or a job history")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=ls_cmd)

    down = sub.add_parser("down", help="stop the daemon: running jobs end CANCELED, agents exit")
    add_target(down)
    down.add_argument(
        "--drain",
        action="store_true",
        help="refuse new jobs, let every accepted one (queued and running) finish, then stop",
    )
    down.add_argument(
        "--timeout",
        type=float,
        help="with --drain: give up waiting after this many seconds (the drain goes on)",
    )
    down.add_argument("--json", action="store_true", help="what stopped, as JSON")
    down.set_defaults(func=down_cmd)

    cred = sub.add_parser("credentials", help="write a remote client's access file (endpoint and keys, 0600)")
    add_target(cred)
    cred.add_argument("--client", type=Path, required=True, metavar="FILE", help="file to write (0600)")
    cred.set_defaults(func=credentials_cmd)


# -- up -----------------------------------------------------------------------------------------------


def _config_path(args: argparse.Namespace) -> Path | None:
    given = args.config or (Path(os.environ["PILOT_CONFIG"]) if os.environ.get("PILOT_CONFIG") else None)
    return given.expanduser().resolve() if given is not None else None


def checked(cfg: config_mod.Config) -> list[str]:
    """Refuse what no site can run (ConfigError); the warnings of what runs but not as it reads."""
    from pilot import lrm
    from pilot.config_checks import sanity

    for site in cfg.sites:
        lrm.create(site.lrm, options=site.options, source=cfg.source, table=site.table).validate(nodes=site.nodes)
    return sanity(cfg)


def check_cmd(args: argparse.Namespace) -> None:
    cfg = config_mod.load(_config_path(args))
    warnings = checked(cfg)
    if args.json:
        print_json({"config": cfg.source, "usable": True, "warnings": warnings})
        return
    for w in warnings:
        warn("check", w)
    print(f"{cfg.source}: usable" + (f", with {len(warnings)} warning(s)" if warnings else ""))


def up_cmd(args: argparse.Namespace) -> None:
    config_path = _config_path(args)
    cfg = config_mod.load(config_path)
    rundir = rundir_of(args, config=config_path)
    start: Start = "fresh" if args.fresh else "restore" if args.restore else "resume"
    if args.foreground:
        _serve(cfg, rundir, embedded=args.embedded, parent_pid=args.parent_pid, start=start)
        return
    info = rundir.read_info()
    if info is not None:
        fail(f"already running in {rundir.path} (pid {info['pid']})")
    # Validate before forking, so a bad config fails here with exit code 2, not in the daemon's log.
    for w in checked(cfg):
        warn("up", w)
    rundir.create()
    cmd = [sys.executable, "-m", "pilot", "up", "--foreground", "--rundir", str(rundir.path)]
    if config_path is not None:
        cmd += ["--config", str(config_path)]
    if start != "resume":
        cmd.append(f"--{start}")
    with open(rundir.log_file, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = rundir.read_info()
        if info is not None and info.get("pid") == proc.pid:
            if args.json:
                print_json({"pid": proc.pid, "rundir": str(rundir.path), "client_url": info["client_url"]})
                return
            print(f"pilot up: pid {proc.pid}, run directory {rundir.path}")
            print(f"  clients connect to {info['client_url']}; logs in {rundir.log_file}")
            return
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    fail(f"the daemon did not start; last lines of {rundir.log_file}:\n{tail(rundir.log_file)}")


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
        fail(str(exc))


# -- status -------------------------------------------------------------------------------------------


def status_cmd(args: argparse.Namespace) -> None:
    from pilot import wire

    st = request(rundir_of(args), wire.Kind.STATUS)
    if args.json:
        print_json(st)
        return
    p = st["pilot"]
    flags = "".join(f"  [{w}]" for w in ("resumed", "draining") if p.get(w))
    if p.get("restored"):
        flags += f"  [restored from the journal snapshot of {utc(p['restored'])}]"
    print(f"pilot {Path(p['rundir']).name}  pid {p['pid']}  up {dur(p['uptime'])}  run dir {p['rundir']}{flags}")
    journal = p.get("journal") or {}
    if journal.get("error"):
        held = f"; {journal['held']} change(s) held in memory until it can be written" if journal.get("held") else ""
        since = time.time() - float(journal.get("since") or time.time())
        print(f"journal: new jobs refused for {dur(since)}: {journal['error']}{held}")
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
    rows = [
        [
            n["name"],
            n["agent"],
            f"{n['free_cores']}/{n['cores']}",
            f"{n['free_gpus']}/{n['gpus']}",
            f"{gib(n['free_memory'])}/{gib(n['memory'])}",
            str(n.get("running", n["processes"])),
            str(n.get("waiting", 0)),
        ]
        for n in sorted(st["nodes"], key=lambda n: _natural(n["name"]))
    ]
    header = ["node", "agent", "free cores", "free gpus", "free memory", "running", "waiting"]
    for line in table(header, rows, right={2, 3, 4, 5, 6}):
        print(line)
    jobs = st.get("jobs") or {}
    print("jobs: " + (", ".join(f"{k} {v}" for k, v in sorted(jobs.items())) or "none"))
    for w in st.get("warnings") or []:
        print(f"warning: {w}")


def _natural(name: str) -> list[Any]:
    """'node2' before 'node10'."""
    import re

    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _allocation_line(a: dict[str, Any], *, several: bool) -> str:
    where = f" {a['name']} (site {a['site']})" if several and "name" in a else ""
    line = f"allocation{where} {a.get('lrm')} {a.get('native_id')}: {a.get('state')}, {a.get('nodes')} node(s)"
    if a.get("remaining") is not None:
        line += f", {dur(a['remaining'])} of walltime left"
    native = " ".join(str(a[k]) for k in ("native_state", "reason") if a.get(k))
    if native and a.get("state") in ("queued", "starting"):
        line += f" [{a.get('lrm')}: {native}]"  # the batch system's own words: PENDING (Priority), ...
    if a.get("message"):
        line += f" ({a['message']})"
    return line


# -- ls -----------------------------------------------------------------------------------------------


def pilots() -> list[dict[str, Any]]:
    """The user's pilots under $PILOT_HOME: running ones (with their info), and stopped ones that left
    a journal (a 'pilot up' there resumes it) or a job history."""
    base = root()
    out: list[dict[str, Any]] = []
    try:
        entries = sorted(p for p in base.iterdir() if p.is_dir())
    except OSError:
        return []
    for path in entries:
        rd = RunDir(path)
        info = rd.read_info()
        if info is not None:
            out.append(
                {
                    "name": path.name,
                    "state": "running",
                    "pid": info.get("pid"),
                    "embedded": bool(info.get("embedded")),
                    "started": info.get("started"),
                    "config": info.get("config"),
                    "client_url": info.get("client_url"),
                    "rundir": str(path),
                }
            )
        elif (path / "journal.db").exists():
            out.append({"name": path.name, "state": "stopped", "kept": "journal", "rundir": str(path)})
        elif rd.history_file.exists():
            out.append({"name": path.name, "state": "stopped", "kept": "history", "rundir": str(path)})
    return out


def ls_cmd(args: argparse.Namespace) -> None:
    found = pilots()
    if args.json:
        print_json(found)
        return
    if not found:
        print(f"no pilots under {root()} ('pilot up' starts one)")
        return
    rows = []
    now = time.time()
    for p in found:
        if p["state"] == "running":
            up = dur(now - float(p["started"])) if isinstance(p.get("started"), (int, float)) else "-"
            what = "embedded (of a 'pilot run' or a client)" if p["embedded"] else str(p.get("config") or "")
            rows.append([p["name"], "running", str(p["pid"]), up, what])
        elif p["kept"] == "journal":
            rows.append([p["name"], "stopped", "-", "-", f"journal kept: 'pilot up --name {p['name']}' resumes it"])
        else:
            rows.append([p["name"], "stopped", "-", "-", f"jobs kept: 'pilot history --name {p['name']}'"])
    for line in table(["name", "state", "pid", "up", "config"], rows):
        print(line)


# -- down ---------------------------------------------------------------------------------------------


def down_cmd(args: argparse.Namespace) -> None:
    from pilot import wire

    if args.timeout is not None and (not args.drain or args.timeout <= 0):
        fail("--timeout goes with --drain and must be more than 0 seconds", code=2)
    rundir = rundir_of(args)
    reply = request(rundir, wire.Kind.SHUTDOWN, {"drain": bool(args.drain)})
    pid = int(reply.get("pid", 0))
    if args.drain:
        left = reply.get("unfinished", 0)
        if not args.json:
            print(f"pilot down --drain: {left} accepted job(s) to finish; new submissions are refused", flush=True)
        wait = args.timeout
    else:
        wait = 30.0
    deadline = None if wait is None else time.monotonic() + wait
    while pid and pid_alive(pid) and (deadline is None or time.monotonic() < deadline):
        time.sleep(0.05)
    if pid and pid_alive(pid):
        what = "is still draining" if args.drain else "did not stop"
        fail(f"daemon {pid} {what} after {wait:g} s ('pilot status' shows what is left)")
    if args.json:
        print_json({"rundir": str(rundir.path), "pid": pid, "stopped": True})
        return
    print(f"pilot down: {rundir.path} stopped")


# -- credentials --------------------------------------------------------------------------------------


def credentials_cmd(args: argparse.Namespace) -> None:
    """A remote client needs the clients' CURVE endpoint, the daemon's key to pin and a client key pair:
    one private file it can be given (``scp -p``), named by ``PILOT_CREDENTIALS`` or the executor's url."""
    from pilot.security import ClientAccess, read_client_credentials, write_client_access

    rundir = rundir_of(args)
    rundir.check()
    info = running_info(rundir)
    endpoint = info.get("client_tcp_url")
    if not isinstance(endpoint, str):
        fail(
            f'the pilot in {rundir.path} takes no remote clients; set client_transport = "tcp" under '
            "[pilot] in its config (and client_bind to the interface clients reach), then restart it"
        )
    access = ClientAccess(endpoint, read_client_credentials(rundir.keys_dir))
    path = args.client.expanduser()
    write_client_access(path, access)
    print(f"pilot credentials: wrote {path} (mode 0600) for {endpoint}")
    print("  copy it privately (scp -p) and set PILOT_CREDENTIALS to its path, or pass the path as the url")

"""``pilot top``: a live view of a running pilot, as ``htop`` or ``flux top``: per node the busy cores,
GPUs and memory, the queue, tasks/s, when the queued work should be done, and the latest failures.

Each frame is three read-only requests the daemon already answers (status, and the latest ended and
FAILED jobs), so watching a pilot costs it little. Drawn with ``rich``, which redraws in place on a
terminal and prints plain text elsewhere (``--once`` for scripts; ``--json`` for programs)."""

from __future__ import annotations

import argparse
import re
import time
from typing import TYPE_CHECKING, Any

from pilot.cli.common import add_target, dur, duration_arg, gib, non_negative_int, print_json, request, rundir_of
from pilot.model.job_state import FINAL_NAMES

if TYPE_CHECKING:
    from rich.console import RenderableType

_FINAL = list(FINAL_NAMES)
#: Tasks/s is what ended over the last minute (or since the pilot started, if later).
_WINDOW = 60.0
#: How many of the latest ended jobs a frame asks for to count the rate (beyond it: their own span).
_RECENT = 500


def add_parsers(sub: Any) -> None:
    tp = sub.add_parser(
        "top",
        help="a live view: busy cores/GPUs/memory per node, queue, tasks/s, ETA, recent failures",
        description="Redraws in place every --interval until Ctrl-C; --once (or an output that is not a terminal) "
        "prints one frame and exits.",
    )
    add_target(tp)
    tp.add_argument("--once", action="store_true", help="print one frame and exit (for scripts)")
    tp.add_argument("--interval", type=duration_arg, default=2.0, metavar="SECONDS", help="between frames (default 2)")
    tp.add_argument(
        "--failures", type=non_negative_int, default=5, metavar="N", help="how many recent failures to show (5)"
    )
    tp.add_argument("--json", action="store_true", help="one frame as JSON (implies --once)")
    tp.set_defaults(func=top_cmd)


def top_cmd(args: argparse.Namespace) -> None:
    rundir = rundir_of(args)
    if args.json:
        print_json(snapshot(rundir, failures=args.failures))
        return
    from rich.console import Console

    console = Console(highlight=False)
    if args.once or not console.is_terminal:
        console.print(render(snapshot(rundir, failures=args.failures)))
        return
    from rich.live import Live

    try:
        with Live(render(snapshot(rundir, failures=args.failures)), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)
                live.update(render(snapshot(rundir, failures=args.failures)), refresh=True)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how one leaves a live view: not an error


# -- the data of a frame --------------------------------------------------------------------------------


def snapshot(rundir: Any, *, failures: int) -> dict[str, Any]:
    """One frame: what the pilot's status says, with the rate and ETA worked out from the latest ends."""
    from pilot import wire

    st = request(rundir, wire.Kind.STATUS)
    now = time.time()
    # The latest to end (not the last submitted): the pilot names them from memory, whatever its queue.
    ended = request(rundir, wire.Kind.JOBS, {"states": _FINAL, "limit": _RECENT, "latest": True}).get("jobs") or []
    failed = (
        request(rundir, wire.Kind.JOBS, {"states": ["FAILED"], "limit": failures, "latest": True}).get("jobs") or []
        if failures
        else []
    )
    p = st.get("pilot") or {}
    counts: dict[str, int] = {str(k): int(v) for k, v in (st.get("jobs") or {}).items()}
    unfinished = sum(n for state, n in counts.items() if state not in _FINAL)
    rate = tasks_per_second(
        [float(r["ended"]) for r in ended if isinstance(r.get("ended"), int | float)],
        now=now,
        window=min(_WINDOW, float(p.get("uptime") or _WINDOW)),
        capped=len(ended) >= _RECENT,
    )
    nodes = [
        {
            "name": n["name"],
            "agent": n["agent"],
            "cores": n["cores"],
            "busy_cores": n["cores"] - n["free_cores"],
            "gpus": n["gpus"],
            "busy_gpus": n["gpus"] - n["free_gpus"],
            "memory": n["memory"],
            "busy_memory": n["memory"] - n["free_memory"],
            "running": n.get("running", n.get("processes", 0)),
            "waiting": n.get("waiting", 0),
            "load": (n.get("load") or [None])[0],
        }
        for n in sorted(st.get("nodes") or [], key=lambda n: _natural(str(n["name"])))
    ]
    return {
        "pilot": rundir.path.name,
        "time": now,
        "uptime": p.get("uptime"),
        "allocations": [
            {"name": a.get("name"), "state": a.get("state"), "remaining": a.get("remaining")}
            for a in st.get("allocations") or []
        ],
        "nodes": nodes,
        "jobs": counts,
        "queued": int(st.get("queued") or 0),
        "unfinished": unfinished,
        "tasks_per_second": rate,
        "eta_seconds": unfinished / rate if rate > 0 and unfinished else (0.0 if not unfinished else None),
        "failures": [
            {k: r.get(k) for k in ("id", "name", "ended", "exit_code", "message", "nodes", "run")}
            for r in reversed(failed)
        ],
    }


def tasks_per_second(ended: list[float], *, now: float, window: float, capped: bool) -> float:
    """Jobs ended in the last ``window`` seconds per second. When the list was cut (``capped``) and all
    of it lies in the window, over the span it covers instead: the rest ended before it."""
    recent = [t for t in ended if now - window <= t <= now]
    if not recent or window <= 0:
        return 0.0
    span = window
    if capped and len(recent) == len(ended):
        span = max(now - min(recent), 1e-3)
    return len(recent) / span


def _natural(name: str) -> list[Any]:
    """'node2' before 'node10'."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


# -- drawing ----------------------------------------------------------------------------------------------


def render(f: dict[str, Any]) -> RenderableType:
    """A frame as a person reads it: a header line, the nodes' table, the latest failures."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    counts: dict[str, int] = f["jobs"]
    rate, eta = f["tasks_per_second"], f["eta_seconds"]
    up = f" up {dur(f['uptime'])}" if isinstance(f.get("uptime"), int | float) else ""
    head = Text.assemble(
        (f"pilot {f['pilot']}", "bold"),
        f"{up}  {time.strftime('%H:%M:%S', time.localtime(f['time']))}",
        *(
            f"  allocation{' ' + a['name'] if a['name'] and len(f['allocations']) > 1 else ''} {a['state']}"
            + (f", {dur(a['remaining'])} left" if isinstance(a.get("remaining"), int | float) else "")
            for a in f["allocations"]
        ),
    )
    jobs = Text.assemble(
        ("queued ", "bold"),
        str(f["queued"]),
        ("  running ", "bold"),
        str(counts.get("ACTIVE", 0)),
        ("  done ", "bold"),
        str(counts.get("COMPLETED", 0)),
        ("  failed ", "bold"),
        (str(counts.get("FAILED", 0)), "red" if counts.get("FAILED") else ""),
        ("  canceled ", "bold"),
        str(counts.get("CANCELED", 0)),
        ("  tasks/s ", "bold"),
        f"{rate:.1f}",
        ("  ETA ", "bold"),
        "-" if eta is None else dur(eta),
    )
    nodes = Table(box=None, pad_edge=False, header_style="bold", title_justify="left")
    for column, justify in [
        ("node", "left"),
        ("agent", "left"),
        ("cores", "right"),
        ("", "left"),
        ("gpus", "right"),
        ("memory", "right"),
        ("running", "right"),
        ("waiting", "right"),
        ("load", "right"),
    ]:
        nodes.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for n in f["nodes"]:
        cells = [
            n["name"],
            n["agent"],
            f"{n['busy_cores']}/{n['cores']}",
            _bar(n["busy_cores"], n["cores"]),
            f"{n['busy_gpus']}/{n['gpus']}",
            f"{n['busy_memory'] / 2**30:.1f}/{gib(n['memory'])}",
            str(n["running"]),
            str(n["waiting"]),
            "-" if n["load"] is None else f"{float(n['load']):.2f}",
        ]
        nodes.add_row(*(Text(c) for c in cells))  # Text: a node's name is shown as it is, never as markup
    parts: list[RenderableType] = [head, jobs, Text("per node, busy/total:", style="dim"), nodes]
    if not f["nodes"]:
        parts.append(Text("no node has registered yet (the allocation is starting)"))
    if f["failures"]:
        parts.append(Text("\nrecent failures", style="bold"))
        for r in f["failures"]:
            code = "no exit code" if r["exit_code"] is None else f"exit {r['exit_code']}"
            when = time.strftime("%H:%M:%S", time.localtime(r["ended"])) if r.get("ended") else "-"
            line = f"  {when}  job {r['id']} ({r.get('name') or '-'}): {code}: {r.get('message') or ''}"
            parts.append(Text(line, style="red", no_wrap=True, overflow="ellipsis"))
    return Group(*parts)


def _bar(busy: int, total: int, width: int = 8) -> str:
    if total <= 0:
        return ""
    full = round(width * busy / total)
    return "█" * full + "░" * (width - full)

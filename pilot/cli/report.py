"""``pilot report [RUN]``: one HTML page about a run, to read after the fact or send to someone (as Parsl's
monitoring pages): busy cores per node over time, each task's wait and run, queue depth, tasks/s, what each
job asked for against what it used (cores, memory) and the failures.

Its data is what outlives the daemon: the accounting history (``history.db``) and, while the pilot runs,
its jobs as 'pilot history' shows them. The page is self-contained (the plots inside it as PNGs, which
are also written beside it); drawn with matplotlib on its Agg backend, which needs no display."""

from __future__ import annotations

import argparse
import base64
import html
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pilot import report_data as rd
from pilot.cli.common import add_target, dur, fail, gib, print_json, rundir_of

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_COLOURS = {"COMPLETED": "#2e7d32", "FAILED": "#c62828", "CANCELED": "#757575"}
#: Beyond this many jobs the timeline shows the last ones (a picture of more tells nothing more).
_TIMELINE_MAX = 2000
#: Beyond this many failures the page lists the first ones ('pilot history --state FAILED' has them all).
_FAILURES_MAX = 1000


def add_parsers(sub: Any) -> None:
    rp = sub.add_parser(
        "report",
        help="an HTML page (and PNGs) about a run: utilization, timeline, queue, tasks/s, asked vs used, failures",
        description="RUN is a run id as 'pilot run' and 'pilot submit' print it (default: the latest run); "
        "works while the pilot runs and after 'pilot down'.",
    )
    add_target(rp)
    rp.add_argument("run", nargs="?", metavar="RUN", help="the run (default: the latest one)")
    rp.add_argument("--all", action="store_true", help="every job the pilot has kept, of whatever run")
    rp.add_argument("--output", type=Path, metavar="DIR", help="where to write (default: ./pilot-report-RUN)")
    rp.add_argument("--json", action="store_true", help="what was written, and the run's numbers, as JSON")
    rp.set_defaults(func=report_cmd)


def report_cmd(args: argparse.Namespace) -> None:
    if args.all and args.run:
        fail("give a RUN or --all, not both", code=2)
    rundir = rundir_of(args)
    rows = _rows(args, rundir)
    run = "all" if args.all else args.run or _latest_run(rows, rundir.path)
    chosen = rd.jobs(r for r in rows if args.all or r.get("run") == run)
    if not chosen:
        known = sorted({str(r["run"]) for r in rows if r.get("run")})[-5:]
        hint = f"; the latest runs: {', '.join(known)}" if known else ""
        fail(f"no job of run {run!r} in {rundir.path} ('pilot history' lists what is kept){hint}")
    # The run id comes from the jobs (any client sets it): only a plain name makes the default folder.
    out = (args.output or Path("pilot-report-" + re.sub(r"[^A-Za-z0-9_.-]", "_", run).lstrip("."))).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    now = time.time()
    pngs = _plots(chosen, now=now)
    for name, data in pngs.items():
        (out / f"{name}.png").write_bytes(data)
    page = out / "report.html"
    summary = rd.summary(chosen)
    page.write_text(_html(run, rundir.path.name, chosen, summary, pngs, now=now), encoding="utf-8")
    if args.json:
        print_json({"run": run, "html": str(page), "pngs": [str(out / f"{n}.png") for n in pngs], **summary})
        return
    states = ", ".join(f"{n} {s}" for s, n in summary["states"].items())
    print(f"pilot report: {run}: {summary['jobs']} job(s) ({states}) over {dur(summary['span_seconds'])}")
    print(f"  {page}  (and {len(pngs)} PNGs beside it)")


def _rows(args: argparse.Namespace, rundir: Any) -> list[dict[str, Any]]:
    """The history's rows and, while the pilot runs, its own (they win: they are newer), with Delivered."""
    from pilot import wire
    from pilot.cli.common import request
    from pilot.history import read

    rows = {(r["id"], r["submitted"]): r for r in read(rundir.history_file)}
    if rundir.read_info() is not None:
        body = {"run": None if args.all else args.run, "delivered": True}
        for r in request(rundir, wire.Kind.JOBS, body, timeout=120.0).get("jobs", []):
            rows[(r["id"], r["submitted"])] = r
    elif not rows and not rundir.history_file.exists():
        fail(f"no job history in {rundir.path} yet: it is kept when a pilot there stops ('pilot down')")
    return list(rows.values())


def _latest_run(rows: list[dict[str, Any]], path: Path) -> str:
    tagged = [r for r in rows if isinstance(r.get("run"), str) and isinstance(r.get("submitted"), int | float)]
    if not tagged:
        fail(f"no job in {path} belongs to a run (those of 'pilot run' and 'pilot submit' do): give --all", code=2)
    return str(max(tagged, key=lambda r: float(r["submitted"]))["run"])


# -- plots ------------------------------------------------------------------------------------------------


def _plots(jobs: list[rd.Job], *, now: float) -> dict[str, bytes]:
    try:
        import matplotlib
    except ImportError:
        fail("the report's plots need matplotlib, which is not installed: pip install 'pilot-jobs[report]'")

    matplotlib.use("Agg")  # no display: a file is all it makes
    t0 = min(j.submitted for j in jobs)
    out = {}
    for name, draw in [
        ("utilization", _utilization),
        ("timeline", _timeline),
        ("queue", _queue),
        ("rate", _rate),
        ("delivered", _delivered),
    ]:
        fig = _figure(tall=name in ("timeline", "utilization", "delivered"))
        draw(fig, jobs, t0, now)
        out[name] = _png(fig)
    return out


def _figure(*, tall: bool) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(10, 5.5 if tall else 3.5), dpi=96, layout="constrained")


def _png(fig: Figure) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _since(ax: Axes, t0: float, jobs: list[rd.Job], now: float) -> None:
    """The time axis every time plot shares: from the first submit to the last end (or now)."""
    last = max((j.ended if j.ended is not None else now for j in jobs), default=t0)
    ax.set_xlim(-0.02 * (last - t0 or 1), (last - t0) * 1.02 or 1)
    ax.set_xlabel(f"seconds since the first submit ({time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t0))})")
    ax.grid(alpha=0.3)


def _whole(ax: Axes) -> None:
    """Ticks on whole numbers only on the y axis (cores and jobs come whole)."""
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _utilization(fig: Figure, jobs: list[rd.Job], t0: float, now: float) -> None:
    ax = fig.subplots()
    for node, (times, values) in rd.busy_cores(jobs, now=now).items():
        ax.step([t - t0 for t in times], values, where="post", label=node)
    ax.set_title("busy cores per node")
    ax.set_ylabel("cores held by running jobs")
    _whole(ax)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper right", fontsize="small")
    _since(ax, t0, jobs, now)


def _timeline(fig: Figure, jobs: list[rd.Job], t0: float, now: float) -> None:
    ax = fig.subplots()
    shown = jobs[-_TIMELINE_MAX:]
    for y, j in enumerate(shown):
        start = j.started if j.started is not None else j.ended if j.ended is not None else now
        ax.hlines(y, j.submitted - t0, start - t0, colors="#bdbdbd", linewidth=1)
        if j.started is not None:
            end = j.ended if j.ended is not None else now
            ax.hlines(y, j.started - t0, end - t0, colors=_COLOURS.get(j.state, "#1565c0"), linewidth=3)
    cut = f" (the last {len(shown)} of {len(jobs)})" if len(shown) < len(jobs) else ""
    ax.set_title(f"each job: waiting (grey), running (green: completed, red: failed, blue: not ended){cut}")
    ax.set_ylabel("job, in submit order")
    if len(shown) <= 40:
        ax.set_yticks(range(len(shown)), [j.id for j in shown])
    else:
        _whole(ax)
    ax.invert_yaxis()
    _since(ax, t0, jobs, now)


def _queue(fig: Figure, jobs: list[rd.Job], t0: float, now: float) -> None:
    ax = fig.subplots()
    times, values = rd.queue_depth(jobs, now=now)
    ax.step([t - t0 for t in times], values, where="post", color="#6a1b9a")
    ax.set_title("queue depth: jobs submitted and not started")
    ax.set_ylabel("jobs waiting")
    _whole(ax)
    _since(ax, t0, jobs, now)


def _rate(fig: Figure, jobs: list[rd.Job], t0: float, now: float) -> None:
    ax = fig.subplots()
    starts, rates = rd.ends_per_second(jobs)
    if starts:
        width = starts[1] - starts[0] if len(starts) > 1 else 1.0
        ax.bar([t - t0 for t in starts], rates, width=width, align="edge", color="#00838f")
    ax.set_title("tasks/s: jobs ended per second")
    ax.set_ylabel("jobs ended / s")
    _since(ax, t0, jobs, now)


def _delivered(fig: Figure, jobs: list[rd.Job], t0: float, now: float) -> None:
    cores, memory = fig.subplots(2, 1, sharex=True)
    x = list(range(len(jobs)))
    cores.step(x, [j.cores for j in jobs], where="mid", color="#9e9e9e", label="asked (cores held)")
    cores.scatter(x, [j.cores_used for j in jobs], s=12, color="#1565c0", label="used (CPU time / wall time)")
    cores.set_ylabel("cores")
    cores.set_title("Delivered vs Requested, per job")
    cores.legend(loc="upper right", fontsize="small")
    mib = 2**20
    memory.step(x, [j.memory / mib for j in jobs], where="mid", color="#9e9e9e", label="asked (0: not asked)")
    memory.scatter(x, [j.max_rss / mib for j in jobs], s=12, color="#ef6c00", label="used (max RSS)")
    memory.set_ylabel("memory (MiB)")
    memory.set_xlabel("job, in submit order")
    if len(jobs) <= 40:
        memory.set_xticks(x, [j.id for j in jobs])
    memory.legend(loc="upper right", fontsize="small")
    for ax in (cores, memory):
        ax.grid(alpha=0.3)


# -- the page ---------------------------------------------------------------------------------------------

_CAPTIONS = {
    "utilization": "Utilization over time per node",
    "timeline": "Per-task timeline",
    "queue": "Queue depth over time",
    "rate": "Tasks per second",
    "delivered": "Delivered vs Requested per job",
}


def _html(
    run: str, pilot: str, jobs: list[rd.Job], summary: dict[str, Any], pngs: dict[str, bytes], *, now: float
) -> str:
    e = html.escape
    states = ", ".join(f"{n} {e(s)}" for s, n in summary["states"].items())
    failed = [j for j in jobs if j.state == "FAILED"]
    figures = "\n".join(
        f'<figure id="{name}"><figcaption>{e(_CAPTIONS[name])}</figcaption>'
        f'<img alt="{e(_CAPTIONS[name])}" src="data:image/png;base64,{base64.b64encode(data).decode()}"></figure>'
        for name, data in pngs.items()
    )
    rows = "\n".join(
        f"<tr><td>{e(j.id)}</td><td>{e(j.name)}</td><td>{e(', '.join(j.nodes) or '-')}</td>"
        f"<td>{'-' if j.exit_code is None else j.exit_code}</td>"
        f"<td>{e(time.strftime('%H:%M:%S', time.localtime(j.ended))) if j.ended else '-'}</td>"
        f"<td>{e(j.message)}</td></tr>"
        for j in failed[:_FAILURES_MAX]
    )
    if len(failed) > _FAILURES_MAX:
        more = f"... and {len(failed) - _FAILURES_MAX} more: 'pilot history --state FAILED --run {run}'"
        rows += f"\n<tr><td colspan=6>{e(more)}</td></tr>"
    failures = (
        f'<table id="failures"><tr><th>job</th><th>name</th><th>node</th><th>exit</th><th>ended</th>'
        f"<th>why</th></tr>\n{rows}</table>"
        if failed
        else '<p id="failures">No job failed.</p>'
    )
    asked = sum(j.memory for j in jobs)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>pilot report: {e(run)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1000px; }}
img {{ max-width: 100%; }} figure {{ margin: 1.5em 0; }} figcaption {{ font-weight: bold; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: left; }}
</style></head>
<body>
<h1>Run {e(run)}</h1>
<p>Pilot {e(pilot)}; report made {e(time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now)))}.</p>
<ul id="summary">
<li>{summary["jobs"]} job(s): {states}</li>
<li>from the first submit to the last end: {e(dur(summary["span_seconds"]))};
{summary["tasks_per_second"]:.2f} tasks/s on average</li>
<li>core-hours held {summary["core_hours_held"]:.4f}, used (CPU time) {summary["core_hours_used"]:.4f};
memory asked {e(gib(asked))} in all</li>
</ul>
<h2>Failures ({len(failed)})</h2>
{failures}
{figures}
</body></html>
"""

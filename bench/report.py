"""What every benchmark script does with its figures at the end."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def saved(out: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``out`` stamped with the date and the command's arguments, and written as JSON to ``args.json``
    when one was given (the ``--json FILE`` option)."""
    out.update({"date": time.strftime("%Y-%m-%d"), "args": {k: str(v) for k, v in vars(args).items()}})
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


def repeated(
    measure: Callable[[], dict[str, Any]], *, repeat: int, whose: str, each: Callable[[dict[str, Any]], str]
) -> dict[str, Any]:
    """``repeat`` runs of ``measure`` (each a dict with ``us_per_task``), each described by ``each`` on
    stderr, then ``whose`` CPU per task, their median: the runs and the median, for :func:`saved`."""
    runs = []
    for i in range(repeat):
        r = measure()
        runs.append(r)
        print(f"  run {i + 1}: {each(r)}", file=sys.stderr)
    median = statistics.median(r["us_per_task"] for r in runs)
    print(f"{whose} CPU per task: {median:.1f} µs (median of {repeat})")
    return {"runs": runs, "median_us_per_task": median}


@dataclass
class Row:
    name: str
    workload: str
    figure: float | None = None
    unit: str = ""
    baseline: float | None = None
    baseline_unit: str = ""
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    notes: str = ""
    raw: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0


# -- the table ---------------------------------------------------------------------------------------------------


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def table(rows: list[Row]) -> str:
    head = ["workload", "figure", "in-run baseline", "ratio", "target", "met"]
    body = []
    for r in rows:
        if r.error:
            body.append([f"{r.name}: {r.workload}", "error", "-", "-", r.target or "-", "-"])
            continue
        body.append(
            [
                f"{r.name}: {r.workload}",
                f"{_num(r.figure)} {r.unit}",
                f"{_num(r.baseline)} {r.baseline_unit}",
                f"{r.ratio:.2f}" if r.ratio is not None else "-",
                r.target,
                {True: "yes", False: "no", None: "-"}[r.met],
            ]
        )
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(b) + " |" for b in body]
    notes = [f"- {r.name}: {r.error or r.notes} ({r.seconds:.0f} s)" for r in rows]
    return "\n".join([*lines, "", *notes])


def python_gauge() -> float:
    """Milliseconds of this thread's CPU for a fixed piece of plain Python (calls, small objects, dict
    and attribute work, none of it ours): the best of 5. It says how fast this host runs Python during
    a run, beside which the rows bound by Python (null, scheduler, the throughput ratios) are read: the
    shared VMs these tables come from vary by 2x in it from hour to hour."""

    class _Point:
        __slots__ = ("name", "x")

        def __init__(self, x: int, name: str) -> None:
            self.x = x
            self.name = name

    def work() -> int:
        seen: dict[str, int] = {}
        total = 0
        for i in range(100_000):
            p = _Point(i, str(i % 5000))
            seen[p.name] = seen.get(p.name, 0) + p.x
            total += len(p.name)
        return total + len(seen)

    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time()
        work()
        best = min(best, time.thread_time() - t0)
    return best * 1e3

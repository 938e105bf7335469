"""What ``pilot report`` draws, worked out from job rows (those 'pilot history' keeps: submit, start and
end times, nodes, cores, asked memory, Delivered): busy cores per node, queue depth and ends per second
over time, and per job what it asked against what it used. Pure: no files, no clock, no plotting.

Rows come from a file another process wrote: every field is checked, and a row that makes no sense (no
times, an end before its start) is left out of what it cannot take part in, never a crash."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Series = tuple[list[float], list[float]]


@dataclass(frozen=True, slots=True)
class Job:
    """One job row, checked: times in seconds since the epoch (None: did not happen)."""

    id: str
    name: str
    state: str
    submitted: float
    started: float | None
    ended: float | None
    nodes: tuple[str, ...]
    cores: int
    memory: int  # bytes asked (0: not asked)
    exit_code: int | None
    message: str
    wall: float  # Delivered
    cpu: float  # Delivered user + system CPU seconds
    max_rss: int  # Delivered, bytes

    @property
    def cores_used(self) -> float:
        """Cores kept busy on average: CPU time over wall time."""
        return self.cpu / self.wall if self.wall > 0 else 0.0


def jobs(rows: Iterable[dict[str, Any]]) -> list[Job]:
    """The rows that have an id, a state and a submit time, checked; in submission order."""
    out = []
    for r in rows:
        submitted = _time(r.get("submitted"))
        if not isinstance(r.get("id"), str) or not isinstance(r.get("state"), str) or submitted is None:
            continue
        started, ended = _time(r.get("started")), _time(r.get("ended"))
        if started is not None and ended is not None and ended < started:
            ended = None
        d = r.get("delivered")
        d = d if isinstance(d, dict) else {}
        nodes = r.get("nodes")
        out.append(
            Job(
                id=r["id"],
                name=r["name"] if isinstance(r.get("name"), str) else "-",
                state=r["state"],
                submitted=submitted,
                started=started,
                ended=ended,
                nodes=tuple(str(n) for n in nodes) if isinstance(nodes, list) else (),
                cores=_count(r.get("cores")),
                memory=_count(r.get("memory")),
                exit_code=r["exit_code"] if type(r.get("exit_code")) is int else None,
                message=r["message"] if isinstance(r.get("message"), str) else "",
                wall=_amount(d.get("wall_duration")),
                cpu=_amount(d.get("user_cpu_time")) + _amount(d.get("system_cpu_time")),
                max_rss=_count(d.get("max_rss")),
            )
        )
    return sorted(out, key=lambda j: (j.submitted, int(j.id) if j.id.isdigit() else 0))


def steps(intervals: Iterable[tuple[float, float, float]]) -> Series:
    """The sum of ``weight`` over the intervals ``(start, end, weight)`` that cover each time, as the
    corners of a step line (what was true from each time up to the next)."""
    changes: dict[float, float] = {}
    for start, end, weight in intervals:
        if end > start and weight:
            changes[start] = changes.get(start, 0.0) + weight
            changes[end] = changes.get(end, 0.0) - weight
    times, values, level = [], [], 0.0
    for t in sorted(changes):
        level += changes[t]
        times.append(t)
        values.append(max(0.0, round(level, 9)))
    return times, values


def busy_cores(jobs: Sequence[Job], *, now: float) -> dict[str, Series]:
    """Per node, the cores held by running jobs over time (a job on several nodes: its cores shared out
    evenly; one still running: until ``now``)."""
    per: dict[str, list[tuple[float, float, float]]] = {}
    for j in jobs:
        if j.started is None or not j.nodes:
            continue
        end = j.ended if j.ended is not None else now
        for node in j.nodes:
            per.setdefault(node, []).append((j.started, end, j.cores / len(j.nodes)))
    return {node: steps(spans) for node, spans in sorted(per.items())}


def queue_depth(jobs: Sequence[Job], *, now: float) -> Series:
    """How many jobs waited (submitted, not started yet) over time; one that never started waited until
    it ended (canceled, say) or until ``now``."""
    return steps(
        (j.submitted, j.started if j.started is not None else j.ended if j.ended is not None else now, 1.0)
        for j in jobs
    )


def ends_per_second(jobs: Sequence[Job], *, bins: int = 60) -> Series:
    """Jobs ended per second, in up to ``bins`` equal spans (each at least a second) from the first submit
    to the last end: the left edge of each span and its rate."""
    ends = sorted(j.ended for j in jobs if j.ended is not None)
    if not ends:
        return [], []
    first = min(j.submitted for j in jobs)
    span = ends[-1] - first
    n = max(1, min(bins, math.floor(span)))
    width = max(span / n, 1.0)
    counts = [0] * n
    for t in ends:
        counts[min(n - 1, max(0, int((t - first) / width)))] += 1
    return [first + i * width for i in range(n)], [c / width for c in counts]


def summary(jobs: Sequence[Job]) -> dict[str, Any]:
    """The run in a few numbers: jobs by state, its span, its mean rate, core-hours held and used."""
    states: dict[str, int] = {}
    for j in jobs:
        states[j.state] = states.get(j.state, 0) + 1
    ends = [j.ended for j in jobs if j.ended is not None]
    first = min((j.submitted for j in jobs), default=0.0)
    span = max(ends) - first if ends else 0.0
    held = sum(j.cores * (j.ended - j.started) for j in jobs if j.started is not None and j.ended is not None)
    return {
        "jobs": len(jobs),
        "states": dict(sorted(states.items())),
        "first_submit": first if jobs else None,
        "span_seconds": span,
        "tasks_per_second": len(ends) / span if span > 0 else 0.0,
        "core_hours_held": held / 3600,
        "core_hours_used": sum(j.cpu for j in jobs) / 3600,
    }


def _time(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _amount(value: Any) -> float:
    t = _time(value)
    return 0.0 if t is None else t


def _count(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0

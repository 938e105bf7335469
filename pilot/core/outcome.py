"""How a job ended, from its processes' results: the final state, the exit code, the message that
names the cause (not the collateral), and the Delivered resources."""

from __future__ import annotations

import signal as _signal
from typing import Any, Final

from pilot.jobs import JobRecord
from pilot.model.job_state import JobState
from pilot.model.process_order import STAGING_ROLES


def outcome(job: JobRecord, *, walltime_margin: float) -> tuple[JobState, int | None, str | None]:
    run = job.run
    if job.cancel_reason is None and all(r.ok for r in run.results.values()):
        return JobState.COMPLETED, 0, None  # nearly every job: nothing to sort or name
    d = job.description
    results = sorted(run.results.items(), key=lambda kv: (kv[0] < 0, kv[0]))
    bad = [(slot, r) for slot, r in results if not r.ok]
    # Canceled: something was stopped, or nothing but its staging ran (canceled while staging in).
    if job.cancel_reason is not None and (bad or all(r.role in STAGING_ROLES for _, r in results)):
        return JobState.CANCELED, None, job.cancel_reason
    if not bad:
        return JobState.COMPLETED, 0, None
    # The cause, not the collateral: a process we killed because another failed is not the cause.
    causes = [(s, r) for s, r in bad if r.reason is None or r.reason == "walltime"] or bad
    slot, r = causes[0]
    code = r.exit_code if r.exit_code is not None else (-r.signal if r.signal else None)
    pre = f"pre_launch script {d.pre_launch!r}" if d.pre_launch else "the launch preparation (output files)"
    what = {"pre": pre, "post": f"post_launch script {d.post_launch!r}"}.get(
        r.role, f"rank {slot}" if len(run.ranks) > 1 or slot else "the process"
    )
    if r.reason == "walltime" and job.closing:
        return (
            JobState.FAILED,
            code,
            f"walltime: the allocation ends in under {walltime_margin:g} s (pilot.walltime_margin), so {what} was "
            f"stopped on node {r.node} before the batch system could kill it",
        )
    if r.reason == "walltime":
        return (
            JobState.FAILED,
            code,
            (
                f"walltime exceeded: {what} ran past JobAttributes.duration of {d.duration:g} s "
                f"on node {r.node} and was killed"
            ),
        )
    if r.message is not None:
        return JobState.FAILED, code, r.message
    if r.signal:
        return (
            JobState.FAILED,
            code,
            f"{what} was killed by signal {r.signal} ({_signame(r.signal)}) on node {r.node}",
        )
    return JobState.FAILED, code, f"{what} exited with code {r.exit_code} on node {r.node}"


def delivered(job: JobRecord, exit_code: int | None) -> dict[str, Any]:
    """The job's Delivered resources (PSI/J status metadata), summed over its processes."""
    run = job.run
    # One pass over the results and one over the ranks (this runs once per job end, thousands a second:
    # the dict is built in place, with no unpacking of optional parts).
    user: float = 0
    system: float = 0
    max_rss: int | None = None
    processes = 0
    signal: int | None = None  # the first one seen
    staged = False
    for slot, r in run.results.items():
        data = r.data
        if data:
            user += float(data.get("user_cpu_time") or 0)
            system += float(data.get("system_cpu_time") or 0)
            rss = int(data.get("max_rss") or 0)
            if max_rss is None or rss > max_rss:
                max_rss = rss
        if slot >= 0:
            processes += 1
        if r.signal and signal is None:
            signal = r.signal
        if r.role == "stage_in":
            staged = True
    started = run.started
    wall = max(0.0, (run.ended or 0) - started) if started is not None else 0.0
    ranks = run.ranks
    if len(ranks) == 1:  # (nearly every job)
        rank = ranks[0]
        processors, gpus, nodes = len(rank.cores), len(rank.gpus), [rank.node]
    else:
        processors = gpus = 0
        seen = set()
        for rank in ranks:
            processors += len(rank.cores)
            gpus += len(rank.gpus)
            seen.add(rank.node)
        nodes = sorted(seen)
    # The signal of the process that decided the outcome (a rank killed because another failed is
    # not it); when no process decided it (canceled, node lost), the first one seen.
    if exit_code is not None:
        signal = -exit_code if exit_code < 0 else None
    out: dict[str, Any] = {
        "wall_duration": wall,
        "user_cpu_time": user,
        "system_cpu_time": system,
        "max_rss": 0 if max_rss is None else max_rss,
        "processors": processors,
        "gpus": gpus,
        "consumption_rate": (user + system) / (wall * processors) if wall > 0 and processors else 0.0,
        "nodes": nodes,
        "processes": processes,
    }
    if staged:
        out.update(_staging(run.results.values()))
    out["exit_code"] = exit_code
    out["signal"] = signal
    if started is not None:
        out["started"] = started
    if run.placement is not None:
        out["tasks"] = task_entries(job)
    return out


#: What Delivered keeps of each task's process (SSS Task Process and ExitCode, per-TaskGroup sums).
_TASK_KEYS: Final = ("pid", "wall_duration", "user_cpu_time", "system_cpu_time", "max_rss")


def task_entries(job: JobRecord) -> list[list[Any]]:
    """Each placed task as [group, task, node, cores, gpus, process]: ``process`` is what its process
    delivered (pid, exit_code, times, max_rss, and ``slot``, which tasks of one parallel launch share),
    empty until it has ended."""
    run = job.run
    assert run.placement is not None
    first: dict[int, int] = {}
    for i, t in enumerate(run.placement.tasks):
        first.setdefault(t.group, i)
    out: list[list[Any]] = []
    for i, t in enumerate(run.placement.tasks):
        slot = i if i in run.results else first[t.group]  # a parallel launch: one process for the group
        r = run.results.get(slot)
        process: dict[str, Any] = {}
        plan = run.processes.get(slot)
        if plan is not None and plan.pid is not None:  # running: its pid so far
            process = {"pid": plan.pid, "slot": slot, "running": True}
        if r is not None:
            process = {k: r.data[k] for k in _TASK_KEYS if r.data.get(k) is not None}
            process["slot"] = slot
            if r.exit_code is not None:
                process["exit_code"] = r.exit_code
        out.append([t.group, t.task, t.node, t.cores, t.gpus, process])
    return out


def _staging(results: Any) -> dict[str, Any]:
    """What its agents' stage-in caches saved, summed over its nodes: ``stage_in_cache_hits`` (sources
    found in a node's cache) and ``stage_in_transfers`` (sources fetched), present only for a job that
    staged in."""
    out: dict[str, Any] = {}
    for r in results:
        if r.role == "stage_in" and isinstance(r.data.get("staging"), dict):
            for k, v in r.data["staging"].items():
                if k in ("cache_hits", "transfers") and type(v) is int and v >= 0:
                    out[f"stage_in_{k}"] = out.get(f"stage_in_{k}", 0) + v
    return out


def _signame(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"

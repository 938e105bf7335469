"""Scheduler cost per task: matching + placement of identical queued tasks, with and without the
job-category cache.

    python bench/scheduler_cost.py [--nodes 1000] [--cores 64] [--queued 1000 100000] [--window 500] [--repeat 3]

One scheduling pass (:class:`pilot.scheduler.distribution.SchedulingPass`) offers every queued task,
in order, to 1,000 simulated nodes of 64 cores (64,000 slots); each task asks for one core on a node
with feature ``ib`` (so matching has work to do). Reported per queued task, in µs:

- *cached*: the pass as the daemon runs it (the category is matched once, full nodes are skipped
  once per pass, and a category that no longer fits is refused at once);
- *baseline*: the same loop without the category cache: every task matched against every node and
  placed by scanning from the first node. Its cost depends on how full the cluster is, so for long
  queues it is measured on ``--window`` tasks at evenly spaced queue positions (the cluster first
  filled to that point) and averaged: an estimate, marked "~".
- *drain*: the whole queue run to completion in passes, every placed task released between passes
  (match + place + release per task), with the cache.

Flatness is the ratio of the cached cost per task at the largest queue to that at the smallest.
Every figure is process CPU time (not wall time: other work on the machine would count), the median
of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

from pilot.model.node import NodeConfigured
from pilot.model.sss import Job, Properties, Property, TaskGroup, effective_jobs
from pilot.scheduler.cluster import Cluster, MatchNode
from pilot.scheduler.distribution import JobRequest, Resources, SchedulingPass, release, resolve_job
from pilot.scheduler.matching import Matcher
from pilot.scheduler.placement import NodeSlots


@dataclass
class World:
    cluster: Cluster
    matcher: Matcher
    resources: Resources


def world(nodes: int, cores: int) -> World:
    cluster = Cluster()
    res = Resources({})
    for i in range(nodes):
        nc = NodeConfigured(
            name=f"n{i:05d}",
            hostname=f"n{i:05d}",
            processors=list(range(cores)),
            memory=256 * 2**30,
            features=["ib"] if i % 10 else [],  # one node in ten lacks the feature
        )
        cluster.nodes[nc.name] = MatchNode.from_configured(nc, cluster.registry)
        res.slots[nc.name] = NodeSlots.from_configured(nc)
    cluster.touch()
    return World(cluster, Matcher(cluster), res)


def task_request(w: World) -> JobRequest:
    job = Job(
        Properties.of(Property.of("Executable", "/bin/true")),
        [TaskGroup(Properties.of(Property.of("TaskCount", 1), Property.of("Feature", "ib")))],
    )
    return resolve_job(effective_jobs(job)[0], w.cluster)


def cached_pass(nodes: int, cores: int, queued: int) -> tuple[float, int, int]:
    """Seconds for one cached pass over ``queued`` tasks, tasks placed, node verdicts computed."""
    w = world(nodes, cores)
    req = task_request(w)
    t0 = time.process_time()
    sched = SchedulingPass(w.matcher, w.resources)
    placed = 0
    for i in range(queued):
        if sched.place(str(i), req) is not None:
            placed += 1
    return time.process_time() - t0, placed, w.matcher.evaluations


def baseline(nodes: int, cores: int, queued: int, window: int) -> tuple[float, bool]:
    """Seconds per task without the cache, and whether it is a windowed estimate."""
    if queued <= window * 4:
        w = world(nodes, cores)
        req = task_request(w)
        sched = SchedulingPass(w.matcher, w.resources, cache=False)
        t0 = time.process_time()
        for i in range(queued):
            sched.place(str(i), req)
        return (time.process_time() - t0) / queued, False
    samples = []
    for k in range(4):
        start = (queued * k) // 4
        w = world(nodes, cores)
        req = task_request(w)
        fill = SchedulingPass(w.matcher, w.resources)
        for i in range(start):
            if fill.place(str(i), req) is None:
                break
        sched = SchedulingPass(w.matcher, w.resources, cache=False)
        t0 = time.process_time()
        for i in range(window):
            sched.place(f"b{i}", req)
        samples.append((time.process_time() - t0) / window)
    return sum(samples) / len(samples), True


def drain(nodes: int, cores: int, queued: int) -> tuple[float, int]:
    """Seconds to run the whole queue through passes (placing, then releasing all), and passes."""
    w = world(nodes, cores)
    req = task_request(w)
    left = queued
    passes = 0
    t0 = time.process_time()
    while left:
        passes += 1
        sched = SchedulingPass(w.matcher, w.resources)
        running = []
        for i in range(left):
            p = sched.place(str(i), req)
            if p is None:
                break
            running.append((str(i), p))
        left -= len(running)
        for job_id, p in running:
            release(p, w.resources, job_id=job_id)
    return time.process_time() - t0, passes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--cores", type=int, default=64)
    ap.add_argument("--queued", type=int, nargs="+", default=[1000, 100_000])
    ap.add_argument("--window", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    med = statistics.median
    print(f"{args.nodes} nodes x {args.cores} cores = {args.nodes * args.cores} slots; identical 1-core tasks\n")
    head = (
        f"{'queued':>8} {'placed':>7} {'verdicts':>9} {'cached µs/task':>15} {'µs/placed':>10} "
        f"{'baseline µs/task':>17} {'speed-up':>9} {'drain µs/task':>14} {'passes':>6}"
    )
    print(head)
    print("-" * len(head))
    per_task: dict[int, float] = {}
    for q in args.queued:
        runs = [cached_pass(args.nodes, args.cores, q) for _ in range(args.repeat)]
        _, placed, verdicts = runs[0]
        cached_s = med(r[0] for r in runs)
        cached = cached_s / q * 1e6
        per_task[q] = cached
        bases = [baseline(args.nodes, args.cores, q, args.window) for _ in range(args.repeat)]
        base_us = med(b[0] for b in bases) * 1e6
        estimated = bases[0][1]
        drains = [drain(args.nodes, args.cores, q) for _ in range(args.repeat)]
        dsecs, passes = med(d[0] for d in drains), drains[0][1]
        mark = "~" if estimated else " "
        print(
            f"{q:>8} {placed:>7} {verdicts:>9} {cached:>15.2f} {cached_s / placed * 1e6:>10.2f} {mark}{base_us:>16.1f} "
            f"{base_us / cached:>8.0f}x {dsecs / q * 1e6:>14.2f} {passes:>6}"
        )
    if len(per_task) > 1:
        lo, hi = min(per_task), max(per_task)
        print(f"\nflatness: cached cost per task at {hi} queued / at {lo} queued = {per_task[hi] / per_task[lo]:.2f}")
    print("verdicts = node match verdicts computed by the cached pass (the baseline computes nodes x tasks)")


if __name__ == "__main__":
    main()

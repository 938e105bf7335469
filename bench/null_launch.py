"""The scheduler and the wire at a thousand nodes, on one machine: null (simulated) launches.

    python bench/null_launch.py [--nodes 1000] [--cores 64] [--tasks 100000] [--repeat 3]
                                [--nodes-per-agent 1000] [--duration 0] [--json FILE]

An embedded local pilot with ``allocation.launch = "null"``: agents take every order and report it
started and exited (after ``--duration`` seconds) without starting any process, and
``nodes_per_agent`` virtual nodes share one agent process (each its own socket, identity and
registration). ``--tasks`` one-core jobs go in through the client's ``submit_all()``; timed from the
call to the last final status. The figure is the daemon's CPU per task at ``--nodes`` nodes: what
scheduling, placing, ordering, journaling and forwarding a task costs end to end, with no task process
competing for the cpus. Baseline, in the same run, alternating: the same at 1 node of ``--cores``
cores. Also printed: tasks/s, client and agent CPU per task, the agents' and daemon's RSS, and the idle
CPU their heartbeats cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def null_config(*, nodes: int, cores: int, nodes_per_agent: int, duration: float) -> str:
    return (
        "[pilot]\nagent_start_timeout = 300\n"
        f'[allocation]\nlrm = "local"\nnodes = {nodes}\ncores_per_node = {cores}\nlaunch = "null"\n'
        f"null_duration = {duration}\nnodes_per_agent = {min(nodes_per_agent, nodes)}\n"
    )


def null_run(
    home: Path, *, nodes: int, cores: int, tasks: int, nodes_per_agent: int, duration: float, timeout: float = 600
) -> dict[str, Any]:
    """One embedded pilot with null launches: start it, wait for every agent, run ``tasks`` one-core
    jobs through ``submit_all``; returns the figures (see the module docstring)."""
    import psutil

    import client as psij
    from bench.throughput import embedded_daemon, warm_up

    cfg = home / f"null-{nodes}.toml"
    cfg.write_text(null_config(nodes=nodes, cores=cores, nodes_per_agent=nodes_per_agent, duration=duration))
    os.environ["PILOT_CONFIG"] = str(cfg)
    t_start = time.perf_counter()
    with psij.JobExecutor.get_instance("pilot") as ex:
        deadline = time.monotonic() + timeout
        while True:
            st = ex.pilot_status()
            if len(st["nodes"]) == nodes and all(x["agent"] == "active" for x in st["nodes"]):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(st['nodes'])} of {nodes} simulated agents registered after {timeout} s")
            time.sleep(0.1)
        up = time.perf_counter() - t_start
        daemon = psutil.Process(embedded_daemon()[0])
        agents = daemon.children()

        def cpu() -> tuple[float, float, float]:
            return (
                time.process_time(),
                sum(daemon.cpu_times()[:2]),
                sum(sum(a.cpu_times()[:2]) for a in agents),
            )

        warm_up(ex, None)
        c0 = cpu()
        time.sleep(2.0)
        c1 = cpu()
        idle = ((c1[1] - c0[1]) / 2.0, (c1[2] - c0[2]) / 2.0)
        jobs = [psij.Job(psij.JobSpec(executable="/bin/true")) for _ in range(tasks)]
        c0 = cpu()
        t0 = time.perf_counter()
        ex.submit_all(jobs)
        for job in jobs:
            left = max(0.0, deadline - time.monotonic())
            if job.wait(timeout=left) is None:
                raise TimeoutError(f"jobs not final after {timeout} s")
        wall = time.perf_counter() - t0
        c1 = cpu()
        failed = sum(1 for j in jobs if j.status.state is not psij.JobState.COMPLETED)
        rss_agents = sum(a.memory_info().rss for a in agents)
        rss_daemon = daemon.memory_info().rss
    return {
        "nodes": nodes,
        "cores_per_node": cores,
        "tasks": tasks,
        "agent_processes": len(agents),
        "up_s": up,
        "tasks_per_s": tasks / wall,
        "client_us_per_task": (c1[0] - c0[0]) / tasks * 1e6,
        "daemon_us_per_task": (c1[1] - c0[1]) / tasks * 1e6,
        "agent_us_per_task": (c1[2] - c0[2]) / tasks * 1e6,
        "idle_daemon_cpu": idle[0],
        "idle_agent_cpu": idle[1],
        "agent_rss": rss_agents,
        "daemon_rss": rss_daemon,
        "failed": failed,
    }


def compare(
    home: Path, *, nodes: int, cores: int, tasks: int, repeat: int, nodes_per_agent: int, duration: float
) -> dict[str, Any]:
    """``repeat`` alternating pairs: 1 node (baseline), then ``nodes`` nodes; medians."""
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "big": []}
    for i in range(repeat):
        for which, n in (("base", 1), ("big", nodes)):
            r = null_run(home, nodes=n, cores=cores, tasks=tasks, nodes_per_agent=nodes_per_agent, duration=duration)
            runs[which].append(r)
            print(
                f"  run {i + 1}, {n:>5} node(s): {r['tasks_per_s']:7.0f} tasks/s, us/task daemon "
                f"{r['daemon_us_per_task']:.0f} agent {r['agent_us_per_task']:.0f} client "
                f"{r['client_us_per_task']:.0f}; {r['agent_processes']} agent process(es), RSS "
                f"{r['agent_rss'] / 2**20:.0f} MiB; idle heartbeats: daemon {r['idle_daemon_cpu']:.0%} "
                f"agents {r['idle_agent_cpu']:.0%} of a cpu",
                file=sys.stderr,
            )
    med = {
        which: {k: statistics.median(r[k] for r in rs) for k in rs[0] if isinstance(rs[0][k], int | float)}
        for which, rs in runs.items()
    }
    return {"runs": runs, "median": med}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from bench.report import saved

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--cores", type=int, default=64, help="cores per simulated node")
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nodes-per-agent", type=int, default=1000, help="virtual nodes per agent process")
    ap.add_argument("--duration", type=float, default=0.0, help="seconds each simulated task lasts")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pilot-bench-null-") as home:
        os.environ["PILOT_HOME"] = home
        os.environ.pop("PILOT_NAME", None)
        out = compare(
            Path(home),
            nodes=args.nodes,
            cores=args.cores,
            tasks=args.tasks,
            repeat=args.repeat,
            nodes_per_agent=args.nodes_per_agent,
            duration=args.duration,
        )
    big, base = out["median"]["big"], out["median"]["base"]
    print(f"{'workload':<62}{'figure':>10}{'baseline':>10}{'ratio':>8}")
    label = f"{args.tasks} tasks, {args.nodes} sim. nodes x {args.cores} cores, daemon us/task"
    b, s = big["daemon_us_per_task"], base["daemon_us_per_task"]
    print(f"{label:<62}{b:>10.0f}{s:>10.0f}{b / s:>8.2f}")
    print(
        f"baseline = the same on 1 node; medians of {args.repeat} alternating runs; null launches "
        f"(nothing spawned); {big['tasks_per_s']:.0f} vs {base['tasks_per_s']:.0f} tasks/s; "
        f"{args.nodes} nodes in {big['agent_processes']:.0f} agent process(es), "
        f"RSS {big['agent_rss'] / 2**20:.0f} MiB"
    )
    return saved(out, args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()

"""Issue 24's scale row: 10,000 simulated nodes x 128 cores on one daemon (null launches).

    python bench/scale.py [--nodes 10000] [--cores 128] [--nodes-per-agent 1000] [--tasks 10000]
                          [--rounds 3] [--idle 10] [--json FILE]

An embedded local pilot with ``allocation.launch = "null"`` and ``nodes_per_agent`` virtual nodes per
agent process (10 processes for 10,000 nodes): their REGISTERs go in batches and their heartbeats as one
message per process. Printed: the time from starting the pilot until every node is registered; the
daemon's CPU while the nodes idle (heartbeats only) over ``--idle`` seconds, as a share of one cpu; and
the daemon's CPU per task for ``--tasks`` one-core null-launch jobs through ``submit_all`` at
``--nodes`` nodes (the median of ``--rounds`` such windows in the same pilot), next to the same on 1
node of ``--cores`` cores measured in the same run (the baseline). Targets: registered in <= 60 s;
idle <= 5 % of a cpu; per task within 20 % of 1 node.
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

TARGET_UP_S = 60.0
TARGET_IDLE = 0.05
TARGET_RATIO = 1.20


def scale_run(
    home: Path,
    *,
    nodes: int,
    cores: int,
    tasks: int,
    nodes_per_agent: int,
    idle: float,
    rounds: int = 3,
    timeout: float = 900,
) -> dict[str, Any]:
    """One embedded null-launch pilot: registration time, idle daemon CPU, daemon CPU per task (the
    median of ``rounds`` windows of ``tasks`` jobs each)."""
    import psutil

    import client as psij
    from bench.null_launch import null_config
    from bench.throughput import embedded_daemon, warm_up

    cfg = home / f"scale-{nodes}.toml"
    cfg.write_text(null_config(nodes=nodes, cores=cores, nodes_per_agent=nodes_per_agent, duration=0.0))
    os.environ["PILOT_CONFIG"] = str(cfg)
    t_start = time.perf_counter()
    # A status of 10,000 nodes while they register may take the daemon a while: no transient timeout.
    with psij.JobExecutor.get_instance("pilot", request_timeout=120) as ex:
        deadline = time.monotonic() + timeout
        while True:
            st = ex.pilot_status()
            active = sum(1 for x in st["nodes"] if x["agent"] == "active")
            if active == nodes:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{active} of {nodes} simulated nodes registered after {timeout} s")
            time.sleep(1.0)  # a status of every node costs the daemon: not too often
        up = time.perf_counter() - t_start
        daemon = psutil.Process(embedded_daemon()[0])
        agents = daemon.children()

        def daemon_cpu() -> float:
            return float(sum(daemon.cpu_times()[:2]))

        warm_up(ex, None)
        time.sleep(1.0)  # the warm job's last messages
        c0, t0 = daemon_cpu(), time.perf_counter()
        time.sleep(idle)
        idle_cpu = (daemon_cpu() - c0) / (time.perf_counter() - t0)
        per_task_runs: list[float] = []
        rates: list[float] = []
        failed = 0
        for _ in range(rounds):  # one pilot, several windows: a single one is at the mercy of a noisy second
            jobs = [psij.Job(psij.JobSpec(executable="/bin/true")) for _ in range(tasks)]
            c0, t0 = daemon_cpu(), time.perf_counter()
            ex.submit_all(jobs)
            for job in jobs:
                if job.wait(timeout=max(0.0, deadline - time.monotonic())) is None:
                    raise TimeoutError(f"jobs not final after {timeout} s")
            rates.append(tasks / (time.perf_counter() - t0))
            per_task_runs.append((daemon_cpu() - c0) / tasks * 1e6)
            failed += sum(1 for j in jobs if j.status.state is not psij.JobState.COMPLETED)
        rss = daemon.memory_info().rss
    return {
        "nodes": nodes,
        "cores_per_node": cores,
        "agent_processes": len(agents),
        "up_s": up,
        "idle_daemon_cpu": idle_cpu,
        "tasks": tasks,
        "rounds": rounds,
        "tasks_per_s": statistics.median(rates),
        "daemon_us_per_task": statistics.median(per_task_runs),
        "daemon_us_per_task_runs": per_task_runs,
        "daemon_rss": rss,
        "failed": failed,
    }


def compare(
    home: Path, *, nodes: int, cores: int, tasks: int, nodes_per_agent: int, idle: float, rounds: int = 3
) -> dict[str, Any]:
    """The baseline (1 node) first, then ``nodes`` nodes."""
    base = scale_run(home, nodes=1, cores=cores, tasks=tasks, nodes_per_agent=1, idle=idle, rounds=rounds)
    big = scale_run(
        home, nodes=nodes, cores=cores, tasks=tasks, nodes_per_agent=nodes_per_agent, idle=idle, rounds=rounds
    )
    for r in (base, big):
        print(
            f"  {r['nodes']:>6} node(s) in {r['agent_processes']} agent process(es): registered in {r['up_s']:.1f} s; "
            f"idle daemon {r['idle_daemon_cpu']:.1%} of a cpu; {r['daemon_us_per_task']:.0f} daemon us/task, "
            f"{r['tasks_per_s']:.0f} tasks/s (medians of {r['rounds']}: "
            f"{', '.join(f'{x:.0f}' for x in r['daemon_us_per_task_runs'])} us/task), {r['failed']} failed; "
            f"daemon RSS {r['daemon_rss'] / 2**20:.0f} MiB",
            file=sys.stderr,
        )
    return {"base": base, "big": big, "ratio": big["daemon_us_per_task"] / base["daemon_us_per_task"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from bench.report import saved

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--cores", type=int, default=128, help="cores per simulated node")
    ap.add_argument("--nodes-per-agent", type=int, default=1000, help="virtual nodes per agent process")
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3, help="windows of --tasks jobs per pilot (median reported)")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle heartbeats measured")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pilot-bench-scale-") as home:
        os.environ["PILOT_HOME"] = home
        os.environ.pop("PILOT_NAME", None)
        out = compare(
            Path(home),
            nodes=args.nodes,
            cores=args.cores,
            tasks=args.tasks,
            nodes_per_agent=args.nodes_per_agent,
            idle=args.idle,
            rounds=args.rounds,
        )
    big, base = out["big"], out["base"]
    label = f"{args.nodes:,} sim. nodes x {args.cores} cores, {big['agent_processes']} agent processes"
    print(f"{'scale: ' + label:<70}{'figure':>12}{'target':>12}{'met':>5}")
    rows = [
        ("all nodes registered", f"{big['up_s']:.1f} s", f"<= {TARGET_UP_S:.0f} s", big["up_s"] <= TARGET_UP_S),
        (
            f"daemon CPU while idle ({args.idle:g} s)",
            f"{big['idle_daemon_cpu']:.1%}",
            f"<= {TARGET_IDLE:.0%}",
            big["idle_daemon_cpu"] <= TARGET_IDLE,
        ),
        (
            f"daemon us/task, {args.rounds} x {args.tasks:,} tasks (1 node: {base['daemon_us_per_task']:.0f})",
            f"{out['ratio']:.2f} x",
            f"<= {TARGET_RATIO:.2f} x",
            out["ratio"] <= TARGET_RATIO,
        ),
    ]
    for what, figure, target, met in rows:
        print(f"  {what:<68}{figure:>12}{target:>12}{'yes' if met else 'no':>5}")
    return saved(out, args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()

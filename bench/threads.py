"""Where a task's CPU goes, thread by thread: this process (the client), the daemon, the agents, their helpers.

    python -m bench.threads [--tasks 2000] [--repeat 2] [--nodes 1] [--cores-per-node N]
                            [--agent-transport ipc|tcp] [--api submit_all|submit] [--json FILE]

An embedded local pilot, warmed, with every node's agent active; around each run of ``--tasks``
``/bin/true`` jobs, every thread of this process, the daemon, its agents and their spawn helpers is read
from ``/proc/<pid>/task/<tid>/``: its CPU and its time runnable but waiting for a cpu (``schedstat``),
and its voluntary and involuntary context switches (``status``). Each figure is per task, summed over
the threads of one kind of process that share a name (:mod:`pilot.thread_names` names the pilot's
threads; a trailing number -- a cpu, a worker -- is dropped, so that the chains of 16 agents add up).
Threads and helpers that start within a run are counted from the next (a spawner and its helper start
with their cpu's first order: the first run may miss some); the tasks themselves are not counted.
Voluntary switches count every wait: for input, for a wake-up, for the GIL. The runs are printed and
the last one's table kept (``--json``: all of them).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench.report import saved

#: (process kind, pid, tid) -> (thread name, [cpu ns, wait ns, voluntary switches, involuntary switches])
Sample = dict[tuple[str, int, int], tuple[str, list[int]]]


def processes() -> list[tuple[str, int]]:
    """(kind, pid) of this process, the embedded daemon, its agents and their spawn helpers, as they are
    now (a helper starts with its cpu's first order: read again at each sample)."""
    import psutil

    from bench.throughput import embedded_daemon, pilot_agents, spawn_helpers

    daemon = psutil.Process(embedded_daemon()[0])
    agents = pilot_agents(daemon)
    return [
        ("client", os.getpid()),
        ("daemon", daemon.pid),
        *(("agent", a.pid) for a in agents),
        *(("helper", h.pid) for h in spawn_helpers(agents)),
    ]


def sample() -> Sample:
    """Every thread of the pilot's processes (:func:`processes`) now: (kind, pid, tid) -> (name, [cpu ns,
    wait ns, voluntary, involuntary])."""
    out: Sample = {}
    for kind, pid in processes():
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}/"
            try:
                with open(base + "comm") as f:
                    name = f.read().strip()
                with open(base + "schedstat") as f:
                    cpu, wait = (int(x) for x in f.read().split()[:2])
                with open(base + "status") as f:
                    status = f.read()
            except OSError:
                continue  # (the thread ended meanwhile)
            vol = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
            invol = int(status.split("\nnonvoluntary_ctxt_switches:")[1].split()[0])
            out[(kind, pid, int(tid))] = (name, [cpu, wait, vol, invol])
    return out


def per_task(before: Sample, after: Sample, tasks: int) -> dict[str, dict[str, float]]:
    """``kind/name`` -> us of CPU, us waiting for a cpu, voluntary and involuntary switches, per task."""
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for key, (name, now) in after.items():
        was = before.get(key)
        if was is None:
            continue
        name = "forkserver" if key[0] == "helper" else re.sub(r"[-_/]?[0-9]+$", "", name)
        total = sums[f"{key[0]}/{name}"]
        for i in range(4):
            total[i] += now[i] - was[1][i]
    return {
        k: {
            "cpu_us": v[0] / 1e3 / tasks,
            "wait_us": v[1] / 1e3 / tasks,
            "voluntary": v[2] / tasks,
            "involuntary": v[3] / tasks,
        }
        for k, v in sorted(sums.items())
        if v[0] or v[2] or v[3]
    }


def render(rows: dict[str, dict[str, float]]) -> str:
    lines = [f"{'process/thread':<28} {'cpu us':>8} {'wait us':>8} {'vol':>7} {'invol':>7}   (per task)"]
    kinds: dict[str, float] = defaultdict(float)
    for name, r in rows.items():
        kinds[name.split("/", 1)[0]] += r["cpu_us"]
        if r["cpu_us"] >= 0.05:
            lines.append(
                f"{name:<28} {r['cpu_us']:8.1f} {r['wait_us']:8.1f} {r['voluntary']:7.3f} {r['involuntary']:7.3f}"
            )
    lines.append("cpu us per task by process: " + ", ".join(f"{k} {v:.1f}" for k, v in kinds.items()))
    lines.append("(the client's 'python' thread is this process's main thread: the harness's submits and waits)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=1, help="virtual nodes of the embedded pilot")
    ap.add_argument("--cores-per-node", type=int, help="declared cores per node (default: the machine's cpus)")
    ap.add_argument("--agent-transport", choices=["ipc", "tcp"], default="ipc")
    ap.add_argument("--api", choices=["submit_all", "submit"], default="submit_all")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)

    from bench.suite import local_config, pilot
    from bench.throughput import pilot_rate

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pilot-bench-") as home:
        os.environ["PILOT_HOME"] = home
        config = local_config(
            nodes=args.nodes, cores_per_node=args.cores_per_node, agent_transport=args.agent_transport
        )
        with pilot(Path(home), "threads", config, nodes=args.nodes) as ex:
            for i in range(args.repeat):
                before = sample()
                rate, failed = pilot_rate(ex, args.tasks, timeout=max(120.0, args.tasks / 50), api=args.api)
                after = sample()
                rows = per_task(before, after, args.tasks)
                # The processes counted: those seen both before and after the run, by kind.
                counted = Counter(kind for kind, _ in {(k[0], k[1]) for k in after if k in before})
                runs.append({"tasks_per_s": rate, "failed": failed, "threads": rows, "processes": dict(counted)})
                print(f"run {i + 1}: {rate:,.0f} tasks/s, {failed} failed", file=sys.stderr)
    print(render(runs[-1]["threads"]))
    return saved({"runs": runs}, args)


if __name__ == "__main__":
    main()

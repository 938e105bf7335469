"""End-to-end throughput of short tasks through the PSI/J client vs this machine's raw spawn rate.

    python bench/throughput.py [--tasks 2000] [--repeat 3] [--nodes 1] [--api all] [--json FILE]

Baseline: ``Popen('/bin/true')`` + ``wait`` from 2 threads, nothing else. Pilot: the same number of
``/bin/true`` jobs submitted through ``client.JobExecutor`` to an embedded local pilot, timed from the
first submit to the last final state (pilot start-up excluded, one warm-up job first), the way a
workflow engine with thousands of jobs at hand submits them: ``submit_all(jobs)`` (PSI/J's bulk
submit); ``--api submit`` times the plain PSI/J loop, ``for j in jobs: ex.submit(j)`` then ``j.wait()``
each, on a default executor, and ``--api roundtrip`` the same loop on an executor that waits for each
submit's answer (``pipelined=False``). ``--api all`` (the default) times each. Runs alternate so that
machine noise hits all; medians and their ratio are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def raw_spawn_rate(
    n: int, threads: int = 2, *, cpu: dict[str, float] | None = None, argv: tuple[str, ...] = ("/bin/true",)
) -> float:
    """Tasks/s for n Popen+wait of ``argv`` (default /bin/true) spread over ``threads`` threads. ``cpu``,
    if given, gets the CPU µs per spawn of this process (``parent``: Popen, wait) and of the children
    (``task``: the processes' own exec, run and exit)."""
    import resource

    per = [n // threads + (1 if i < n % threads else 0) for i in range(threads)]

    def work(k: int) -> None:
        for _ in range(k):
            subprocess.Popen(argv).wait()

    ts = [threading.Thread(target=work, args=(k,)) for k in per]
    self0, kids0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    rate = n / (time.perf_counter() - t0)
    self1, kids1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu["parent"] = (self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime) / n * 1e6
        cpu["task"] = (kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime) / n * 1e6
    return rate


#: How the jobs go in: one ``submit_all``; one ``submit`` per job on a default executor, then ``wait()``
#: each; one ``submit`` per job on an executor that waits for each answer (``pipelined=False``).
APIS = ("submit_all", "submit", "roundtrip")


def executor_for(ex: Any, api: str) -> Any:
    """The executor ``api`` is measured with: ``ex`` itself (a default one), or for ``roundtrip`` one of
    the same pilot that waits for each submit's answer (close it after use)."""
    import client as psij

    if api != "roundtrip":
        return ex
    return psij.JobExecutor.get_instance("pilot", url=ex.url, pipelined=False)


def wait_agents(ex: Any, nodes: int, timeout: float) -> float:
    """Seconds until the agents of all ``nodes`` nodes are active (TimeoutError beyond ``timeout``). A
    pilot's first job ends once one agent is up; the others may still be starting (their imports and
    registration), which a timed run must not count as the cost of its tasks."""
    t0 = time.perf_counter()
    while True:
        st = ex.pilot_status()
        if len(st["nodes"]) == nodes and all(x["agent"] == "active" for x in st["nodes"]):
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            active = sum(x["agent"] == "active" for x in st["nodes"])
            raise TimeoutError(f"{active} of {nodes} nodes' agents active after {timeout:.0f} s")
        time.sleep(0.2)


def warm_up(ex: Any, nodes: int | None) -> None:
    """One ``/bin/true`` job through a fresh pilot (its first job pays for start-up), then, unless
    ``nodes`` is None, :func:`wait_agents` for all its nodes."""
    import client as psij

    warm = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(warm)
    warm.wait(timeout=60)
    if nodes is not None:
        wait_agents(ex, nodes, timeout=120)


def pilot_rate(
    ex: object, n: int, spec: object = None, timeout: float | None = None, *, api: str = "submit_all"
) -> tuple[float, int]:
    """Tasks/s for n jobs (``spec``, default /bin/true) through the client; returns (rate, failures).

    ``api``: ``submit_all`` (one bulk call, as a workflow engine with the jobs at hand does), ``submit``
    (one call per job, then ``wait()`` each: the plain PSI/J loop) or ``roundtrip`` (one call per job on
    an executor that waits for each answer, see :func:`executor_for`). ``timeout``: seconds to wait for
    all final states (TimeoutError beyond); None waits forever."""
    import client as psij

    assert isinstance(ex, psij.JobExecutor)
    assert ex.pipelined == (api != "roundtrip"), (
        f"the {api} runs need {'no' if api == 'roundtrip' else 'a'} pipelined executor"
    )
    # One wake-up when the last job ends (not one per job: the harness must not eat the cpus it measures).
    done = threading.Event()
    lock = threading.Lock()
    counts = {"final": 0, "failed": 0}

    def cb(job: psij.Job, status: psij.JobStatus) -> None:
        if status.final:
            with lock:
                counts["final"] += 1
                if status.state is not psij.JobState.COMPLETED:
                    counts["failed"] += 1
                if counts["final"] == n:
                    done.set()

    ex.set_job_status_callback(cb)
    if spec is None:
        spec = psij.JobSpec(executable="/bin/true")
    assert isinstance(spec, psij.JobSpec)
    if api not in APIS:
        raise ValueError(f"api must be one of {APIS}, not {api!r}")
    t0 = time.perf_counter()
    deadline = None if timeout is None else t0 + timeout
    jobs = [psij.Job(spec) for _ in range(n)]
    if api == "submit_all":
        ex.submit_all(jobs)
    else:
        for j in jobs:
            ex.submit(j)
    if api == "submit":
        for j in jobs:
            j.wait(timeout=None if deadline is None else max(0.0, deadline - time.perf_counter()))
    left = None if deadline is None else max(0.0, deadline - time.perf_counter())
    if not done.wait(timeout=left):
        ex.set_job_status_callback(None)
        raise TimeoutError(f"{n - counts['final']} of {n} jobs not final after {timeout} s")
    rate = n / (time.perf_counter() - t0)
    ex.set_job_status_callback(None)
    return rate, counts["failed"]


def embedded_daemon() -> tuple[int, str]:
    """The pid and run directory of this process's embedded pilot's daemon (each embedded pilot has a
    run directory of its own: client/_embedded.py)."""
    from client import _embedded

    rundir = _embedded.running()
    info = None if rundir is None else rundir.read_info()
    if rundir is None or info is None:
        raise RuntimeError("no embedded pilot runs in this process (or its pilot.json is gone)")
    return int(info["pid"]), str(rundir.path)


def pilot_agents(daemon: Any) -> list[Any]:
    """The agent processes of ``daemon`` (a psutil process)."""
    import psutil

    agents = []
    for child in daemon.children():
        try:
            if "agent" in " ".join(child.cmdline()):
                agents.append(child)
        except psutil.Error:
            continue  # (gone meanwhile)
    return agents


def spawn_helpers(agents: list[Any]) -> list[Any]:
    """The spawn helpers of ``agents`` now (agent.forkserver): each spawner starts its own with its cpu's
    first order, so a pilot gains some after its warm-up. A chained helper reaps its tasks itself."""
    import psutil

    helpers = []
    for agent in agents:
        try:
            children = agent.children()
        except psutil.Error:
            continue
        for child in children:
            try:
                if os.path.basename(child.cmdline()[0]).startswith("forkserver-"):
                    helpers.append(child)
            except (psutil.Error, IndexError):
                continue
    return helpers


class CpuMeter:
    """CPU seconds (user + system) of this process, the embedded daemon, its agents with their spawn
    helpers, and the tasks (the children that the agents and their helpers reaped: their times): where
    each task's cost goes, a figure much less sensitive to a busy machine than tasks/s."""

    def __init__(self, home: Path) -> None:
        import psutil

        self._daemon = psutil.Process(embedded_daemon()[0])
        self._agents = pilot_agents(self._daemon)

    def read(self) -> dict[str, float]:
        def cpu(procs: list[Any]) -> float:
            return sum(sum(p.cpu_times()[:2]) for p in procs)

        def tasks(procs: list[Any]) -> float:
            return sum(sum(p.cpu_times()[2:4]) for p in procs)

        helpers = spawn_helpers(self._agents)
        return {
            "client": time.process_time(),
            "daemon": cpu([self._daemon]),
            "agent": cpu(self._agents) + cpu(helpers),
            "tasks": tasks(self._agents) + tasks(helpers),
        }


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=1, help="virtual nodes of the embedded pilot")
    ap.add_argument("--cores-per-node", type=int, help="declared cores per virtual node (default: the machine's cpus)")
    ap.add_argument(
        "--agent-transport",
        choices=["ipc", "tcp"],
        default="ipc",
        help="tcp: agents over CURVE-encrypted, authenticated TCP (security on)",
    )
    ap.add_argument(
        "--api",
        choices=[*APIS, "all"],
        default="all",
        help="submit_all: one bulk call; submit: the plain loop on a default executor; roundtrip: the loop on "
        "an executor that waits for each answer; all (default): each, alternating",
    )
    ap.add_argument("--backlog", type=int, help="pilot.backlog of the embedded pilot (default: the pilot's)")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    apis = list(APIS) if args.api == "all" else [args.api]

    import client as psij

    with tempfile.TemporaryDirectory(prefix="pilot-bench-") as home:
        os.environ["PILOT_HOME"] = home
        cfg = Path(home) / "bench.toml"
        cfg.write_text(
            f'[pilot]\nagent_transport = "{args.agent_transport}"\n'
            + (f"backlog = {args.backlog}\n" if args.backlog is not None else "")
            + f'[allocation]\nlrm = "local"\nnodes = {args.nodes}\n'
            + (f"cores_per_node = {args.cores_per_node}\n" if args.cores_per_node is not None else "")
        )
        os.environ["PILOT_CONFIG"] = str(cfg)
        with psij.JobExecutor.get_instance("pilot") as ex:
            warm_up(ex, args.nodes)
            exes = {api: executor_for(ex, api) for api in apis}
            meter = CpuMeter(Path(home))
            raw: list[float] = []
            raw_cpu: dict[str, list[float]] = {}
            pil: dict[str, list[float]] = {api: [] for api in apis}
            cpu: dict[str, dict[str, list[float]]] = {api: {} for api in apis}
            failures = 0
            for i in range(args.repeat):
                spent: dict[str, float] = {}
                raw.append(raw_spawn_rate(args.tasks, cpu=spent))
                for who, v in spent.items():
                    raw_cpu.setdefault(who, []).append(v)
                line = f"  run {i + 1}: raw {raw[-1]:6.0f}/s (cpu us/spawn: parent {spent['parent']:.0f}"
                line += f" task {spent['task']:.0f})"
                for api in apis:
                    before = meter.read()
                    rate, failed = pilot_rate(exes[api], args.tasks, api=api)
                    after = meter.read()
                    for who in before:
                        cpu[api].setdefault(who, []).append((after[who] - before[who]) / args.tasks * 1e6)
                    pil[api].append(rate)
                    failures += failed
                    us = " ".join(f"{who} {v[-1]:.0f}" for who, v in cpu[api].items())
                    line += f"  | {api}() {rate:6.0f}/s ratio {rate / raw[-1]:.2f}, cpu us/task: {us}"
                print(line, file=sys.stderr)
            for other in exes.values():
                if other is not ex:
                    other.close()
    r = statistics.median(raw)
    med = {api: statistics.median(v) for api, v in pil.items()}
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cpus, {sys.platform}, Python {sys.version.split()[0]}",
        "tasks": args.tasks,
        "repeat": args.repeat,
        "nodes": args.nodes,
        "agent_transport": args.agent_transport,
        "raw_spawn_per_s": raw,
        "pilot_per_s": pil,
        "median_raw_spawn_per_s": r,
        "median_pilot_per_s": med,
        "ratio": {api: p / r for api, p in med.items()},
        "cpu_us_per_task": cpu,
        "raw_cpu_us_per_spawn": raw_cpu,
        "median_cpu_us_per_task": {api: {w: statistics.median(v) for w, v in c.items()} for api, c in cpu.items()},
        "failures": failures,
    }
    print(f"{'workload':<56}{'figure':>10}{'baseline':>10}{'ratio':>8}")
    for api, p in med.items():
        label = f"{args.tasks} x /bin/true, {api}() (tasks/s)"
        us = ", ".join(f"{w} {statistics.median(v):.0f}" for w, v in cpu[api].items())
        print(f"{label:<56}{p:>10.0f}{r:>10.0f}{p / r:>8.2f}   cpu us/task: {us}")
    ncpu = len(os.sched_getaffinity(0))
    raw_total = sum(statistics.median(v) for v in raw_cpu.values())
    print(
        f"baseline = raw spawn rate, Popen from 2 threads; medians of {args.repeat} alternating runs; "
        f"{failures} failed tasks"
    )
    print(
        f"raw spawn: cpu us/spawn parent {statistics.median(raw_cpu['parent']):.0f}, task "
        f"{statistics.median(raw_cpu['task']):.0f}; {ncpu} cpus kept {r * raw_total / 1e6 / ncpu:.0%} busy"
    )
    for api in apis:
        total = sum(statistics.median(v) for v in cpu[api].values())
        print(
            f"{api}(): {total:.0f} cpu us/task in all (the tasks' own share above); {ncpu} cpus kept "
            f"{med[api] * total / 1e6 / ncpu:.0%} busy; at 100% the same cost per task would give "
            f"{ncpu / total * 1e6:.0f} tasks/s (ratio {ncpu / total * 1e6 / r:.2f})"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()

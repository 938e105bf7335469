"""The agent's CPU per task, measured in this one process: its own code, spawning real processes.

    python -m bench.agent_cost [--tasks 5000] [--cores 2] [--window 128] [--launch spawn] [--repeat 5]

A real :class:`agent.agent.Agent` (its loop thread, spawners, spawn helpers, reaper) runs in a thread of
this process and gets its orders from this process's main thread, which plays the daemon on a ROUTER
socket over inproc: it answers the REGISTER and keeps ``--window`` orders per core at the agent, the
first on the core and the rest placed behind it (``after_cores``), each a ``/bin/true`` order as the
daemon sends it; each TASK_EVENTS frame's exits are answered with one LAUNCH of as many new orders.
The default window is the daemon's own at full rate (``pilot.backlog``, 128 behind a busy core);
``--window 1`` is the round trip's regime, one order at a time per core.

The agent's CPU is this process's CPU time less the main thread's (the tasks are other processes: not
counted); the spawn helpers' own CPU is given apart (``helpers``, read just before they end).
``--launch null`` times the agent without processes (its loop, the decoding and the events). Under
cachegrind the count includes the main thread's part; how the agent's
turns batch the exits depends on timing, so counts repeat to a few per cent, not as closely as
``bench.daemon_cost``'s (see its docstring for the method: the difference of two runs' 'I refs')::

    PYTHONHASHSEED=0 valgrind --tool=cachegrind --cache-sim=no python -m bench.agent_cost --tasks 3000 --repeat 1

Valgrind (3.19 here) has no ``pidfd_open``: under it the agent takes its fallback path (a helper request
per task and the reaper's ``wait4``), not the chained helpers it uses natively, and its loop's timed
holds fire at valgrind's pace; counts taken so describe that path.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import zmq

from bench.report import repeated, saved
from pilot.model.node import NodeConfigured
from pilot.model.process_order import ProcessOrder
from pilot.wire.messages import (
    TO_DAEMON_FROM_AGENT,
    Launch,
    Register,
    Registered,
    Stop,
    TaskEvents,
    decode,
    encode,
)

_URL = "inproc://bench-agent"


def _order(job: int, core: int, *, behind: bool, directory: str) -> dict[str, Any]:
    """A ``/bin/true`` order as the daemon sends it for a default PSI/J job (its own wire form)."""
    jid = str(job)
    return ProcessOrder(
        job_id=jid,
        slot=0,
        role="rank",
        executable="/bin/true",
        directory=directory,
        cores=[core],
        walltime=600.0,
        rank_environment={"PILOT_JOB_ID": jid, "PILOT_RANK": "0", "PILOT_SIZE": "1"},
        nodefile_hosts=["local-0"],
        after_cores=behind,
    ).to_wire()


class Harness:
    """One agent in a thread of this process; this thread is its daemon."""

    def __init__(self, home: Path, *, cores: int, launch: str = "spawn") -> None:
        from agent.agent import Agent

        self.home = home
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(_URL)
        node = NodeConfigured(name="local-0", hostname="local-0", processors=list(range(cores)), memory=8 << 30)
        self.agent = Agent(daemon_url=_URL, node=node, workdir=home, context=self.ctx, launch=launch)
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run_agent, name="agent", daemon=True)
        self.thread.start()
        frames = self._recv(timeout=30.0)
        if frames is None or not isinstance(decode(frames[1], TO_DAEMON_FROM_AGENT), Register):
            raise RuntimeError("the agent in this process did not register")
        self.identity = frames[0]
        self.router.send_multipart([self.identity, encode(Registered(3600.0))])

    def _run_agent(self) -> None:
        try:
            anyio.run(self.agent.run)
        except BaseException as exc:  # reported by run()
            self.failure = exc

    def _recv(self, *, timeout: float) -> list[bytes] | None:
        if not self.router.poll(int(timeout * 1000)):
            return None
        return self.router.recv_multipart()

    def run(self, tasks: int, cores: int, window: int) -> int:
        """``tasks`` orders through the agent; how many it reported exited with code 0."""
        directory = str(self.home)
        sent = 0
        ok = 0
        done = 0
        core_of: dict[str, int] = {}  # each order's core, until its exit frees it

        def launch(slots: list[tuple[int, bool]]) -> None:
            nonlocal sent
            orders = []
            for core, behind in slots:
                if sent < tasks:
                    sent += 1
                    orders.append(_order(sent, core, behind=behind, directory=directory))
                    core_of[str(sent)] = core
            if orders:
                self.router.send_multipart([self.identity, Launch.frame(orders)])

        launch([(c, w > 0) for w in range(window) for c in range(cores)])
        while done < tasks:
            frames = self._recv(timeout=30.0)
            if frames is None:
                raise RuntimeError(f"the agent in this process reported {done} of {tasks} exits, then nothing more")
            m = decode(frames[1], TO_DAEMON_FROM_AGENT)
            if not isinstance(m, TaskEvents):
                continue
            freed = []
            for ev in m.events:
                if ev.kind == "exited":
                    done += 1
                    ok += ev.data.get("exit_code") == 0
                    freed.append(core_of.pop(ev.job_id))
            launch([(c, window > 1) for c in freed])
        return ok

    def close(self) -> None:
        self.router.send_multipart([self.identity, encode(Stop("bench over"))])
        self.thread.join(timeout=30.0)
        self.router.close(linger=0)
        self.ctx.term()
        if self.failure is not None:
            raise RuntimeError("the agent in this process failed") from self.failure


def _helpers_cpu() -> float:
    """CPU seconds of this process's spawn helpers (all started by the harness's agent)."""
    import psutil

    from bench.throughput import spawn_helpers

    total = 0.0
    for helper in spawn_helpers([psutil.Process()]):
        try:
            total += sum(helper.cpu_times()[:2])
        except psutil.Error:
            continue
    return total


def measure(*, tasks: int, cores: int, window: int, launch: str = "spawn") -> dict[str, Any]:
    """One fresh agent: ``tasks`` orders through it; its CPU per task (µs) and how many exited 0."""
    from pilot.collector import collect_rarely
    from pilot.logs import configure

    with tempfile.TemporaryDirectory(prefix="agent-cost-") as home:
        with open(Path(home) / "agent.log", "w") as log:
            configure(level="info", stream=log, json=True)
            collect_rarely()
            h = Harness(Path(home), cores=cores, launch=launch)
            try:
                p0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
                ok = h.run(tasks, cores, window)
                p1, t1, w1 = time.process_time(), time.thread_time(), time.perf_counter()
                helpers = _helpers_cpu()
            finally:
                h.close()
    return {
        "us_per_task": ((p1 - p0) - (t1 - t0)) / tasks * 1e6,
        "helpers_us_per_task": helpers / tasks * 1e6,
        "harness_us_per_task": (t1 - t0) / tasks * 1e6,
        "tasks_per_s": tasks / (w1 - w0),
        "exited_ok": ok,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=5000)
    ap.add_argument("--cores", type=int, default=2, help="the node's cores (this machine's cpus, at most)")
    ap.add_argument("--window", type=int, default=128, help="orders per core with the agent at once")
    ap.add_argument("--launch", choices=["spawn", "null"], default="spawn", help="null: no process (the loop alone)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    if not 1 <= args.cores <= len(os.sched_getaffinity(0)):
        ap.error(f"--cores must be between 1 and this machine's {len(os.sched_getaffinity(0))} cpus")
    if args.window < 1:
        ap.error("--window must be at least 1")
    out = repeated(
        lambda: measure(tasks=args.tasks, cores=args.cores, window=args.window, launch=args.launch),
        repeat=args.repeat,
        whose="agent",
        each=lambda r: (
            f"agent {r['us_per_task']:.1f} µs/task, helpers {r['helpers_us_per_task']:.1f},"
            f" harness {r['harness_us_per_task']:.1f},"
            f" {r['tasks_per_s']:.0f} tasks/s"
        ),
    )
    return saved(out, args)


if __name__ == "__main__":
    main()

"""The daemon's CPU per task, measured in this one process: its own code, on its real sockets and journal.

    python -m bench.daemon_cost [--tasks 20000] [--batch 1000] [--nodes 1] [--cores 64] [--repeat 5]

A real :class:`pilot.daemon.Daemon` (journal, core, codec, delivery to clients, the 'job ended' log
lines) is fed what a client and its agents send, from DEALER sockets in this process over inproc: SUBMIT
frames of ``/bin/true`` PSI/J jobs as the client encodes them, with submit ids as every default executor
mints them, and for each LAUNCH an agent gets, one TASK_EVENTS frame with each order's exit as
``agent.processes`` reports it. Each turn of the daemon (``Daemon.turn``, and the journal checkpoint
when one is due, which the daemon runs in a worker thread) is timed by this thread's CPU clock;
ZeroMQ's I/O thread is not counted. Nothing else runs meanwhile: no task, agent process or client
competes for the cpus, so a change of a few per cent in the daemon's own cost shows through the
noise the end-to-end rows (``bench/null_launch.py``) carry. Prints each run and the median of
``--repeat`` runs, each on a fresh daemon and journal.

Each round is the same from run to run (inproc delivers a frame as it is sent), so under cachegrind
the instructions per task -- the difference of two runs, 1,000 and 3,000 tasks, PYTHONHASHSEED=0 --
repeat to a few hundredths of a per cent, where CPU time on a shared VM varies by tens of per cent:

    PYTHONHASHSEED=0 valgrind --tool=cachegrind --cache-sim=no python -m bench.daemon_cost --tasks 3000 --repeat 1

(its 'I refs', less those of the same with ``--tasks 1000``, over 2,000).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import zmq

from bench.report import repeated, saved
from pilot import config as config_mod
from pilot import wire
from pilot.allocations import PilotAllocation
from pilot.lrm.base import Allocation, AllocationState
from pilot.model.job_state import JobState
from pilot.model.node import NodeConfigured
from pilot.rundir import RunDir
from pilot.wire import Kind
from pilot.wire.messages import Register, Submit, TaskEvent, TaskEvents, encode


def _description() -> dict[str, Any]:
    """A ``/bin/true`` job as the PSI/J client puts it on the wire."""
    import client as psij
    from client._translate import spec_to_wire

    return spec_to_wire(psij.JobSpec(executable="/bin/true"))


def exited(order: dict[str, Any], now: float) -> TaskEvent:
    """The exit event an agent sends for a short task that ran ``order`` (its start carried along)."""
    data = {
        "pid": 4242,
        "started": now - 0.001,
        "exit_code": 0,
        "signal": None,
        "wall_duration": 0.001,
        "user_cpu_time": 0.0004,
        "system_cpu_time": 0.0003,
        "max_rss": 1 << 20,
        "processors": len(order.get("cores", [])),
        "reason": None,
    }
    return TaskEvent(order["job_id"], order["slot"], "exited", now, data)


class Harness:
    """One daemon in this process, with a client and ``nodes`` agents as sockets of this process."""

    def __init__(self, home: Path, *, nodes: int, cores: int, pilot: dict[str, Any] | None = None) -> None:
        from pilot.daemon import Daemon

        raw = {"pilot": pilot or {}, "allocation": {"lrm": "local", "nodes": nodes, "cores_per_node": cores}}
        cfg = config_mod.parse(raw, source="<bench.daemon_cost>")
        self.daemon = d = Daemon(config=cfg, rundir=RunDir(home / "run"), embedded=True)
        d.rundir.create()
        anyio.run(d._open_journal)
        site = d.allocations.sites[0]
        now = time.time()
        alloc = Allocation(
            native_id="bench", lrm="local", state=AllocationState.ACTIVE, nodes=nodes, submitted=now, started=now
        )
        d.allocations.held["a1"] = PilotAllocation("a1", site, alloc)
        # inproc: a frame sent is at its peer when send returns, so every turn has the same input, run
        # after run (and under valgrind), with no wait for an I/O thread to carry it.
        d.endpoints.clients.bind("inproc://bench-clients")
        d.endpoints.agents.bind("inproc://bench-agents")
        ctx = d.endpoints.ctx
        self.client = ctx.socket(zmq.DEALER)
        self.client.setsockopt(zmq.ROUTING_ID, b"bench-client")
        self.client.connect("inproc://bench-clients")
        self.agents: dict[str, zmq.Socket[bytes]] = {}
        self.seq: dict[str, int] = {}
        for i in range(nodes):
            name = f"local-{i}"
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.ROUTING_ID, name.encode())
            sock.connect("inproc://bench-agents")
            self.agents[name] = sock
            self.seq[name] = 0
            node = NodeConfigured(name=name, hostname=name, processors=list(range(cores)), memory=64 << 30)
            sock.send(encode(Register(node, values={})))
        self.cpu = 0.0  # the daemon's turns, thread CPU seconds
        self.turns = 0
        self._turn()
        if len(d.core.nodes.agents) != nodes:
            raise RuntimeError(f"the daemon in this process registered {len(d.core.nodes.agents)} of {nodes} agents")
        for sock in self.agents.values():
            while sock.poll(0):
                sock.recv()  # REGISTERED

    def _turn(self) -> None:
        """One turn of the daemon (Daemon.turn: its I/O loop without the wait), timed."""
        from pilot.daemon import CHECKPOINT_LOOK

        d = self.daemon
        t0 = time.thread_time()
        d.turn()
        store = d.store
        # As often as the daemon looks at the WAL (there in a worker thread, which Daemon.turn cannot start).
        if store is not None and store.commits % CHECKPOINT_LOOK == 0 and store.checkpoint_due():
            store.checkpoint()
        self.cpu += time.thread_time() - t0
        self.turns += 1

    def run(self, tasks: int, batch: int) -> None:
        from client._requests import SubmitIds

        description = _description()
        submit_ids = SubmitIds()
        d = self.daemon
        book = d.core.book
        sent = 0
        rid = 0
        done = 0
        idle = 0  # turns in a row that ended no job
        while done < tasks:
            if idle > 100:
                raise RuntimeError(f"the daemon in this process ended {done} of {tasks} jobs, then nothing more")
            if sent < tasks and book.unfinished() < 2 * batch:
                n = min(batch, tasks - sent)
                rid += 1
                ids: list[str | None] = list(submit_ids.take(n))
                self.client.send(encode(Submit(rid, [description] * n, ids)))
                sent += n
            for name, sock in self.agents.items():
                now = time.time()
                events = []
                while sock.poll(0):
                    events += [exited(o, now) for o in launch_orders(sock.recv())]
                if events:
                    self.seq[name] += 1
                    sock.send(encode(TaskEvents(tuple(events), self.seq[name])))
            self._turn()
            ended = 0
            while self.client.poll(0):
                ended += _finals(self.client.recv())
            done += ended
            idle = 0 if ended else idle + 1

    def close(self) -> None:
        for sock in (self.client, *self.agents.values()):
            sock.close(linger=0)
        if self.daemon.store is not None:
            self.daemon.store.close()
        self.daemon.endpoints.close()


def launch_orders(frame: bytes) -> list[dict[str, Any]]:
    """The orders of a LAUNCH frame, in their wire form (as an agent reads its frames: checked)."""
    m = wire.decode(frame, allowed=wire.TO_AGENT_KINDS)
    return list(m.body.get("orders", [])) if m.kind == Kind.LAUNCH else []


def _finals(frame: bytes) -> int:
    """How many final statuses a frame to the client carries."""
    m = wire.decode(frame, allowed=wire.TO_CLIENT_KINDS)
    if m.kind != Kind.EVENTS:
        return 0
    return sum(1 for s in m.body.get("events", []) if JobState(s[1]).final)


def measure(*, tasks: int, batch: int, nodes: int, cores: int) -> dict[str, Any]:
    """One fresh daemon: ``tasks`` jobs through it; its CPU per task (µs), its turns, and how many jobs
    it ended COMPLETED and logged as ended."""
    from pilot.collector import collect_rarely
    from pilot.logs import configure

    with tempfile.TemporaryDirectory(prefix="daemon-cost-") as home:
        log = open(Path(home) / "daemon.log", "w")  # the 'job ended' lines, written as the daemon writes them
        try:
            configure(level="info", stream=log, json=True)
            collect_rarely()
            h = Harness(Path(home), nodes=nodes, cores=cores)
            try:
                h.cpu, h.turns = 0.0, 0
                h.run(tasks, batch)
                completed = h.daemon.core.book.counts[JobState.COMPLETED]
            finally:
                h.close()
        finally:
            log.close()
        ended = sum(1 for line in (Path(home) / "daemon.log").read_text().splitlines() if '"job ended"' in line)
    return {"us_per_task": h.cpu / tasks * 1e6, "turns": h.turns, "completed": completed, "logged_ended": ended}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=1000, help="jobs per SUBMIT frame")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--cores", type=int, default=64, help="cores per node")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    out = repeated(
        lambda: measure(tasks=args.tasks, batch=args.batch, nodes=args.nodes, cores=args.cores),
        repeat=args.repeat,
        whose="daemon",
        each=lambda r: f"daemon {r['us_per_task']:.1f} µs/task, {r['turns']} turns",
    )
    return saved(out, args)


if __name__ == "__main__":
    os.environ.setdefault("PILOT_HOME", tempfile.gettempdir())
    main()

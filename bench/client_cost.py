"""The PSI/J client's CPU per lone job, measured in this one process: its own code, on its real socket.

    python -m bench.client_cost [--jobs 2000] [--warm 50] [--repeat 3] [--pause 0.001] [--json FILE]

The round-trip row (``bench/suite.py``'s ``w_roundtrip``) one job at a time: a default executor (of the
'pilot' kind, pipelined) with a status callback set submits ``JobSpec('/bin/true')`` and waits for its
COMPLETED callback, then the next. The daemon is played by this process's main thread on a ROUTER
socket of a ZeroMQ context of its own, over ``ipc://``: it reads each frame the client sends as the
daemon reads it (checked), leases job ids as the daemon does, answers each SUBMIT with its results,
then, once the client has delivered the job's QUEUED, sends the job's COMPLETED as the daemon sends a
``/bin/true``'s: one EVENTS frame whose Delivered carries the task's start, from which the client
synthesises ACTIVE. Between steps it pauses (``--pause``) so that the client's threads are idle when
the next frame comes, as in the round trip, where the daemon takes a millisecond or two.

The client's CPU per job is that of its threads -- its two workers and the ZeroMQ threads of its
context (``/proc/self/task/<tid>/schedstat``) -- plus the main thread's while it makes the Job and
calls ``submit()``; the stand-in's own work is not counted. Nothing else runs, so a change of a few
per cent in the client's cost shows through the noise of the end-to-end row. Under cachegrind every
thread counts, the stand-in's frames included (a small constant per job); its instructions per job,
the difference of two runs over its jobs (1,000 and 3,000, ``PYTHONHASHSEED=0``), repeat closely:

    PYTHONHASHSEED=0 valgrind --tool=cachegrind --cache-sim=no python -m bench.client_cost --jobs 3000 --repeat 1
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import zmq

from bench.report import repeated, saved
from pilot import wire
from pilot.wire.codec import array_header, frame_head, pack

#: A ``/bin/true``'s Delivered as the daemon reports it with its COMPLETED (its start included).
_DELIVERED: dict[str, Any] = {
    "wall_duration": 0.0005,
    "user_cpu_time": 0.0005,
    "system_cpu_time": 0.0,
    "max_rss": 1 << 20,
    "processors": 1,
    "gpus": 0,
    "consumption_rate": 0.99,
    "nodes": ["local-0"],
    "processes": 1,
    "exit_code": 0,
    "signal": None,
}
_COMPLETED = pack("COMPLETED")
_EXIT_0 = pack(0) + pack(None)  # its exit code and (no) message
_STARTED = pack("started")


class StandIn:
    """The daemon's end of the client's socket: frames read as the daemon reads them, answered as it
    answers them. Lean, as its instructions count under cachegrind with the client's: two receives and
    two sends per frame (not pyzmq's multipart helpers, which read an option per part), and the
    COMPLETED's Delivered packed once."""

    def __init__(self, address: str) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()  # its I/O thread is not the client's
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 10_000)
        self.sock.bind(address)
        self.leased = 0  # the last job id leased
        # An EVENTS frame of one status is these bytes, the job id, the time, then the Delivered (its
        # fields and the task's start).
        self._events_head = frame_head(wire.Kind.EVENTS, "events") + array_header(1) + array_header(6)
        self._delivered = msgpack.Packer().pack_map_header(len(_DELIVERED) + 1) + b"".join(
            pack(k) + pack(v) for k, v in _DELIVERED.items()
        )

    def _send(self, ident: bytes, frame: bytes) -> None:
        self.sock.send(ident, zmq.SNDMORE)
        self.sock.send(frame)

    def serve(self) -> tuple[bytes, str] | None:
        """Read one frame (raises zmq.Again when none comes within RCVTIMEO) and answer it; a SUBMIT's
        (client, job id), else None."""
        ident = self.sock.recv()
        msg = wire.decode(self.sock.recv(), allowed=wire.CLIENT_KINDS)
        body, rid = msg.body, msg.body["rid"]
        if msg.kind == wire.Kind.LEASE:
            count = int(body["count"])
            if count == 0:
                self._send(ident, wire.encode(wire.Kind.REPLY, {"given_back": True, "rid": rid}))
                return None
            first, self.leased = self.leased + 1, self.leased + count
            self._send(ident, wire.encode(wire.Kind.REPLY, {"first": first, "last": self.leased, "rid": rid}))
            return None
        if msg.kind != wire.Kind.SUBMIT or len(body["jobs"]) != 1:
            raise RuntimeError(f"the stand-in daemon got a {msg.kind} it does not answer: {str(body)[:200]}")
        (job_id,) = body["submit_ids"]  # a leased id: the job's id too
        self._send(ident, wire.encode(wire.Kind.REPLY, {"results": [{"id": job_id, "time": time.time()}], "rid": rid}))
        return ident, job_id

    def complete(self, ident: bytes, job_id: str) -> None:
        """The job's COMPLETED, as the daemon sends a short task's (its ACTIVE folded in): [id, state,
        time, exit code, message, Delivered with the task's start]."""
        now = time.time()
        status = pack(job_id) + _COMPLETED + pack(now) + _EXIT_0 + self._delivered
        self._send(ident, self._events_head + status + _STARTED + pack(now - 0.0005))

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def _serve_until(stand: StandIn, closed: threading.Event) -> None:
    while not closed.is_set():
        with contextlib.suppress(zmq.Again):
            stand.serve()


def _thread_cpu_ns(tids: set[int]) -> int:
    """CPU of these threads of this process so far (ns); a thread gone meanwhile counts for nothing."""
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total


def _tids() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def measure(*, jobs: int, warm: int, pause: float) -> dict[str, Any]:
    """A fresh executor against a fresh stand-in: ``warm`` jobs, then ``jobs`` timed; the client's CPU per
    job (µs), and how many of the timed jobs ended COMPLETED with their native id set by ``submit``."""
    import client as psij

    with tempfile.TemporaryDirectory(prefix="client-cost-") as home:
        stand = StandIn(f"ipc://{home}/clients.sock")
        others = _tids()  # this thread, the stand-in's ZeroMQ threads (and any left from an earlier run)
        # Released by the callback, taken by this thread: a lock costs less than an Event on both sides.
        queued, done = threading.Lock(), threading.Lock()
        queued.acquire()
        done.acquire()

        def cb(job: psij.Job, status: psij.JobStatus) -> None:
            if status.state is psij.JobState.QUEUED:
                queued.release()
            elif status.state is psij.JobState.COMPLETED:
                done.release()

        ex = psij.JobExecutor.get_instance("pilot", url=f"ipc://{home}/clients.sock")  # leases its first ids
        while stand.leased == 0:
            stand.serve()
        ex.set_job_status_callback(cb)
        spec = psij.JobSpec(executable="/bin/true")
        main_cpu = 0.0
        completed = 0
        client_tids: set[int] = set()
        cpu0 = 0
        for i in range(warm + jobs):
            if i == warm:  # the client's threads are all up by now
                client_tids = _tids() - others
                cpu0 = _thread_cpu_ns(client_tids)
                main_cpu = 0.0
            t0 = time.thread_time()
            job = psij.Job(spec)
            ex.submit(job)
            main_cpu += time.thread_time() - t0
            native_id = job.native_id
            answered = None
            while answered is None:
                answered = stand.serve()
            if answered[1] != native_id:
                raise RuntimeError(f"submit() returned with native id {native_id}, the pilot was sent {answered[1]}")
            if not queued.acquire(timeout=10):
                raise RuntimeError(f"job {native_id} never turned QUEUED")
            time.sleep(pause)  # the client's threads idle again, as the daemon's next frame finds them
            stand.complete(*answered)
            if not done.acquire(timeout=10):
                raise RuntimeError(f"job {native_id} never turned COMPLETED")
            completed += i >= warm and job.status.state is psij.JobState.COMPLETED and job.status.exit_code == 0
            time.sleep(pause)
        cpu_ns = _thread_cpu_ns(client_tids) - cpu0
        closed = threading.Event()
        stand.sock.setsockopt(zmq.RCVTIMEO, 20)
        server = threading.Thread(target=_serve_until, args=(stand, closed))
        server.start()  # answers the ids given back as the executor closes
        ex.close()
        closed.set()
        server.join()
        stand.close()
    us = (cpu_ns / 1e3 + main_cpu * 1e6) / jobs
    return {
        "us_per_task": us,
        "main_us_per_task": main_cpu * 1e6 / jobs,
        "completed": completed,
        "threads": len(client_tids),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--warm", type=int, default=50, help="jobs run first, not counted")
    ap.add_argument("--pause", type=float, default=0.001, help="seconds the client is left to idle between frames")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    out = repeated(
        lambda: measure(jobs=args.jobs, warm=args.warm, pause=args.pause),
        repeat=args.repeat,
        whose="client",
        each=lambda r: (
            f"client {r['us_per_task']:.1f} µs/job (submit() {r['main_us_per_task']:.1f}), {r['completed']} completed"
        ),
    )
    return saved(out, args)


if __name__ == "__main__":
    main()

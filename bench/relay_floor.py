"""The round trip's floor on this machine: the pilot's path with none of its work.

Three processes as in the pilot: this one (the client: the caller sends under a lock, an I/O thread
reads, a dispatch thread runs the callback), a relay (the daemon: two ROUTER sockets, one epoll wait on
their fds) and a worker (the agent: a DEALER, a thread that posix_spawns ``/bin/true`` and waits for
it). Plain ZeroMQ over ipc, as the pilot uses it. No journal, no validation, no placement: what is left
of the pilot's round trip above this figure is the pilot's own work; this figure itself is ZeroMQ's
hops and the wake-ups of idle cpus on this machine.

    python -m bench.relay_floor [N]      # prints the median of N round trips (Popen+wait before each)
"""

from __future__ import annotations

import os
import queue
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import zmq

_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)


def _relay(client_url: str, agent_url: str) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    clients, agents = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    clients.bind(client_url)
    agents.bind(agent_url)
    ep = select.epoll()
    for s in (clients, agents):
        ep.register(s.getsockopt(zmq.FD), select.EPOLLIN)  # type: ignore[arg-type]
    agent = client = b""
    while True:
        while clients.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]
            client, frame = clients.recv_multipart()
            agents.send_multipart([agent, frame])
        while agents.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]
            ident, frame = agents.recv_multipart()
            if frame == b"hello":
                agent = ident
            elif frame == b"bye":
                return
            else:
                clients.send_multipart([client, frame])
        ep.poll()


def _worker(agent_url: str) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(agent_url)
    lock = threading.Lock()
    orders: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def spawner() -> None:
        while True:
            order = orders.get()
            pid = os.posix_spawn("/bin/true", ["/bin/true"], os.environ)
            os.waitpid(pid, 0)
            with lock:
                sock.send(order)

    threading.Thread(target=spawner, daemon=True).start()
    with lock:
        sock.send(b"hello")
    ep = select.epoll()
    ep.register(sock.getsockopt(zmq.FD), select.EPOLLIN)  # type: ignore[arg-type]
    while True:
        with lock:
            got = []
            while sock.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]
                got.append(sock.recv())
        for order in got:
            if order == b"bye":
                with lock:
                    sock.send(b"bye")
                return
            orders.put(order)
        ep.poll()


def measure(n: int) -> tuple[list[float], list[float]]:
    """``n`` relayed round trips in ms, each after a Popen+wait of /bin/true (also returned, in ms)."""
    with tempfile.TemporaryDirectory(prefix="relay-") as d:
        client_url, agent_url = f"ipc://{Path(d) / 'c'}", f"ipc://{Path(d) / 'a'}"
        me = [sys.executable, "-m", "bench.relay_floor"]
        procs = [subprocess.Popen([*me, "relay", client_url, agent_url])]
        procs.append(subprocess.Popen([*me, "worker", agent_url]))
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(client_url)
            lock = threading.Lock()
            inbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
            done = threading.Event()
            stop = threading.Event()

            def reader() -> None:
                while not stop.is_set():
                    if not sock.poll(100, zmq.POLLIN):
                        continue
                    with lock:
                        while sock.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]
                            inbox.put(sock.recv())

            def dispatcher() -> None:
                while inbox.get() != b"stop":
                    done.set()

            threads = [threading.Thread(target=reader), threading.Thread(target=dispatcher)]
            for t in threads:
                t.start()
            try:
                payload = b"x" * 300  # about a submit frame of one job
                for _ in range(50):  # until the worker has said hello to the relay
                    done.clear()
                    with lock:
                        sock.send(payload)
                    if done.wait(0.2):
                        break
                else:
                    raise RuntimeError("the relay floor's processes did not answer")
                trips: list[float] = []
                spawns: list[float] = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    subprocess.Popen(["/bin/true"]).wait()
                    spawns.append((time.perf_counter() - t0) * 1e3)
                    done.clear()
                    t0 = time.perf_counter()
                    with lock:
                        sock.send(payload)
                    if not done.wait(10):
                        raise RuntimeError("a relayed round trip took over 10 s")
                    trips.append((time.perf_counter() - t0) * 1e3)
                with lock:
                    sock.send(b"bye")
                return trips, spawns
            finally:
                stop.set()
                inbox.put(b"stop")
                for t in threads:
                    t.join(timeout=5)
        finally:
            sock.close(linger=0)
            ctx.term()
            for p in procs:
                try:
                    p.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def main(argv: list[str]) -> None:
    if argv[:1] == ["relay"]:
        _relay(argv[1], argv[2])
    elif argv[:1] == ["worker"]:
        _worker(argv[1])
    else:
        trips, spawns = measure(int(argv[0]) if argv else 200)
        print(
            f"relay floor {statistics.median(trips):.2f} ms (median of {len(trips)}), "
            f"Popen+wait {statistics.median(spawns):.2f} ms"
        )


if __name__ == "__main__":
    main(sys.argv[1:])

"""The round trip's floor on this machine: the pilot's path with none of its work.

Three processes as in the pilot: this one (the client: the caller sends under a lock, an I/O thread
reads, a dispatch thread runs the callback), a relay (the daemon: two ROUTER sockets, one epoll wait on
their fds) and a worker (the agent: a DEALER, a thread that posix_spawns ``/bin/true``, waits for it and
sends the answer itself). Plain ZeroMQ over ipc, as the pilot uses it. No journal, no validation, no
placement: what is left of the pilot's round trip above this figure is the pilot's own work; this
figure itself is ZeroMQ's hops and the wake-ups of idle cpus on this machine.

A ZeroMQ socket's FD only says ZMQ_EVENTS must be read again, and any send or receive on the socket
may take that signal: a thread that sends while another waits on the FD checks ZMQ_EVENTS after its
send and wakes the waiter through a pipe if a frame came (as the pilot's client and agent do), and a
loop checks every socket's ZMQ_EVENTS after its last send before it waits.

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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import zmq

_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)
_PAYLOAD = 300  # bytes: about a submit frame of one job


def _has_input(sock: zmq.Socket[bytes]) -> bool:
    return bool(sock.getsockopt(_EVENTS) & _POLLIN)  # type: ignore[operator]


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
        while _has_input(clients):
            client, frame = clients.recv_multipart()
            agents.send_multipart([agent, frame])  # dropped by the ROUTER until the worker said hello
        while _has_input(agents):
            ident, frame = agents.recv_multipart()
            if frame == b"hello":
                agent = ident
            elif frame == b"bye":
                return
            else:
                clients.send_multipart([client, frame])
        if not (_has_input(clients) or _has_input(agents)):  # the sends above may have taken a signal
            ep.poll()


def _worker(agent_url: str) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(agent_url)
    lock = threading.Lock()
    orders: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    rfd, wfd = os.pipe()

    def spawner() -> None:
        while True:
            order = orders.get()
            pid = os.posix_spawn("/bin/true", ["/bin/true"], os.environ)
            os.waitpid(pid, 0)
            with lock:
                sock.send(order)
                if _has_input(sock):
                    os.write(wfd, b"\0")

    threading.Thread(target=spawner, daemon=True).start()
    with lock:
        sock.send(b"hello")
    ep = select.epoll()
    ep.register(sock.getsockopt(zmq.FD), select.EPOLLIN)  # type: ignore[arg-type]
    ep.register(rfd, select.EPOLLIN)
    while True:
        with lock:
            got = []
            while _has_input(sock):
                got.append(sock.recv())
        for order in got:
            if order == b"bye":
                with lock:
                    sock.send(b"bye")
                return
            orders.put(order)
        if any(fd == rfd for fd, _ in ep.poll()):
            os.read(rfd, 4096)


class _Client:
    """The client's side: ``trip(token)`` sends a payload that starts with ``token`` and returns when
    the dispatch thread has seen its answer (answers to other tokens are skipped), or raises after
    ``timeout`` seconds."""

    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._inbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        #: The token the current trip waits for and its event, replaced together: an answer to an earlier
        #: payload read by the dispatch thread while a new trip starts sets only the earlier trip's event.
        self._waiting: tuple[bytes, threading.Event] = (b"", threading.Event())
        self._stop = False
        self._rfd, self._wfd = os.pipe()
        self._threads = [threading.Thread(target=self._reader), threading.Thread(target=self._dispatcher)]
        for t in self._threads:
            t.start()

    def send(self, token: bytes, *, pad: bool = True) -> None:
        with self._lock:
            self._sock.send(token.ljust(_PAYLOAD, b"x") if pad else token)
            if _has_input(self._sock):
                os.write(self._wfd, b"\0")

    def trip(self, token: bytes, *, timeout: float) -> bool:
        done = threading.Event()
        self._waiting = (token, done)
        self.send(token)
        return done.wait(timeout)

    def _reader(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock.getsockopt(zmq.FD), zmq.POLLIN)
        poller.register(self._rfd, zmq.POLLIN)
        while not self._stop:
            with self._lock:
                while _has_input(self._sock):
                    self._inbox.put(self._sock.recv())
            if any(fd == self._rfd for fd, _ in poller.poll(100)):
                os.read(self._rfd, 4096)

    def _dispatcher(self) -> None:
        while (frame := self._inbox.get()) != b"stop":
            want, done = self._waiting
            if frame.startswith(want):
                done.set()

    def close(self) -> None:
        self._stop = True
        self._inbox.put(b"stop")
        for t in self._threads:
            t.join(timeout=5)
        os.close(self._rfd)
        os.close(self._wfd)


@contextmanager
def _path() -> Iterator[_Client]:
    """The relay and worker processes, and a client connected to them once the worker is known."""
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
            client = _Client(sock)
            try:
                for i in range(50):  # until the worker has said hello to the relay
                    if client.trip(b"warm%04d" % i, timeout=0.2):
                        break
                else:
                    raise RuntimeError("the relay floor's processes did not answer")
                yield client
                client.send(b"bye", pad=False)
            finally:
                client.close()
        finally:
            sock.close(linger=0)
            ctx.term()
            for p in procs:
                try:
                    p.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def measure(n: int, *, burst: int = 0) -> tuple[list[float], list[float]]:
    """``n`` relayed round trips in ms, each after a Popen+wait of /bin/true (also returned, in ms).
    ``burst``: that many payloads sent at once before the trips, all answered (a check of the path's
    wake-ups under overlapping traffic, not part of the figure)."""
    with _path() as client:
        if burst:
            for i in range(burst):
                client.send(b"burst%05d" % i)
            if not client.trip(b"burst-end", timeout=30):
                raise RuntimeError(f"a burst of {burst} relayed payloads was not answered within 30 s")
        trips: list[float] = []
        spawns: list[float] = []
        for i in range(n):
            t0 = time.perf_counter()
            subprocess.Popen(["/bin/true"]).wait()
            spawns.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            if not client.trip(b"trip%05d" % i, timeout=10):
                raise RuntimeError("a relayed round trip took over 10 s")
            trips.append((time.perf_counter() - t0) * 1e3)
        return trips, spawns


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

"""The agent's loop: one DEALER socket to the daemon, orders in, batched events out.

One loop owns the socket (see :mod:`pilot.wire.transport`): each turn it drains the daemon's frames, hands
orders to the process engine, forwards the engine's events in one message, runs due timers
(heartbeat, walltime, kill escalation, stopping), sends, then waits for the socket, a poke from the
spawner/reaper threads, or the next timer. An agent that runs processes turns in a worker thread of
its own, and between its turns the spawner and reaper threads send their events themselves;
simulated agents (many per process) turn as anyio tasks.
"""

from __future__ import annotations

import functools
import heapq
import os
import signal
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import anyio
import structlog
import zmq

from agent import probe
from agent.chaining import held_wakes
from agent.hosting import Host
from agent.processes import ProcessEngine
from agent.simulated import NullEngine
from agent.staging import Stager
from pilot import wire
from pilot.model.node import NodeConfigured
from pilot.model.process_order import STAGING_ROLES, ProcessOrder
from pilot.security import Credentials
from pilot.thread_names import name_os_thread
from pilot.wire.curve import secure_client, watch_handshakes
from pilot.wire.messages import (
    TO_AGENT,
    Body,
    Bye,
    Heartbeat,
    HeartbeatReply,
    Kill,
    Launch,
    ProcessRef,
    Register,
    Registered,
    Stop,
    TaskEvent,
    TaskEvents,
    Withdraw,
    decode,
    encode,
)
from pilot.wire.transport import Waiter, drain

log = structlog.get_logger("agent")

#: Measurements shared by the agents of one process (see ``Agent._measures``): key -> (when, values).
_SHARED_MEASURES: dict[tuple[tuple[int, ...], str], tuple[float, tuple[dict[str, float], dict[str, float]]]] = {}
_SHARED_MEASURES_TTL = 1.0
#: A hosted node (agent.hosting) waits this long for its REGISTER's answer before sending it again (then
#: twice as long each time, up to the most); registered, it looks at the daemon's silence this often.
_HOSTED_REGISTER_WAIT = 5.0
_HOSTED_REGISTER_WAIT_MOST = 30.0
_HOSTED_LOOK = 5.0


class Agent:
    def __init__(
        self,
        *,
        daemon_url: str,
        node: NodeConfigured,
        workdir: Path,
        heartbeat_interval: float = 1.0,
        orphan_timeout: float = 600.0,
        kill_grace: float = 2.0,
        cpu_map: dict[int, int] | None = None,
        credentials: Credentials | None = None,
        launch: str = "spawn",
        null_duration: float = 0.0,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        host: Host | None = None,
    ) -> None:
        """``launch``: ``spawn`` runs the orders; ``null`` only simulates them (see
        :mod:`agent.simulated`), each lasting ``null_duration`` seconds. ``context``: a ZeroMQ context
        shared by the agents of the virtual nodes one process hosts (null launches only); ``host``:
        theirs, which sends their heartbeats as one and their REGISTERs in batches."""
        self.node = node
        self._host = host
        if host is not None:
            host.add(self)
        self._url = daemon_url
        self._disk = str(workdir)
        self._heartbeat = heartbeat_interval
        self._orphan_timeout = orphan_timeout
        self._kill_grace = kill_grace
        self._own_ctx = context is None
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context() if context is None else context
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.IDENTITY, node.name.encode())
        self._sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
        self._sock.setsockopt(zmq.LINGER, 2000)
        self._curve = credentials is not None
        if credentials is not None:
            secure_client(self._sock, credentials)  # pins the daemon's key: an impostor cannot answer
        self._waiter = Waiter()
        self._waiter.add(self._sock)
        self._engine: ProcessEngine | NullEngine
        if launch == "spawn":
            self._engine = ProcessEngine(
                node=node, workdir=workdir, notify=self._engine_event, cpu_map=cpu_map, kill_grace=kill_grace
            )
        elif launch == "null":
            self._engine = NullEngine(duration=null_duration)
        else:
            raise ValueError(f"launch must be 'spawn' or 'null', not {launch!r}")
        #: Staging orders (files in before a job's processes, out after) run here, in worker threads.
        self._stager = Stager(node=node.name, workdir=workdir, notify=self._engine_event)
        self._out: list[bytes] = []
        #: A loop in a thread of its own turns under this lock; between turns, while ``_direct``, the
        #: engine's threads may take it to send their events themselves (_engine_event), and the loop
        #: sleeps until ``_sleep_until`` unless woken.
        self._turn_lock = threading.Lock()
        self._direct = False
        self._sleep_until = 0.0
        self._orders: list[ProcessOrder] = []  # received this turn, for the engine at its end (_turn)
        #: Task events sent but not yet acknowledged by the daemon (it acknowledges once they are in its
        #: journal). They go again with the next REGISTER: a daemon restarted after a crash gets them all.
        self._unacked: deque[tuple[int, list[Any]]] = deque()
        self._seq = 0
        self._registered = False
        self._register_wait = _HOSTED_REGISTER_WAIT
        self._last_heard = time.monotonic()
        self._next_beat = 0.0
        self._timers: list[tuple[float, ProcessRef, str]] = []
        self._stopping: str | None = None  # None | "term" | "kill"
        self._stop_reason = ""
        self._stop_deadline = 0.0
        self._done = False

    async def run(self) -> None:
        self._engine.start()
        log.info(
            "agent started",
            node=self.node.name,
            daemon=self._url,
            cores=len(self.node.processors),
            launch="null (simulated)" if isinstance(self._engine, NullEngine) else "spawn",
        )
        try:
            async with anyio.create_task_group() as tg:
                if self._curve:  # say why the daemon cannot be reached: an impostor on the port, a key refused
                    await tg.start(functools.partial(watch_handshakes, self._sock, server=False))
                self._sock.connect(self._url)
                if isinstance(self._engine, ProcessEngine):
                    tg.start_soon(self._sample)
                await self._loop()
                tg.cancel_scope.cancel()
        finally:
            self._submit()  # orders received in the last turn are the engine's to report, killed
            for ref in self._engine.running():
                self._engine.kill(ref, reason="agent exiting", sig=signal.SIGKILL)
            await anyio.to_thread.run_sync(self._engine.stop)
            await anyio.to_thread.run_sync(self._stager.stop)
            if self._host is not None:
                self._host.remove(self)
            self._forward()
            self._queue(Bye(self.node.name))
            self._send_out()
            self._sock.close(linger=1000)
            if self._own_ctx:
                self._ctx.term()
            self._waiter.close()
            log.info("agent stopped", node=self.node.name)

    async def _loop(self) -> None:
        if isinstance(self._engine, ProcessEngine):
            await self._loop_in_thread()
            return
        while (until := self._turn()) is not None:
            await self._waiter.wait(until)

    async def _loop_in_thread(self) -> None:
        """The loop in a worker thread of its own, waiting in a plain epoll: an agent that runs
        processes is one per process, and its turns (one or two per batch of tasks) cost a third less
        CPU without the event loop's wake-ups. Cancelling this stops the thread at its next turn."""
        halt = False

        def run() -> None:
            name_os_thread("pilot-loop")  # (an anyio worker thread: named for the agent's life in it)
            try:
                while not halt:
                    with held_wakes(), self._turn_lock:
                        until = self._turn()
                        if until is None:
                            return
                        self._sleep_until = until
                        self._direct = True
                    self._waiter.block(until, lock=self._turn_lock)
            finally:
                with self._turn_lock:
                    self._direct = False

        async def stop_on_cancel() -> None:
            nonlocal halt
            try:
                await anyio.sleep_forever()
            finally:
                halt = True
                self._waiter.poke()

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_on_cancel)
            await anyio.to_thread.run_sync(run)
            tg.cancel_scope.cancel()

    def _engine_event(self) -> None:
        """A spawner or the reaper has events for the daemon. While the loop's thread waits between
        turns, that thread sends them itself (a lone task's exit skips a thread switch: 30-60 us of its
        round trip), under the lock the loop turns under and looks at the socket under (ZeroMQ sockets
        are not for two threads at once), and wakes the loop only if the loop must come back sooner
        than it meant to, has a frame to read (a send may have consumed the socket fd's signal of it) or
        could not send everything; otherwise, or when the loop is busy, it pokes it."""
        if not (self._direct and self._registered and self._turn_lock.acquire(blocking=False)):
            self._waiter.poke()
            return
        try:
            if not self._direct:  # the loop's thread ended meanwhile
                self._waiter.poke()
                return
            self._forward()
            self._send_out()
            if self._out or self._next_deadline() < self._sleep_until or self._waiter.readable(self._sock):
                self._waiter.poke()
        finally:
            self._turn_lock.release()

    def _turn(self) -> float | None:
        """One pass: the daemon's frames, the engine's events, due timers, sends. When the next pass is
        due (``time.monotonic()``; sooner for a frame or a poke), or None once the agent is done."""
        for frames in drain(self._sock, 1024):
            self._last_heard = time.monotonic()
            self._receive(frames)
        now = time.monotonic()
        self._engine.poll(now)
        self._forward()
        self._submit()  # as late as can be: the spawner it wakes waits for this thread's next wait (the GIL)
        self._tick(now)
        self._send_out()
        if self._done:
            return None
        return self._next_deadline()

    # -- inbound ----------------------------------------------------------------------------------

    def _receive(self, frames: list[bytes]) -> None:
        try:
            if len(frames) != 1:
                raise wire.ProtocolError(f"{len(frames)} frames, expected 1")
            self._handle(decode(frames[0], TO_AGENT))
        except wire.ProtocolError as exc:
            log.warning("dropped frame from daemon", reason=str(exc))

    def _handle(self, msg: Body) -> None:
        if isinstance(msg, Launch):
            if not self._stopping:
                self._orders += msg.orders
            return
        self._submit()  # what came before this message first: a KILL or WITHDRAW finds its order
        if isinstance(msg, Kill):
            for ref in msg.processes:
                # The stager first: the engine takes any ref as its own while it is starting processes.
                if self._stager.kill(ref, reason=msg.reason):
                    continue
                if self._engine.kill(ref, reason=msg.reason):
                    self._add_timer(time.monotonic() + self._kill_grace, ref, "kill")
        elif isinstance(msg, Withdraw):
            for ref in msg.processes:
                self._engine.withdraw(ref)
        elif isinstance(msg, Registered):
            self._registered = True
            self._acked(msg.acked)
            # Batches made after the REGISTER left were kept for it, not sent: they go now, in order (the
            # daemon takes a batch only as the next of the last it took).
            for seq, events in self._unacked:
                self._queue(TaskEvents(tuple(events), seq))
            self._heartbeat = msg.heartbeat_interval
            self._next_beat = time.monotonic() + self._heartbeat
            self._register_wait = _HOSTED_REGISTER_WAIT
            log.info("registered", node=self.node.name)
        elif isinstance(msg, HeartbeatReply):
            if not msg.known:
                self.unknown()
            else:
                self._acked(msg.acked)
            if self._host is not None and (msg.acks or msg.unknown):
                self._host.heard(msg)
        elif isinstance(msg, Stop):
            self._begin_stop(msg.reason)

    def _submit(self) -> None:
        if self._orders:
            orders, self._orders = self._orders, []
            for o in orders:  # (a plain loop: most batches have no staging order, and pay no generator)
                if o.role in STAGING_ROLES:
                    orders = self._stage(orders)
                    break
            self._engine.submit(orders)

    def _stage(self, orders: list[ProcessOrder]) -> list[ProcessOrder]:
        """Give the staging orders to the stager; the others."""
        for o in orders:
            if o.role in STAGING_ROLES:
                self._stager.submit(o)
        return [o for o in orders if o.role not in STAGING_ROLES]

    # -- what the host of many virtual nodes does for them (agent.hosting) ------------------------

    @property
    def registered(self) -> bool:
        return self._registered

    @property
    def heartbeat_interval(self) -> float:
        return self._heartbeat

    def heard(self, now: float, acked: int) -> None:
        """The daemon heard this node's heartbeat (sent in another's) and has its events up to ``acked``."""
        self._last_heard = now
        self._acked(acked)

    def unknown(self) -> None:
        """The daemon does not know this node (any more): it registers again at its next turn."""
        self._registered = False
        self._next_beat = 0.0

    def send(self, msg: Body) -> bool:
        """Send ``msg`` on this node's socket from outside its loop (same thread); the loop is woken,
        since a send may consume the socket's signal of a frame waiting to be read. False while some
        of what is queued could not go yet (see :meth:`send_out`)."""
        self._queue(msg)
        return self.send_out()

    def send_out(self) -> bool:
        """Send what is queued, from outside the loop; whether everything went."""
        self._send_out()
        self._waiter.poke()
        return not self._out

    def measure(self, now: float) -> tuple[dict[str, float], dict[str, float]]:
        return self._measures(now)

    # -- outbound ---------------------------------------------------------------------------------

    def _queue(self, msg: Body) -> None:
        self._out.append(encode(msg))

    def _send_out(self) -> None:
        """Send what is queued; what the socket cannot take now stays queued, in order."""
        if not self._out:
            return
        sent = 0
        for frame in self._out:
            try:
                self._sock.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                break
            sent += 1
        del self._out[:sent]

    def _acked(self, acked: int) -> None:
        while self._unacked and self._unacked[0][0] <= acked:
            self._unacked.popleft()

    def _forward(self, events: list[Any] | None = None) -> None:
        if events is None:
            events = self._engine.drain()
            staged = self._stager.drain()
            if staged:
                events += staged
        if not events:
            return
        # A process that started and exited within one batch is reported by its exit alone (it carries
        # the start time): fewer events for short tasks, and the client synthesises ACTIVE.
        exited: set[ProcessRef] | None = None
        out: list[TaskEvent] = []
        for ev in events:
            if ev.kind == "started":
                if exited is None:
                    exited = {(e.job_id, e.slot) for e in events if e.kind == "exited"}
                if (ev.job_id, ev.slot) in exited:
                    continue
                deadline = self._engine.deadline((ev.job_id, ev.slot))
                if deadline is not None:
                    self._add_timer(deadline, (ev.job_id, ev.slot), "walltime")
            out.append(ev)
        self._seq += 1
        self._unacked.append((self._seq, out))
        if self._registered:  # else they go with the REGISTER
            self._queue(TaskEvents(tuple(out), self._seq))

    # -- timers: heartbeat, walltime, kill escalation, stopping -----------------------------------

    def _add_timer(self, when: float, ref: ProcessRef, action: str) -> None:
        heapq.heappush(self._timers, (when, ref, action))

    def _next_deadline(self) -> float:
        when = self._next_beat
        if self._timers:
            when = min(when, self._timers[0][0])
        engine = self._engine.next_deadline()
        if engine is not None:
            when = min(when, engine)
        if self._stopping:
            when = min(when, self._stop_deadline)
        return when

    def _tick(self, now: float) -> None:
        if now >= self._next_beat:
            if self._registered:
                if self._host is None:
                    values, utilized = self._measures(now)
                    self._queue(Heartbeat(os.getloadavg(), values, utilized))
                    self._next_beat = now + self._heartbeat
                else:  # the host's heartbeat names this node; it only looks at the daemon's silence here
                    self._next_beat = now + max(self._heartbeat, _HOSTED_LOOK)
            else:
                running, events = self._engine.snapshot()
                staging, staged = self._stager.snapshot()
                running += staging
                self._forward(events + staged)
                register = Register(
                    self.node,
                    tuple(running),
                    tuple(ev for _, chunk in self._unacked for ev in chunk),
                    self._seq,
                    self._measures(now)[0],  # matchable from the start
                )
                if self._host is not None:
                    # Thousands of nodes: while the daemon works through their REGISTERs, sending them
                    # again every half second would only bury it deeper. Each waits longer, up to 30 s.
                    self._host.register(self, register)
                    self._next_beat = now + self._register_wait
                    self._register_wait = min(self._register_wait * 2, _HOSTED_REGISTER_WAIT_MOST)
                else:
                    self._queue(register)
                    self._next_beat = now + min(self._heartbeat, 0.5)
            if now - self._last_heard > self._orphan_timeout and not self._stopping:
                log.error("daemon silent, stopping", node=self.node.name, seconds=self._orphan_timeout)
                self._begin_stop(f"agent on {self.node.name} lost its daemon")
        while self._timers and self._timers[0][0] <= now:
            _, ref, action = heapq.heappop(self._timers)
            if not self._engine.is_running(ref):
                continue
            if action == "walltime":
                self._engine.kill(ref, reason="walltime")
                self._add_timer(now + self._kill_grace, ref, "kill")
            else:
                self._engine.kill(ref, reason="killed", sig=signal.SIGKILL)
        if self._stopping:
            self._advance_stop(now)

    def _measures(self, now: float) -> tuple[dict[str, float], dict[str, float]]:
        """The node's load values and Utilized amounts. Agents sharing a process (simulated virtual
        nodes) share one measurement per interval: a thousand of them would otherwise measure the same
        machine a thousand times a second (and psutil's cpu_percent is per process, since its last call)."""
        if self._own_ctx:
            engine = self._engine
            rss = engine.tasks_rss if isinstance(engine, ProcessEngine) else None
            return probe.measures(self.node, disk_path=self._disk, tasks_rss=rss)
        key = (tuple(self.node.processors), self._disk)
        cached = _SHARED_MEASURES.get(key)
        if cached is None or now - cached[0] >= _SHARED_MEASURES_TTL:
            cached = (now, probe.measures(self.node, disk_path=self._disk))
            _SHARED_MEASURES[key] = cached
        return cached[1]

    def _begin_stop(self, reason: str) -> None:
        if self._stopping:
            return
        self._stopping = "term"
        self._stop_reason = reason
        self._stop_deadline = time.monotonic() + self._kill_grace
        for ref in self._engine.running():
            self._engine.kill(ref, reason=reason)
        self._engine.kill_rest()
        for ref in self._stager.running():
            self._stager.kill(ref, reason=reason)

    def _advance_stop(self, now: float) -> None:
        if not self._engine.busy() and not self._stager.busy():
            self._done = True
        elif now >= self._stop_deadline and self._stopping == "term":
            for ref in self._engine.running():
                self._engine.kill(ref, reason=self._stop_reason, sig=signal.SIGKILL)
            self._stopping = "kill"
            self._stop_deadline = now + max(5.0, self._kill_grace)
        elif now >= self._stop_deadline:
            log.error("processes still unreaped after SIGKILL; exiting anyway", node=self.node.name)
            self._done = True

    async def _sample(self) -> None:
        while True:
            await anyio.sleep(1.0)
            await anyio.to_thread.run_sync(self._engine.sample)

"""The agent's event loop: one DEALER socket to the daemon, orders in, batched events out."""

from __future__ import annotations

import heapq
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import structlog
import zmq
import zmq.asyncio

from agent.processes import Key, ProcessEngine
from pilot import wire
from pilot.model.node import NodeConfigured
from pilot.model.process_order import ProcessOrder

log = structlog.get_logger("agent")


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
    ) -> None:
        self.node = node
        self._url = daemon_url
        self._workdir = workdir
        self._heartbeat = heartbeat_interval
        self._orphan_timeout = orphan_timeout
        self._kill_grace = kill_grace
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.IDENTITY, node.name.encode())
        self._sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
        self._sock.setsockopt(zmq.LINGER, 2000)
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._signalled = False
        self._engine = ProcessEngine(node=node, workdir=workdir, notify=self._wake, cpu_map=cpu_map)
        self._registered = False
        self._last_heard = time.monotonic()
        self._timers: list[tuple[float, Key, str]] = []
        self._timer_changed = anyio.Event()
        self._stopping = False
        self._done = anyio.Event()
        self._progress = anyio.Event()

    def _wake(self) -> None:
        # Called from the spawner and reaper threads; coalesces wake-ups into one pipe byte.
        if not self._signalled:
            self._signalled = True
            try:
                os.write(self._wfd, b"\0")
            except BlockingIOError:
                pass

    async def run(self) -> None:
        self._sock.connect(self._url)
        self._engine.start()
        log.info("agent started", node=self.node.name, daemon=self._url, cores=len(self.node.processors))
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._receive)
                tg.start_soon(self._forward_events)
                tg.start_soon(self._keep_alive)
                tg.start_soon(self._run_timers)
                tg.start_soon(self._sample)
                await self._done.wait()
                tg.cancel_scope.cancel()
        finally:
            for key in self._engine.running():
                self._engine.kill(key, reason="agent exiting", sig=signal.SIGKILL)
            await anyio.to_thread.run_sync(self._engine.stop)
            await self._flush()
            await self._send(wire.Kind.BYE, {"node": self.node.name})
            self._sock.close(linger=1000)
            self._ctx.term()
            os.close(self._rfd)
            os.close(self._wfd)
            log.info("agent stopped", node=self.node.name)

    async def _send(self, kind: str, body: dict[str, Any]) -> None:
        await self._sock.send(wire.encode(kind, body))

    async def _register(self) -> None:
        await self._send(
            wire.Kind.REGISTER, {"node": self.node.to_wire(), "running": [list(k) for k in self._engine.running()]}
        )

    # -- inbound ----------------------------------------------------------------------------------

    async def _receive(self) -> None:
        while True:
            frame = await self._sock.recv()
            self._last_heard = time.monotonic()
            try:
                msg = wire.decode(frame, allowed=wire.TO_AGENT_KINDS | {wire.Kind.HEARTBEAT})
                await self._handle(msg)
            except wire.ProtocolError as exc:
                log.warning("dropped frame from daemon", reason=str(exc))

    async def _handle(self, msg: wire.Message) -> None:
        if msg.kind == wire.Kind.LAUNCH:
            orders = [ProcessOrder.from_wire(o) for o in wire.field(msg.body, "orders", list)]
            if self._stopping:
                return
            self._engine.submit(orders)
        elif msg.kind == wire.Kind.KILL:
            reason = wire.field(msg.body, "reason", str)
            for raw in wire.field(msg.body, "keys", list):
                if not (
                    isinstance(raw, list) and len(raw) == 2 and isinstance(raw[0], str) and isinstance(raw[1], int)
                ):
                    raise wire.ProtocolError("kill keys must be [job_id, slot] pairs")
                key = (raw[0], raw[1])
                if self._engine.kill(key, reason=reason):
                    self._add_timer(time.monotonic() + self._kill_grace, key, "kill")
        elif msg.kind == wire.Kind.REGISTERED:
            self._registered = True
            self._heartbeat = float(wire.opt_field(msg.body, "heartbeat_interval", (int, float), self._heartbeat))
            log.info("registered", node=self.node.name)
        elif msg.kind == wire.Kind.HEARTBEAT:
            if not wire.opt_field(msg.body, "known", bool, True):
                self._registered = False
                await self._register()
        elif msg.kind == wire.Kind.STOP:
            await self._stop(reason=wire.opt_field(msg.body, "reason", str, "pilot stopping"))

    async def _stop(self, *, reason: str) -> None:
        if self._stopping:
            return
        self._stopping = True
        running = self._engine.running()
        for key in running:
            self._engine.kill(key, reason=reason)
        with anyio.move_on_after(self._kill_grace):
            await self._until(lambda: not self._engine.busy())
        for key in self._engine.running():
            self._engine.kill(key, reason=reason, sig=signal.SIGKILL)
        with anyio.move_on_after(max(5.0, self._kill_grace)) as scope:
            await self._until(lambda: not self._engine.busy())
        if scope.cancelled_caught:
            log.error("processes still unreaped after SIGKILL; exiting anyway", node=self.node.name)
        await self._flush()
        self._done.set()

    # -- outbound ---------------------------------------------------------------------------------

    async def _forward_events(self) -> None:
        while True:
            await anyio.wait_readable(self._rfd)
            try:
                os.read(self._rfd, 4096)
            except BlockingIOError:
                pass
            self._signalled = False
            await self._flush()
            self._progress.set()
            self._progress = anyio.Event()

    async def _until(self, predicate: Callable[[], bool]) -> None:
        """Wait for ``predicate``, re-checked after every batch of process events."""
        while not predicate():
            await self._progress.wait()

    async def _flush(self) -> None:
        events = self._engine.drain()
        if not events:
            return
        for ev in events:
            if ev.kind == "started":
                deadline = self._engine.deadline((ev.job_id, ev.slot))
                if deadline is not None:
                    self._add_timer(deadline, (ev.job_id, ev.slot), "walltime")
        await self._send(wire.Kind.TASK_EVENTS, {"events": [e.to_wire() for e in events]})

    async def _keep_alive(self) -> None:
        await self._register()
        while True:
            await anyio.sleep(self._heartbeat if self._registered else min(self._heartbeat, 0.5))
            if not self._registered:
                await self._register()
                continue
            await self._send(
                wire.Kind.HEARTBEAT,
                {"time": time.time(), "running": len(self._engine.running()), "load": list(os.getloadavg())},
            )
            if time.monotonic() - self._last_heard > self._orphan_timeout:
                log.error("daemon silent, stopping", node=self.node.name, seconds=self._orphan_timeout)
                await self._stop(reason=f"agent on {self.node.name} lost its daemon")

    # -- timers (walltime, kill escalation) ------------------------------------------------------

    def _add_timer(self, when: float, key: Key, action: str) -> None:
        heapq.heappush(self._timers, (when, key, action))
        self._timer_changed.set()

    async def _run_timers(self) -> None:
        while True:
            if not self._timers:
                await self._timer_changed.wait()
                self._timer_changed = anyio.Event()
                continue
            when, key, action = self._timers[0]
            delay = when - time.monotonic()
            if delay > 0:
                with anyio.move_on_after(delay):
                    await self._timer_changed.wait()
                    self._timer_changed = anyio.Event()
                continue
            heapq.heappop(self._timers)
            if not self._engine.is_running(key):
                continue
            if action == "walltime":
                self._engine.kill(key, reason="walltime")
                self._add_timer(time.monotonic() + self._kill_grace, key, "kill")
            else:
                self._engine.kill(key, reason="killed", sig=signal.SIGKILL)

    async def _sample(self) -> None:
        while True:
            await anyio.sleep(1.0)
            await anyio.to_thread.run_sync(self._engine.sample)

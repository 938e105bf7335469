"""A chained spawner: one core's tasks started one after another by its helper, with no agent in between.

Where one declared core alone maps to a real cpu, its tasks run one at a time. The spawner of that cpu
runs its helper in the chained mode (``forkserver chain``, see forkserver.c): the helper queues the
requests it gets and starts each as soon as the task before it has exited, reaps it itself with its
rusage and writes one record per start and exit, flushed in batches. The agent's Python then runs once
per batch of records, warm, instead of twice per task (start, reap), cold, between the task's own
processes: those two wake-ups were most of the agent's CPU per task.

How far ahead a core is given orders is the engine's (``ProcessEngine._ahead``): only while the core's
tasks are short (an order queued at the helper can no longer be withdrawn to another node), only rank
orders without stream files (a file is opened only when its task starts), at most ``AHEAD`` of them.

What differs from the unchained spawner: the tasks are the helper's children, not the agent's. So the
agent never signals them by pid (the helper reaps them, and only it knows when a pid is free again):
kills go through the helper (``MSG_SIGNAL``), which signals a task only while it has not reaped it;
an order queued at the helper is withdrawn by ``MSG_CANCEL``. A task whose helper dies is adopted by the
agent (its subreaper): its exit status is lost, it is reported failed and killed by its mark
(:mod:`agent.trees`).

Who owns what: the chain's thread owns its helper, its socket and the orders sent to it (``_sent``);
other threads only put items on its queue (:meth:`Chain.put`), which wakes it through an eventfd: at
once, or, for the agent's loop, as the loop's turn ends (:func:`held_wakes`).
"""

from __future__ import annotations

import array
import functools
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from queue import SimpleQueue
from typing import TYPE_CHECKING, Final, NamedTuple

import structlog

from agent import forkserver
from agent.forkserver import SpawnError
from agent.table import Running
from pilot.model.process_order import ProcessOrder
from pilot.thread_names import name_os_thread
from pilot.wire.messages import ProcessRef, TaskEvent

if TYPE_CHECKING:
    from agent.processes import ProcessEngine
    from agent.spawning import Prepared, Spawners, _Spawner

log = structlog.get_logger("agent.processes")

#: Orders a chained core may be given beyond the one it runs, while its tasks are short.
AHEAD: Final = 32
#: ``PILOT_AGENT_CHAIN=0``: no chains; every spawner starts its tasks one request at a time (to compare).
ENV_CHAIN: Final = "PILOT_AGENT_CHAIN"

_MSG: Final = struct.Struct("IIIi")  # kind, body length, sequence number, signal (forkserver.c)
_MSG_REQUEST: Final = 1
_MSG_CANCEL: Final = 2
_MSG_SIGNAL: Final = 3
_REC: Final = struct.Struct("II4i5q")  # forkserver.c's struct record
_REC_START: Final = 1
_REC_FAILED: Final = 2
_REC_EXIT: Final = 3
_REC_WITHDRAWN: Final = 4
_KINDS: Final = frozenset((_REC_START, _REC_FAILED, _REC_EXIT, _REC_WITHDRAWN))
_READ: Final = _REC.size * 256

#: Chains a thread has put items on, to be woken when that thread says (:func:`held_wakes`).
_held = threading.local()


def enabled() -> bool:
    """Whether cores whose tasks run one at a time chain them (the default)."""
    return os.environ.get(ENV_CHAIN, "").strip().lower() not in ("0", "no", "false", "off")


class Cancel(NamedTuple):
    """Withdraw the order of ``ref`` if it is queued at this chain's helper (a kill of one not started)."""

    ref: ProcessRef


class Signal(NamedTuple):
    """Signal the process group of the task of request ``seq``, if it still runs."""

    seq: int
    sig: int


class Rusage(NamedTuple):
    """What the engine reads of a ``wait4`` rusage, from the helper's record."""

    ru_utime: float
    ru_stime: float
    ru_maxrss: int  # KiB


@dataclass(slots=True)
class _Sent:
    prep: Prepared
    run: Running | None = None  # once it has started


Item = ProcessOrder | Cancel | Signal | None


@contextmanager
def held_wakes() -> Iterator[None]:
    """The chains this thread hands items to within the block are woken as it ends, not as each item
    comes: a woken chain thread wants the GIL and the engine's lock at once, and while the thread that
    woke it still holds them, the two take turns for each (the agent loop's turn; see Agent)."""
    chains: list[Chain] = []
    _held.chains = chains
    try:
        yield
    finally:
        _held.chains = None
        for chain in chains:
            chain.wake()


class Chain:
    """The spawner of one cpu whose tasks run one at a time (one declared core on it)."""

    def __init__(self, *, spawners: Spawners, engine: ProcessEngine, cpu: int, exe: str, devnull: int) -> None:
        self._spawners = spawners
        self._engine = engine
        self._cpu = cpu
        self._exe = exe
        self._devnull = devnull
        self.queue: SimpleQueue[Item] = SimpleQueue()
        self._wake_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._woken = False  # a wake-up is on its way (put: one eventfd write per burst of items)
        self._ident: int | None = None
        self._sock: socket.socket | None = None
        self._pid = 0
        self._pidfd: int | None = None
        self._seq = 0
        self._sent: dict[int, _Sent] = {}  # sequence number -> what was sent to the helper, until it ends
        self._buf = bytearray()  # records read and not whole yet
        self._retry: list[ProcessOrder] = []  # taken after the helper was found gone: for the next one
        self.thread = threading.Thread(target=self._run, name=f"pilot-chain-{cpu}", daemon=True)

    def put(self, item: Item) -> None:
        """From any thread: hand the chain an order, a cancel or a signal (the chain's own thread reads its
        queue after each batch of records: no wake-up). Within :func:`held_wakes`, the chain is woken when
        that ends."""
        self.queue.put(item)
        if not self._woken and threading.get_ident() != self._ident:
            self._woken = True
            chains: list[Chain] | None = getattr(_held, "chains", None)
            if chains is None:
                self.wake()
            else:
                chains.append(self)

    def wake(self) -> None:
        try:
            os.eventfd_write(self._wake_fd, 1)
        except OSError:
            pass  # closed: the chain has ended

    # -- the chain's thread -----------------------------------------------------------------------

    def _run(self) -> None:
        name_os_thread()
        self._ident = threading.get_ident()
        spawners = self._spawners
        spawner = spawners.spawner(self._cpu, reaps=True)
        spawner.chained = True
        try:
            while spawner.pinned and self._start():
                if self._serve(spawner):
                    return
            # No chained helper (or not pinned): one order at a time, as an unchained spawner.
            self._engine._unchain(self._cpu)
            spawner.chained = False
            spawner.helper = spawners.start_helper()
            try:
                spawners.serve(self.queue, spawner)
            finally:
                if spawner.helper is not None:
                    spawner.helper.close()
        finally:
            self._close()
            os.close(self._wake_fd)

    def _start(self) -> bool:
        """Start a chained helper (pinned like this thread); False, logged, if none starts."""
        self._spawners.seal_fds()
        try:
            self._pid, self._sock, self._pidfd = forkserver.start(
                self._exe, [self._exe, "chain"], devnull=self._devnull
            )
        except OSError as exc:
            log.warning("cannot start the chained spawn helper; spawning one task at a time", error=str(exc))
            return False
        return True

    def _close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
            fd, self._pidfd = self._pidfd, None
            forkserver.stop(self._pid, fd)

    def _serve(self, spawner: _Spawner) -> bool:
        """Serve the queue through the helper: True once stopped, False when the helper is gone (what it
        was sent has failed)."""
        poller = select.poll()
        poller.register(self._wake_fd, select.POLLIN)
        assert self._sock is not None
        poller.register(self._sock.fileno(), select.POLLIN)
        queue = self.queue
        items: list[Item] = list(self._retry)  # (what the last helper never got goes first)
        self._retry.clear()
        stopping = False
        while True:
            self._woken = False  # (before the queue is read: a put after this line writes the eventfd)
            out: list[bytes] = []
            while True:  # until the queue is empty: an order that fails here can free its core for the next
                while not queue.empty():  # (this thread alone takes from it: no Empty raised per pass)
                    items.append(queue.get_nowait())
                if not items:
                    break
                for item in items:
                    if item is None:
                        stopping = True
                        for seq, sent in self._sent.items():
                            if sent.run is None:
                                out.append(_MSG.pack(_MSG_CANCEL, 0, seq, 0))
                    elif isinstance(item, Signal):
                        out.append(_MSG.pack(_MSG_SIGNAL, 0, item.seq, item.sig))
                    elif isinstance(item, Cancel):
                        for seq, sent in self._sent.items():
                            if sent.run is None and (sent.prep.order.job_id, sent.prep.order.slot) == item.ref:
                                out.append(_MSG.pack(_MSG_CANCEL, 0, seq, 0))
                    else:
                        self._request(item, spawner, out)
                items = []
            if (out and not self._send(out, None)) or self._sock is None:
                self._lose()
                return False
            if stopping and not self._sent:
                return True
            for fd, _ in poller.poll():
                if fd == self._wake_fd:
                    try:
                        os.eventfd_read(self._wake_fd)
                    except BlockingIOError:
                        pass
                elif not self._read():
                    self._lose()
                    return False

    def _request(self, order: ProcessOrder, spawner: _Spawner, out: list[bytes]) -> None:
        """Send one order to the helper (appended to ``out`` when it carries no fds, else sent now)."""
        spawners = self._spawners
        engine = self._engine
        if self._sock is None:  # the helper is gone (found in this same pass): the next one starts it
            self._retry.append(order)
            return
        if not engine._taken((order.job_id, order.slot), chained=True):
            engine._never_started(order)
            return
        prep = spawners.prepare(order, spawner)
        try:
            streams = spawners.open_streams(prep)
            body = spawners.request(prep, None)
        except Exception as exc:  # (an _OpenError or a limit refused: the order's; else the agent's)
            spawners.close_files(prep)
            spawners.fail(prep, exc)
            engine._never_started(order, chained=True)
            return
        self._seq = seq = (self._seq + 1) & 0xFFFFFFFF
        self._sent[seq] = _Sent(prep)
        head = _MSG.pack(_MSG_REQUEST, len(body), seq, 0)
        fds = forkserver.stream_fds(streams, devnull=self._devnull)
        if fds is None:
            out += (head, body)
            return
        if out:  # what came before it first: the helper runs them in order
            pending = list(out)
            out.clear()
            if not self._send(pending, None):
                spawners.close_files(prep)
                self._close()  # (every order sent, this one too, fails: _serve finds no socket)
                return
        if not self._send([head, body], fds):
            self._close()
        spawners.close_files(prep)

    def _send(self, parts: list[bytes], fds: tuple[int, int, int] | None) -> bool:
        """False when the helper is gone."""
        if self._sock is None:
            return False
        try:
            if fds is None:
                self._sock.sendall(b"".join(parts))
            else:
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                data = b"".join(parts)
                n = self._sock.sendmsg([data], rights)
                if n < len(data):
                    self._sock.sendall(data[n:])
        except OSError as exc:
            log.error("the chained spawn helper is gone", error=str(exc))
            return False
        return True

    def _read(self) -> bool:
        """Read and act on the helper's records; False when it is gone."""
        assert self._sock is not None
        try:
            data = self._sock.recv(_READ)
        except OSError as exc:
            log.error("the chained spawn helper is gone", error=str(exc))
            return False
        if not data:
            log.error("the chained spawn helper ended")
            return False
        buf = self._buf
        if buf:
            buf += data
            data = bytes(buf)
            buf.clear()
        whole = len(data) - len(data) % _REC.size
        if whole < len(data):
            buf += data[whole:]
        engine = self._engine
        sent = self._sent
        records = list(_REC.iter_unpack(memoryview(data)[:whole]))
        last = len(records) - 1
        i = -1
        while i < last:
            i += 1
            kind, seq, pid, code, step, _, mono_ns, real_ns, utime, stime, maxrss = records[i]
            if seq not in sent or kind not in _KINDS:
                log.error("the chained spawn helper wrote a record it owes none", kind=kind, seq=seq)
                return False  # (it is replaced: what it had fails)
            if kind == _REC_START:
                after = records[i + 1] if i < last else None
                if after is not None and after[0] == _REC_EXIT and after[1] == seq and after[2] == pid:
                    # Its exit is the next record (a short task's, in a batch): both in one step.
                    prep = sent[seq].prep
                    if prep.env_file is None:
                        i += 1
                        del sent[seq]
                        rusage = Rusage(after[8] / 1e6, after[9] / 1e6, after[10])
                        engine._ran(prep.order, pid, real_ns / 1e9, mono_ns / 1e9, after[3], rusage, after[6] / 1e9)
                        continue
                self._started(sent[seq], seq, pid, mono_ns, real_ns)
            elif kind == _REC_EXIT:
                engine._finish(pid, code, Rusage(utime / 1e6, stime / 1e6, maxrss), mono_ns / 1e9)
                del sent[seq]
            else:
                prep = sent.pop(seq).prep
                order = prep.order
                if kind == _REC_FAILED:
                    self._spawners.fail(prep, SpawnError(code, step))
                else:  # withdrawn: a kill of an order not started (Cancel), or the agent's stop
                    reason = engine._cancel_reason((order.job_id, order.slot))
                    data_ = {"reason": reason, "spawned": False}
                    engine._emit(TaskEvent(order.job_id, order.slot, "exited", time.time(), data_))
                engine._never_started(order, chained=True)
        return True

    def _started(self, sent: _Sent, seq: int, pid: int, mono_ns: int, real_ns: int) -> None:
        order = sent.prep.order
        signal = functools.partial(self._signal, seq)
        sent.run, event = sent.prep.running(pid, None, real_ns / 1e9, mono_ns / 1e9, signal)
        self._engine._started((order.job_id, order.slot), sent.run, event, reaps=True, chained=True)

    def _signal(self, seq: int, sig: int) -> None:
        self.put(Signal(seq, sig))

    def _lose(self) -> None:
        """The helper is gone: what it was sent fails (a task it had started is killed by its mark: its
        exit status is lost); the next orders go to a new helper."""
        engine = self._engine
        lost, self._sent = self._sent, {}
        for sent in lost.values():
            order = sent.prep.order
            if sent.run is not None:
                engine._lost(sent.run, "the spawn helper ended while the task ran: its exit status is lost")
            else:
                engine._sent_to_chain(-1)
                message = "the spawn helper ended before it reported this task's start: it may have run"
                engine._emit(TaskEvent(order.job_id, order.slot, "failed", time.time(), {"message": message}))
                engine._lost_order(sent.prep.tag, order)
        self._buf.clear()
        self._close()

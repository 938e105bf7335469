"""Driving plain (synchronous) ZeroMQ sockets from one anyio task, without zmq.asyncio's futures.

ZeroMQ's FD is edge-like: it signals that ``ZMQ_EVENTS`` must be re-read, and any send or receive on
the socket may consume that signal. So one task owns its sockets (every send and receive happens in
it), drains them with NOBLOCK calls, and only then waits: on one epoll fd holding the sockets' FDs and
a wake pipe, which other tasks and threads write to after changing state the owner must act on.
Part of the protocol layer shared by daemon and agents, like :mod:`pilot.wire`.
"""

from __future__ import annotations

import asyncio
import math
import os
import select
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final

import anyio
import anyio.lowlevel
import zmq
import zmq.backend

_POLLIN: Final = int(zmq.POLLIN)  # a plain int: ``events & zmq.POLLIN`` goes through enum.Flag, twice the cost
_EVENTS: Final = int(zmq.EVENTS)
#: Plain ints for the flags of each call (pyzmq's multipart calls combine enum.Flag members per frame).
_NOBLOCK: Final = int(zmq.NOBLOCK)
_SEND_MORE: Final = int(zmq.SNDMORE | zmq.NOBLOCK)
_NO_LOCK: Final = nullcontext()
#: The send under pyzmq's ``Socket.send``, a Python wrapper that only adds draft sockets' routing ids and
#: groups (never used here): a frame less per part, six per lone job's turn in the daemon. Only for the
#: plain sockets this module drives (zmq.asyncio's ``send`` is another, returning futures).
_send: Final = zmq.backend.Socket.send


class Waiter:
    """``polled``: its sockets are looked at with one ``zmq_poll`` (see :func:`drain`), not a ``getsockopt``
    each: for an owner whose process has no other thread that competes for the GIL (the daemon)."""

    def __init__(self, *, polled: bool = False) -> None:
        self._epoll = select.epoll()
        self._sockets: list[zmq.Socket[Any]] = []
        self._items: list[tuple[zmq.Socket[Any], int]] | None = [] if polled else None
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._epoll.register(self._rfd, select.EPOLLIN)
        self._poked = False
        self._pipe_seen = False  # the wake pipe was seen readable: read it at the next turn
        #: Under asyncio the epoll fd stays registered with the loop between waits (a reader that sets
        #: ``_woken``), instead of anyio.wait_readable's add/remove per wait: two epoll_ctl calls, a
        #: backend lookup and an Event per wake-up, paid per message burst.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._woken: asyncio.Future[bool] | None = None

    def add(self, sock: zmq.Socket[Any]) -> None:
        self._sockets.append(sock)
        if self._items is not None:
            self._items.append((sock, _POLLIN))
        fd = sock.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self._epoll.register(fd, select.EPOLLIN)

    def poke(self) -> None:
        """Wake the owner (from any task or thread). Coalesced: one byte per wait at most."""
        if not self._poked:
            self._poked = True
            try:
                os.write(self._wfd, b"\0")
            except BlockingIOError:
                pass

    def readable(self, sock: zmq.Socket[Any]) -> bool:
        events: int = sock.getsockopt(_EVENTS)  # type: ignore[assignment]
        return bool(events & _POLLIN)

    def _due(self) -> bool:
        """Poked, or a socket has input (reading ZMQ_EVENTS also clears a socket FD's signal)."""
        if self._poked:
            return True
        if self._items is not None:
            return bool(zmq.zmq_poll(self._items, 0))
        for s in self._sockets:
            if self.readable(s):
                return True
        return False

    async def wait(self, until: float | None = None) -> bool:
        """Return when a socket has input or someone poked: True; or, with ``until`` (a
        ``time.monotonic()`` value), at that time if neither came first: False. A deadline costs a
        timer, not a cancel scope around the wait (twice the CPU of the wait itself).

        A ZeroMQ fd also signals internal commands (a peer's read acknowledgement after each send, ...),
        and an epoll fd watched by another epoll (the event loop's) can be reported ready after the
        signal that made it so is gone: under asyncio such wake-ups are told apart and absorbed in the
        loop's reader callback, without resuming the owner task, instead of costing it a loop turn.

        Input already there still lets the event loop run once first: an owner that always finds input
        (a daemon flooded by heartbeats) must not starve the other tasks (signals, the parent watch)."""
        if self._due():
            self._clear()
            await anyio.lowlevel.checkpoint()
            return True
        delay = None if until is None else until - time.monotonic()
        if delay is not None and delay <= 0:
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another anyio backend
            return await self._wait_other(delay)
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._epoll.fileno())
            loop.add_reader(self._epoll.fileno(), self._on_readable)
            self._loop = loop
        woken: asyncio.Future[bool] = loop.create_future()
        self._woken = woken
        timer = None if delay is None else loop.call_later(delay, self._on_timeout)
        try:
            await woken
        finally:
            self._woken = None
            if timer is not None:
                timer.cancel()
        result = woken.result()
        if result:
            self._clear()
        return result

    def block(self, until: float, *, lock: AbstractContextManager[Any] = _NO_LOCK) -> bool:
        """:meth:`wait` for a loop that has a thread of its own: blocks that thread, until ``until`` (a
        ``time.monotonic()`` value) at the latest. A plain epoll wait costs a fifth of an event loop's
        wake-up and timer (5 vs 25-45 us of CPU each time here). ``lock``: held while the sockets are
        looked at, for owners that let other threads use them while this one sleeps (never at once)."""
        while True:
            with lock:
                if self._due():
                    break
            left = until - time.monotonic()
            if left <= 0:
                return False
            if any(fd == self._rfd for fd, _ in self._epoll.poll(left)):
                self._pipe_seen = True
                break
        self._clear()
        return True

    async def _wait_other(self, delay: float | None) -> bool:
        deadline = None if delay is None else anyio.current_time() + delay
        while True:
            left = math.inf if deadline is None else deadline - anyio.current_time()
            if left <= 0:
                return False
            with anyio.move_on_after(left):
                await anyio.wait_readable(self._epoll.fileno())
            if self._woke(self._epoll.poll(0)):
                self._clear()
                return True

    def _clear(self) -> None:
        """A turn begins: what poked so far is seen by it (a poke from now on wakes the next wait)."""
        if self._poked or self._pipe_seen:
            try:
                os.read(self._rfd, 4096)
            except BlockingIOError:
                pass
            self._poked = self._pipe_seen = False

    def _on_readable(self) -> None:
        woken = self._woken
        if woken is None:
            # Readable while nobody waits (the owner is busy, or done): stop watching until the next
            # wait, so a level-triggered fd cannot spin the loop.
            if self._loop is not None:
                self._loop.remove_reader(self._epoll.fileno())
                self._loop = None
            return
        if woken.done():
            return
        # poll(0) drops stale entries from the epoll's ready list (else the loop's epoll reports it again).
        if self._woke(self._epoll.poll(0)):
            woken.set_result(True)

    def _woke(self, ready: list[tuple[int, int]]) -> bool:
        """Whether what the epoll reported (``ready``) is a wake-up for the owner."""
        if self._poked:
            return True
        if any(fd == self._rfd for fd, _ in ready):
            self._pipe_seen = True  # a byte without the flag: a poke that raced the end of the previous turn
            return True
        if not ready:
            return False
        if self._due():
            return True
        self._epoll.poll(0)  # the sockets' signals were commands only, cleared by _due: drop them too
        return False

    def _on_timeout(self) -> None:
        if self._woken is not None and not self._woken.done():
            self._woken.set_result(False)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._epoll.fileno())
        self._loop = None
        self._epoll.close()
        os.close(self._rfd)
        os.close(self._wfd)


class Progress:
    """A signal that something happened (e.g. a flush), for tasks that wait for the next one. Signalling
    with no waiter costs nothing: a fresh anyio.Event (a backend lookup) is made only once one was taken."""

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def event(self) -> anyio.Event:
        """The event the next :meth:`notify` sets."""
        if self._event is None:
            self._event = anyio.Event()
        return self._event

    def notify(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None


def drain(sock: zmq.Socket[Any], limit: int, *, polled: bool = False) -> list[list[bytes]]:
    """Up to ``limit`` waiting multipart messages, without blocking. ZMQ_EVENTS says when none is left:
    a receive that fails with EAGAIN raises, and pyzmq's exception costs several times the check. Each
    part is read as a frame that says whether more follow (a message arrives whole): not
    ``recv_multipart``, whose look at ZMQ_RCVMORE per part costs more than the part's own receive.

    ``polled``: ZMQ_EVENTS read through ``zmq_poll`` (which reads it too), not ``getsockopt``: a third of
    the instructions, as pyzmq's getsockopt turns the option into an enum member first (half its cost),
    paid twice per socket by a turn that finds one message. ``zmq_poll`` lets go of the GIL meanwhile:
    for a process whose other threads do not compete for it (the daemon's I/O loop)."""
    out: list[list[bytes]] = []
    items = [(sock, _POLLIN)] if polled else None
    while len(out) < limit and (
        zmq.zmq_poll(items, 0) if items is not None else sock.getsockopt(_EVENTS) & _POLLIN  # type: ignore[operator]
    ):
        try:
            frame = sock.recv(_NOBLOCK, copy=False)
        except zmq.Again:
            break
        parts = [frame.bytes]
        while frame.more:
            frame = sock.recv(_NOBLOCK, copy=False)
            parts.append(frame.bytes)
        out.append(parts)
    return out


def send_parts(sock: zmq.Socket[Any], parts: list[bytes]) -> None:
    """``sock.send_multipart(parts, zmq.NOBLOCK)`` with plain int flags (half the cost), on a plain
    (not zmq.asyncio) socket. A message is taken whole or not at all: only its first part can meet the
    high-water mark (zmq.Again)."""
    last = len(parts) - 1
    for i, part in enumerate(parts):
        _send(sock, part, _SEND_MORE if i < last else _NOBLOCK)

"""Driving plain (synchronous) ZeroMQ sockets from one anyio task, without zmq.asyncio's futures.

ZeroMQ's FD is edge-like: it signals that ``ZMQ_EVENTS`` must be re-read, and any send or receive on
the socket may consume that signal. So one task owns its sockets (every send and receive happens in
it), drains them with NOBLOCK calls, and only then waits: on one epoll fd holding the sockets' FDs and
a wake pipe, which other tasks and threads write to after changing state the owner must act on.
Part of the protocol layer shared by daemon and agents, like :mod:`pilot.wire`.
"""

from __future__ import annotations

import asyncio
import os
import select
from typing import Any

import anyio
import zmq


class Waiter:
    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._sockets: list[zmq.Socket[Any]] = []
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._epoll.register(self._rfd, select.EPOLLIN)
        self._poked = False
        #: Under asyncio the epoll fd stays registered with the loop between waits (a reader that sets
        #: ``_woken``), instead of anyio.wait_readable's add/remove per wait: two epoll_ctl calls, a
        #: backend lookup and an Event per wake-up, paid per message burst.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._woken: asyncio.Future[None] | None = None

    def add(self, sock: zmq.Socket[Any]) -> None:
        self._sockets.append(sock)
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
        events = sock.getsockopt(zmq.EVENTS)
        assert isinstance(events, int)
        return bool(events & zmq.POLLIN)

    async def wait(self) -> None:
        """Return when a socket has input or someone poked (bound it with a cancel scope). A ZeroMQ fd
        also signals internal commands (a peer's read acknowledgement after each send, ...): those
        wake-ups are absorbed here instead of costing the owner a pass over its sockets and outboxes."""
        while not self._poked and not any(self.readable(s) for s in self._sockets):
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # another anyio backend
                await anyio.wait_readable(self._epoll.fileno())
            else:
                await self._wait_asyncio(loop)
            try:
                if os.read(self._rfd, 4096):
                    break  # poked (the flag may already be cleared: a poke racing the previous wait)
            except BlockingIOError:
                pass
        try:
            os.read(self._rfd, 4096)
        except BlockingIOError:
            pass
        self._poked = False

    async def _wait_asyncio(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._epoll.fileno())
            loop.add_reader(self._epoll.fileno(), self._on_readable)
            self._loop = loop
        woken = self._woken = loop.create_future()
        try:
            await woken
        finally:
            self._woken = None

    def _on_readable(self) -> None:
        if self._woken is None:
            # Readable while nobody waits (the owner is busy, or done): stop watching until the next
            # wait, so a level-triggered fd cannot spin the loop.
            if self._loop is not None:
                self._loop.remove_reader(self._epoll.fileno())
                self._loop = None
        elif not self._woken.done():
            self._woken.set_result(None)

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


def drain(sock: zmq.Socket[Any], limit: int) -> list[list[bytes]]:
    """Up to ``limit`` waiting multipart messages, without blocking."""
    out: list[list[bytes]] = []
    for _ in range(limit):
        try:
            out.append(sock.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            break
    return out

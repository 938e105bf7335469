"""Driving plain (synchronous) ZeroMQ sockets from one anyio task, without zmq.asyncio's futures.

ZeroMQ's FD is edge-like: it signals that ``ZMQ_EVENTS`` must be re-read, and any send or receive on
the socket may consume that signal. So one task owns its sockets (every send and receive happens in
it), drains them with NOBLOCK calls, and only then waits: on one epoll fd holding the sockets' FDs and
a wake pipe, which other tasks and threads write to after changing state the owner must act on.
Part of the protocol layer shared by daemon and agents, like :mod:`pilot.wire`.
"""

from __future__ import annotations

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
        """Return when a socket has input or someone poked (bound it with a cancel scope)."""
        if not self._poked and not any(self.readable(s) for s in self._sockets):
            await anyio.wait_readable(self._epoll.fileno())
        try:
            os.read(self._rfd, 4096)
        except BlockingIOError:
            pass
        self._poked = False

    def close(self) -> None:
        self._epoll.close()
        os.close(self._rfd)
        os.close(self._wfd)


def drain(sock: zmq.Socket[Any], limit: int) -> list[list[bytes]]:
    """Up to ``limit`` waiting multipart messages, without blocking."""
    out: list[list[bytes]] = []
    for _ in range(limit):
        try:
            out.append(sock.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            break
    return out

"""One socket to the daemon and its monitor: one connection, up after the handshake, over at the first
disconnect.

Owned by the I/O thread (the reader of the moment): it makes a link, watches its monitor and closes it.
The socket itself is used only under the connection's socket lock, by the reader, or by a caller that
sends on the live link directly (ZeroMQ asks a full memory barrier of a socket used from several
threads). A link is never reconnected (``RECONNECT_IVL`` -1): frames queued on it die with it, and the
reader makes a new one.
"""

from __future__ import annotations

import time
from typing import Final

import structlog
import zmq
from zmq.backend import zmq_poll
from zmq.utils.monitor import recv_monitor_message

from pilot import wire
from pilot.security import Credentials
from pilot.wire.curve import handshake_failure, secure_client

log = structlog.get_logger("client")

CONNECT_TIMEOUT: Final = 2.0  # one connection attempt, socket created to handshake done
POLLIN: Final = int(zmq.POLLIN)  # plain ints: enum.Flag's operators cost more than the socket option
POLLOUT: Final = int(zmq.POLLOUT)
_DOWN_EVENTS: Final = frozenset(
    {
        zmq.EVENT_DISCONNECTED,
        zmq.EVENT_CLOSED,
        zmq.EVENT_MONITOR_STOPPED,
        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
        zmq.EVENT_HANDSHAKE_FAILED_AUTH,
    }
)


class Link:
    """One socket, one connection: up after the handshake, finished at the first disconnect."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], url: str, credentials: Credentials | None = None) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        if credentials is not None:
            secure_client(self.sock, credentials)  # CURVE, pinning the daemon's key: no impostor gets a frame
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
        self.sock.setsockopt(zmq.RECONNECT_IVL, -1)  # never reconnect this socket: frames queued on it die with it
        self.fd: int = self.sock.getsockopt(zmq.FD)  # type: ignore[assignment]  # polled instead of the socket
        #: What :func:`socket_events` asks zmq_poll about, made once.
        self.items: list[tuple[zmq.Socket[bytes], int]] = [(self.sock, POLLIN | POLLOUT)]
        try:
            self.mon = self.sock.get_monitor_socket(zmq.EVENT_ALL)
        except zmq.ZMQError:
            self.sock.close(linger=0)
            raise
        try:
            self.sock.connect(url)
        except zmq.ZMQError:
            self.close()
            raise
        self.up = False
        self.deadline = time.monotonic() + CONNECT_TIMEOUT

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.mon.close(linger=0)
        self.sock.close(linger=0)

    def monitor(self, url: str, refused: str | None) -> tuple[bool, bool, str | None]:
        """(came up, went down, why the handshake was refused) from the monitor's events; ``refused`` is
        the reason known so far (None once a handshake succeeds)."""
        came_up = down = False
        while self.mon.poll(0):
            message = recv_monitor_message(self.mon)
            event = message["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED and not self.up:
                self.up = came_up = True
                refused = None
            elif event in _DOWN_EVENTS:
                down = True
                reason = handshake_failure(event, int(message["value"]), server=False)
                if reason is not None and refused is None:  # once until a handshake succeeds
                    log.warning("handshake with the pilot failed", url=url, reason=reason)
                if reason is not None and (refused is None or event != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
                    refused = reason  # a precise reason is not replaced by "closed during the handshake"
        return came_up, down, refused


def socket_events(link: Link) -> int:
    """The socket's ZMQ_EVENTS (the socket lock held); also clears its FD's signal. Read by a zmq_poll
    that does not wait, which reads ZMQ_EVENTS as getsockopt does, for a third of the instructions:
    pyzmq's getsockopt passes the option through a Python enum (~10,000 instructions, several times
    per job)."""
    ready = zmq_poll(link.items, 0)
    return int(ready[0][1]) if ready else 0

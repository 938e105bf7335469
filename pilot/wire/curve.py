"""CURVE and ZAP on ZeroMQ sockets: servers that only admit this pilot's keys, clients that only talk to
the holder of the daemon's key, the ZAP handler that decides, and a log of the handshakes that fail.

The keys themselves (where they live, how agents and remote clients get theirs) are :mod:`pilot.security`'s.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from typing import Any, Final

import anyio
import anyio.abc
import structlog
import zmq
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from pilot.security import Credentials, KeyPair, SecurityError

log = structlog.get_logger("pilot.security")

#: Where libzmq sends ZAP requests (fixed by RFC 27).
ZAP_ENDPOINT: Final = "inproc://zeromq.zap.01"


def secure_server(sock: zmq.Socket[Any], keys: KeyPair, *, domain: str) -> None:
    """Make endpoints bound *from now on* CURVE servers whose peers ZAP ``domain`` must admit.

    libzmq copies security options into each endpoint at bind time, so an ``ipc://`` endpoint bound
    before this call stays NULL (file-system protected) while the tcp one bound after is CURVE.
    ``ZAP_ENFORCE_DOMAIN`` fails closed: with no ZAP handler, every peer is refused (without it,
    libzmq would admit any key).
    """
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.ZAP_DOMAIN, domain.encode())
    try:
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    except zmq.ZMQError:  # a libzmq built without it: only the authenticator's start() order protects
        log.warning("this libzmq cannot enforce ZAP; start the ZapAuthenticator before binding", domain=domain)


def secure_client(sock: zmq.Socket[Any], creds: Credentials) -> None:
    """Make connections made *from now on* CURVE clients that talk only to the holder of the daemon's secret
    key: a process that steals the port cannot complete the handshake, so nothing is sent to it."""
    sock.setsockopt(zmq.CURVE_SERVERKEY, creds.server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, creds.keys.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, creds.keys.secret)


class _Throttle:
    """At most one log line per key per ``interval``; the others are counted, so a reconnect storm
    (a peer retrying every 100 ms) cannot flood the log."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._last: dict[Any, tuple[float, int]] = {}

    def __call__(self, key: Any) -> int | None:
        """None to stay quiet, else how many were suppressed since the last line."""
        now = time.monotonic()
        last, suppressed = self._last.get(key, (-self.interval, 0))
        if now - last < self.interval:
            self._last[key] = (last, suppressed + 1)
            return None
        if len(self._last) > 4096:
            self._last.clear()
        self._last[key] = (now, 0)
        return suppressed


async def wait_readable(sock: zmq.Socket[Any]) -> None:
    """Until ``sock`` (a plain, synchronous socket) has a message, without blocking the event loop.

    ZMQ_FD is edge-like: it only says ZMQ_EVENTS must be re-read, so that is checked before sleeping.
    Only the task that owns ``sock`` may call this (one waiter per file descriptor).
    """
    fd = sock.getsockopt(zmq.FD)
    assert isinstance(fd, int)
    while True:
        events = sock.getsockopt(zmq.EVENTS)
        assert isinstance(events, int)
        if events & zmq.POLLIN:
            return
        await anyio.wait_readable(fd)


def _plain(ctx: zmq.Context[Any]) -> zmq.Context[zmq.Socket[bytes]]:
    """A synchronous view of ``ctx`` (which may be a ``zmq.asyncio.Context``): same libzmq context,
    so same inproc namespace (ZAP, monitors), but sockets driven with NOBLOCK calls and :func:`wait_readable`."""
    return zmq.Context.shadow(ctx.underlying)


class ZapAuthenticator:
    """The ZAP handler of a daemon's context: per domain, only the listed CURVE public keys get in.

    Runs as its own task on the daemon's event loop (no thread), on a plain or a ``zmq.asyncio``
    context alike. Refusals are logged with the peer's address and key. Call :meth:`start` before
    binding any endpoint secured by :func:`secure_server`, run :meth:`serve` in the task group, and
    :meth:`close` (idempotent; ``serve`` does it when cancelled) before ``ctx.term()``.
    """

    def __init__(self, ctx: zmq.Context[Any], policy: Mapping[str, Mapping[bytes, str]]) -> None:
        self._ctx = _plain(ctx)
        self._policy: dict[str, dict[bytes, str]] = {d: dict(keys) for d, keys in policy.items()}
        self._sock: zmq.Socket[bytes] | None = None
        self._throttle = _Throttle()
        self.accepted = 0
        self.refused = 0

    def allow(self, domain: str, public_key: bytes, user_id: str) -> None:
        """Admit one more key (e.g. a remote client's), effective for the next handshake."""
        self._policy.setdefault(domain, {})[public_key] = user_id

    def revoke(self, domain: str, public_key: bytes) -> None:
        """Refuse a key from the next handshake on (connections already up stay up)."""
        self._policy.get(domain, {}).pop(public_key, None)

    def start(self) -> None:
        """Bind the ZAP endpoint now (synchronous), so handshakes queue for :meth:`serve` from the start."""
        if self._sock is not None:
            return
        sock = self._ctx.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise SecurityError(
                f"cannot bind the ZAP handler ({exc}): this context already has one (one per context)"
            ) from None
        self._sock = sock

    async def serve(self) -> None:
        """Answer ZAP requests until cancelled."""
        self.start()
        sock = self._sock
        assert sock is not None
        try:
            while True:
                await wait_readable(sock)
                while True:
                    try:
                        request = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    sock.send_multipart(self.decide(request), zmq.NOBLOCK)
        finally:
            self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def decide(self, request: list[bytes]) -> list[bytes]:
        """The reply to one ZAP request (RFC 27): 200 with the key's user id, or 400."""
        if len(request) < 6:
            log.warning("malformed ZAP request", frames=len(request))
            return [b"1.0", request[1] if len(request) > 1 else b"", b"500", b"malformed request", b"", b""]
        version, request_id, domain_b, address_b, _identity, mechanism = request[:6]
        credentials = request[6:]
        domain = domain_b.decode(errors="replace")
        address = address_b.decode(errors="replace")
        key: bytes | None = None
        if mechanism == b"CURVE" and len(credentials) == 1 and len(credentials[0]) == 32:
            key = z85.encode(credentials[0])
        user_id = self._policy.get(domain, {}).get(key) if key is not None and version == b"1.0" else None
        if user_id is not None:
            self.accepted += 1
            log.debug("connection admitted", address=address, domain=domain, user=user_id)
            return [b"1.0", request_id, b"200", b"OK", user_id.encode(), b""]
        self.refused += 1
        reason = (
            f"mechanism {mechanism.decode(errors='replace')}, not CURVE"
            if mechanism != b"CURVE"
            else "public key not authorized"
        )
        suppressed = self._throttle((address, domain, mechanism, key))
        if suppressed is not None:
            log.warning(
                "connection refused",
                address=address,
                domain=domain,
                peer_public=key.decode() if key else None,
                reason=reason,
                **({"suppressed_since_last": suppressed} if suppressed else {}),
            )
        return [b"1.0", request_id, b"400", reason.encode(), b"", b""]


#: Socket-monitor events of failed handshakes (see :func:`handshake_failure`).
HANDSHAKE_EVENTS: Final = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


def _protocol_error(value: int) -> str:
    with contextlib.suppress(ValueError):
        name = zmq.Event(value).name
        if name and name.startswith("PROTOCOL_ERROR_"):
            return name.removeprefix("PROTOCOL_ERROR_").lower().replace("_", " ")
    return f"protocol error {value:#x}"


def handshake_failure(event: int, value: int, *, server: bool) -> str | None:
    """Why a handshake failed, from a socket-monitor event; None for events that are not a failure worth
    a line (on a server, ZAP refusals: :class:`ZapAuthenticator` logs those with the peer's address).

    For a socket that already has a monitor (one per socket), add ``HANDSHAKE_EVENTS`` to its mask and
    call this from its loop instead of running :func:`watch_handshakes`.
    """
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return None if server else f"the daemon refused this key (ZAP status {value})"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return "one side speaks CURVE, the other does not"
        if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            if server:
                return "the peer's handshake does not decrypt: it does not use this daemon's public key"
            return "the server's handshake does not decrypt: it does not hold the daemon's key"
        return _protocol_error(value)
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        reason = f"connection closed during the handshake ({os.strerror(value) if value else 'no detail'})"
        if not server:
            reason += ": the server may not hold the daemon's key (or it is stopping)"
        return reason
    return None


async def watch_handshakes(
    sock: zmq.Socket[Any], *, server: bool, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Log handshakes of ``sock`` (plain or ``zmq.asyncio``) that fail, until cancelled. Start it with
    ``await tg.start(...)`` before the socket binds or connects, so no early handshake goes unwatched.

    On a server this catches peers that never reach ZAP (no CURVE, a wrong daemon key); libzmq's
    monitor names only our endpoint for those, ZAP logs the others with their address. On a client
    (agent) it says why the daemon cannot be reached: an impostor on the port, or a key refused.
    A socket has one monitor at most: one that already has one calls :func:`handshake_failure` instead.
    """
    address = f"inproc://pilot.handshakes.{id(sock):x}"
    sock.monitor(address, HANDSHAKE_EVENTS)
    mon = _plain(sock.context).socket(zmq.PAIR)
    mon.setsockopt(zmq.LINGER, 0)
    mon.connect(address)
    throttle = _Throttle()
    task_status.started()
    try:
        while True:
            await wait_readable(mon)
            while True:
                try:
                    ev = parse_monitor_message(mon.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
                reason = handshake_failure(int(ev["event"]), int(ev["value"]), server=server)
                if reason is None:
                    continue
                endpoint = bytes(ev["endpoint"]).decode(errors="replace")
                suppressed = throttle((endpoint, reason))
                if suppressed is not None:
                    log.warning(
                        "handshake refused" if server else "handshake with the daemon failed",
                        endpoint=endpoint,
                        reason=reason,
                        **({"suppressed_since_last": suppressed} if suppressed else {}),
                    )
    finally:
        with contextlib.suppress(zmq.ZMQError):
            sock.disable_monitor()
        mon.close(linger=0)

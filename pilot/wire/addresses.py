"""Where TCP endpoints bind: narrow by default (loopback for a local allocation, else the address compute
nodes reach this host on), an interface, a host name or an address when configured."""

from __future__ import annotations

import ipaddress
import socket

import psutil
import structlog

from pilot.security import SecurityError

log = structlog.get_logger("pilot.security")


def bind_host(spec: str | None = None, *, local: bool = False) -> str:
    """The address to bind TCP endpoints on, narrow by default.

    ``spec``: an IP address, a host name, or an interface name (``ib0``); ``*`` / ``0.0.0.0`` only when
    asked for explicitly. None: ``127.0.0.1`` for a ``local`` allocation, else the address this host's
    name resolves to (what compute nodes use to reach a login node), else the default route's.
    Resolution may block briefly: call it before the event loop, or through ``anyio.to_thread``.
    """
    if spec in ("*", "0.0.0.0", "::"):
        log.warning("binding on every interface, as configured", bind=spec)
        return "0.0.0.0" if spec == "*" else spec
    if spec is None or spec == "":
        if local:
            return "127.0.0.1"
        addr = _resolve(socket.gethostname())
        if addr is not None and not ipaddress.ip_address(addr).is_loopback:
            return addr
        addr = _route_address()
        if addr is not None:
            return addr
        raise SecurityError(
            "cannot tell which address compute nodes reach this host on; set the bind address in the config "
            "(an IP address, a host name, or an interface name such as ib0)"
        )
    interfaces = psutil.net_if_addrs()
    if spec in interfaces:
        for a in interfaces[spec]:
            if a.family == socket.AF_INET:
                return str(a.address)
        raise SecurityError(f"interface {spec} has no IPv4 address; name another interface or an address")
    try:
        return str(ipaddress.ip_address(spec))
    except ValueError:
        pass
    addr = _resolve(spec)
    if addr is None:
        raise SecurityError(
            f"bind address {spec!r} is neither an IP address, a host name that resolves, nor an interface "
            f"of this host ({', '.join(sorted(interfaces))})"
        )
    return addr


def tcp_endpoint(host: str, port: int | str = "*") -> str:
    """``tcp://host:port`` with IPv6 literals bracketed; port ``*`` lets the system pick a free one."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _resolve(name: str) -> str | None:
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    return str(infos[0][4][0]) if infos else None


def _route_address() -> str | None:
    """The local address of the default route (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
        except OSError:
            return None
        return str(s.getsockname()[0])

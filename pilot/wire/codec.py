"""The wire protocol shared by daemon, agents and clients.

Every ZeroMQ payload frame is one msgpack array ``[version, kind, body]``. Bodies carry lists so that
every hop batches. Frames come from untrusted peers: :func:`decode` checks size, version, kind and
shape and raises :class:`ProtocolError` with a reason; callers log and drop, never crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgpack
import msgspec

PROTOCOL_VERSION: Final = 1
#: Largest frame any socket accepts. Also set as ZMQ_MAXMSGSIZE so zmq drops bigger ones unread.
MAX_FRAME_BYTES: Final = 64 * 1024 * 1024


class Kind:
    """Message kinds. Requests from a client carry ``rid``; the reply echoes it."""

    # client -> daemon
    HELLO: Final = "hello"
    SUBMIT: Final = "submit"
    CANCEL: Final = "cancel"
    CANCEL_WHERE: Final = "cancel_where"  # every unfinished job in a state or a run: 'pilot cancel --state/--run'
    ATTACH: Final = "attach"
    LIST: Final = "list"
    JOBS: Final = "jobs"  # one summary row per job, filtered: 'pilot jobs'
    STATUS: Final = "status"
    SHUTDOWN: Final = "shutdown"
    EXPLAIN: Final = "explain"  # why a job waits (or failed)
    SHOW: Final = "show"  # jobs as SSS Job XML, with State, Delivered and placed Tasks
    NODES: Final = "nodes"  # the nodes as SSS Node XML: Configured, Available, Utilized
    RELEASE: Final = "release"  # lift an SSS <Hold>
    ABANDON: Final = "abandon"  # submit ids a client gave up on: refuse them, cancel what they made
    LEASE: Final = "lease"  # job ids for a client to give its jobs itself (pilot/core/leases.py)
    # daemon -> client
    REPLY: Final = "reply"
    EVENTS: Final = "events"
    # agent -> daemon
    REGISTER: Final = "register"
    HEARTBEAT: Final = "heartbeat"
    TASK_EVENTS: Final = "task_events"
    BYE: Final = "bye"
    # daemon -> agent
    REGISTERED: Final = "registered"
    LAUNCH: Final = "launch"
    KILL: Final = "kill"
    WITHDRAW: Final = "withdraw"  # take back orders still waiting for their cores (not started)
    STOP: Final = "stop"


CLIENT_KINDS: Final = frozenset(
    {
        Kind.HELLO,
        Kind.SUBMIT,
        Kind.CANCEL,
        Kind.CANCEL_WHERE,
        Kind.ATTACH,
        Kind.LIST,
        Kind.JOBS,
        Kind.STATUS,
        Kind.SHUTDOWN,
        Kind.EXPLAIN,
        Kind.SHOW,
        Kind.NODES,
        Kind.RELEASE,
        Kind.ABANDON,
        Kind.LEASE,
    }
)
AGENT_KINDS: Final = frozenset({Kind.REGISTER, Kind.HEARTBEAT, Kind.TASK_EVENTS, Kind.BYE})
TO_CLIENT_KINDS: Final = frozenset({Kind.REPLY, Kind.EVENTS})
TO_AGENT_KINDS: Final = frozenset({Kind.REGISTERED, Kind.LAUNCH, Kind.KILL, Kind.WITHDRAW, Kind.STOP})


class ProtocolError(ValueError):
    """A frame or field that does not follow the protocol; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Message:
    kind: str
    body: dict[str, Any]


def _as_msgpack(obj: Any) -> Any:
    """What msgspec does not write itself, as msgpack's Packer writes it: timestamps, subclasses of scalars.
    (A ``msgpack.ExtType`` is a named tuple, which msgspec writes as an array: the protocol has no ext.)"""
    if isinstance(obj, msgpack.Timestamp):
        return msgspec.msgpack.Ext(-1, obj.to_bytes())
    for base in (str, bytes, int, float):
        if isinstance(obj, base):
            return base(obj)  # type: ignore[arg-type]
    raise TypeError(f"can not serialize {type(obj).__name__!r} object")


#: Writes every frame and value: the bytes msgpack's ``Packer(use_bin_type=True)`` writes, for half its
#: instructions (a SUBMIT of one job: 2.7k, not 6.8k).
_encoder = msgspec.msgpack.Encoder(enc_hook=_as_msgpack)
_packer = msgpack.Packer(use_bin_type=True)  # the headers of frames put together from parts


def encode(kind: str, body: Mapping[str, Any]) -> bytes:
    return _encoder.encode((PROTOCOL_VERSION, kind, body))


def frame_head(kind: str, name: str) -> bytes:
    """The first bytes of ``encode(kind, {name: value})``, up to the value: a frame whose one field is
    put together from parts already packed is this, then the value's bytes."""
    head: bytes = (
        _packer.pack_array_header(3) + pack(PROTOCOL_VERSION) + pack(kind) + _packer.pack_map_header(1) + pack(name)
    )
    return head


def array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items (its items' bytes follow)."""
    header: bytes = _packer.pack_array_header(n)
    return header


def pack(value: Any) -> bytes:
    return _encoder.encode(value)


def decode(frame: bytes, *, allowed: frozenset[str], max_bytes: int = MAX_FRAME_BYTES) -> Message:
    """Decode one frame from an untrusted peer, accepting only the ``allowed`` kinds."""
    if len(frame) > max_bytes:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds the limit of {max_bytes}")
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"not a msgpack frame: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, list) or len(obj) != 3:
        raise ProtocolError("frame is not a [version, kind, body] array")
    version, kind, body = obj
    if type(version) is not int or version != PROTOCOL_VERSION:  # True and 1.0 compare equal to 1
        raise ProtocolError(f"protocol version {version!r} is not supported (this side speaks {PROTOCOL_VERSION})")
    if not isinstance(kind, str) or kind not in allowed:
        raise ProtocolError(f"unknown message kind {kind!r}")
    if not isinstance(body, dict):
        raise ProtocolError(f"body of {kind!r} is not a map")
    return Message(kind, body)


# -- typed field access for bodies from untrusted peers ---------------------------------------


def field(body: Mapping[str, Any], name: str, typ: type[Any] | tuple[type[Any], ...]) -> Any:
    """Required field of the given type (bool is not accepted where int is asked)."""
    if name not in body:
        raise ProtocolError(f"missing field {name!r}")
    value = body[name]
    if type(value) is typ:  # the usual case, at once: exactly the type asked (a bool only where bool is)
        return value
    return _check(name, value, typ)


def opt_field(body: Mapping[str, Any], name: str, typ: type[Any] | tuple[type[Any], ...], default: Any = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if type(value) is typ:  # (as in field)
        return value
    return _check(name, value, typ)


def _check(name: str, value: Any, typ: type[Any] | tuple[type[Any], ...]) -> Any:
    types = typ if isinstance(typ, tuple) else (typ,)
    if isinstance(value, bool) and bool not in types:
        raise ProtocolError(f"field {name!r} must be {_names(types)}, not a boolean")
    if not isinstance(value, types):
        raise ProtocolError(f"field {name!r} must be {_names(types)}, not {type(value).__name__}")
    return value


def _names(types: tuple[type[Any], ...]) -> str:
    return " or ".join(t.__name__ for t in types)


def str_list(body: Mapping[str, Any], name: str) -> list[str]:
    value = field(body, name, list)
    if not all(isinstance(v, str) for v in value):
        raise ProtocolError(f"field {name!r} must be a list of strings")
    return list(value)


_INT = frozenset({int})


def int_list(body: Mapping[str, Any], name: str) -> list[int]:
    value = field(body, name, list)
    if not set(map(type, value)) <= _INT:  # in C: a node's processors are checked at every REGISTER
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ProtocolError(f"field {name!r} must be a list of integers")
    return list(value)

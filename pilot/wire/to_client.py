"""What a client reads from the pilot, decoded once: an EVENTS frame's job statuses, or a REPLY's body.

Two such frames come per job on a round trip, each hostile input. A frame as the daemon writes it is
decoded and checked in one pass in C against its exact shape (msgspec, as an agent decodes a LAUNCH:
``pilot/model/process_order.py``), for half the cost of unpacking it, then checking it in Python. That
pass is stricter than the full check, never looser, and builds the same values: a frame it does not
take -- malformed, or merely unusual (a key that is no string, a binary or ext value, nesting deeper
than a Delivered's) -- is unpacked and checked field by field (:func:`pilot.wire.codec.decode`,
:meth:`StatusReport.from_wire`), which accepts it or says what is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal, cast

import msgspec

from pilot.wire.codec import MAX_FRAME_BYTES, TO_CLIENT_KINDS, Kind, ProtocolError, frame_head
from pilot.wire.codec import decode as decode_frame
from pilot.wire.messages import StatusReport


def _nested(depth: int) -> Any:
    """A value as msgpack unpacks it (``strict_map_key``: string keys) that nests at most ``depth`` deep,
    binary and ext values left out."""
    scalar: Any = str | int | float | bool | None
    value = scalar
    for _ in range(depth):
        value = scalar | list[value] | dict[str, value]  # type: ignore[valid-type]
    return value


#: Nesting deep enough for a Delivered's ``tasks`` ([group, task, node, cores, gpus, process] each), and a
#: SUBMIT reply's results.
_VALUE: Final = _nested(5)


class _Reported(StatusReport):
    """A StatusReport as msgspec builds it from the wire, in C: its fields of the types
    :meth:`StatusReport.from_wire` takes (a job id, never None)."""

    __slots__ = ()
    job_id: str
    metadata: dict[str, _VALUE] | None  # type: ignore[valid-type]


_STATUSES: Final = cast("msgspec.msgpack.Decoder[list[StatusReport]]", msgspec.msgpack.Decoder(list[_Reported]))
_EVENTS_HEAD: Final = frame_head(Kind.EVENTS, "events")  # then the statuses: the daemon's EVENTS frame
_EVENTS_AT: Final = len(_EVENTS_HEAD)
_REPLY: Final = msgspec.msgpack.Decoder(tuple[Literal[1], Literal["reply"], dict[str, _VALUE]])  # type: ignore[valid-type]


#: An EVENTS frame read: its job statuses that pass the check, and what is wrong with each of the others.
Events = tuple[list[StatusReport], Sequence[str]]


def decode_to_client(frame: bytes) -> Events | dict[str, Any]:
    """An EVENTS frame's statuses, or a REPLY's body; ProtocolError for a frame that is neither."""
    if len(frame) <= MAX_FRAME_BYTES:
        try:
            if frame.startswith(_EVENTS_HEAD):
                statuses: list[StatusReport] = _STATUSES.decode(frame[_EVENTS_AT:])
                return statuses, ()
            body: dict[str, Any] = _REPLY.decode(frame)[2]
            return body
        except (msgspec.MsgspecError, UnicodeDecodeError):  # (a string that is no UTF-8 raises the latter)
            pass
    return _checked(frame)


def _checked(frame: bytes) -> Events | dict[str, Any]:
    """:func:`decode_to_client` the long way: unpacked, then checked field by field."""
    m = decode_frame(frame, allowed=TO_CLIENT_KINDS)
    if m.kind != Kind.EVENTS:
        return m.body
    statuses: list[StatusReport] = []
    malformed: list[str] = []
    raw = m.body.get("events")
    for e in raw if isinstance(raw, list) else ():
        try:
            statuses.append(StatusReport.from_wire(e))
        except ProtocolError as exc:
            malformed.append(str(exc))
    return statuses, malformed

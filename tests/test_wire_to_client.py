"""What a client reads (pilot/wire/to_client.py): the one-pass decoding of EVENTS and REPLY frames takes
exactly what the field-by-field check takes, builds the same statuses and bodies, and is what a daemon's
frames take; anything else goes the long way, which refuses it or drops its bad statuses as before."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import pytest
from fuzzing import UNIT, _frames, _ints, _or_wrong, _text, _values
from hypothesis import example, given
from hypothesis import strategies as st

from pilot import wire
from pilot.wire import Kind, ProtocolError, to_client
from pilot.wire.messages import StatusReport
from pilot.wire.to_client import decode_to_client

#: A COMPLETED as the daemon sends it: its Delivered with the task's start and its tasks (pilot/core/outcome.py).
_DELIVERED = {
    "wall_duration": 0.0021,
    "user_cpu_time": 0.001,
    "system_cpu_time": 0.0,
    "max_rss": 1 << 20,
    "processors": 1,
    "gpus": 0,
    "consumption_rate": 0.47,
    "nodes": ["n-0"],
    "processes": 1,
    "stage_in_cache_hits": 2,
    "exit_code": 0,
    "signal": None,
    "started": 1.7e9,
    "tasks": [
        [0, 0, "n-0", [3], [], {"pid": 41, "wall_duration": 0.0021, "max_rss": 1 << 20, "slot": 0, "exit_code": 0}]
    ],
}
_COMPLETED = ["17", "COMPLETED", 1.7e9 + 1, 0, None, _DELIVERED]


def _slow_only(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(_: Any) -> Any:
        raise AssertionError("the one-pass decoding did not take the frame")

    monkeypatch.setattr(to_client, "_checked", refuse)


def _events(frame: bytes) -> to_client.Events:
    read = decode_to_client(frame)
    assert isinstance(read, tuple), read
    return read


def _outcome(frame: bytes, decode: Any) -> str:
    """What a decoder makes of ``frame``, written out (repr tells 1 from 1.0 and shows NaN as itself)."""
    try:
        read = decode(frame)
    except ProtocolError as exc:
        return f"refused: {exc}"
    if isinstance(read, tuple):
        assert all(isinstance(s, StatusReport) for s in read[0])
        return repr(("events", [tuple(s) for s in read[0]], list(read[1])))
    return repr(("reply", read))


@pytest.mark.timeout(30)
def test_a_daemons_events_take_the_one_pass_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    queued = ["18", "QUEUED", 1.7e9, None, None, None]
    frame = wire.encode(Kind.EVENTS, {"events": [_COMPLETED, queued]})  # as pilot/delivery.py writes it
    want = _outcome(frame, to_client._checked)
    _slow_only(monkeypatch)
    statuses, malformed = _events(frame)
    assert statuses == [StatusReport(*_COMPLETED), StatusReport(*queued)] and not malformed  # type: ignore[arg-type]
    assert all(isinstance(s, StatusReport) for s in statuses)
    assert _outcome(frame, decode_to_client) == want


@pytest.mark.timeout(30)
def test_a_daemons_submit_reply_takes_the_one_pass_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"results": [{"id": "17", "time": 1.7e9}, {"error": "no"}, {"retry": True}], "rid": 4}
    frame = wire.encode(Kind.REPLY, body)
    _slow_only(monkeypatch)
    assert decode_to_client(frame) == body


@pytest.mark.timeout(30)
def test_a_status_time_sent_as_an_integer_reads_back_as_a_float() -> None:
    (status,), _ = _events(wire.encode(Kind.EVENTS, {"events": [["1", "QUEUED", 5, None, None, None]]}))
    assert type(status.time) is float and status.time == 5.0


@pytest.mark.timeout(30)
def test_a_bad_status_is_dropped_with_its_reason_and_the_others_kept() -> None:
    frame = wire.encode(Kind.EVENTS, {"events": [["1", "QUEUED", True, None, None, None], _COMPLETED]})
    statuses, malformed = _events(frame)
    assert statuses == [StatusReport(*_COMPLETED)]  # type: ignore[arg-type]
    assert list(malformed) == ["a job status has wrong field types"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ({"tasks": [[0, {1: 2}]]}, "not a msgpack frame"),  # a key that is no string, deep inside: refused whole
        ({"nodes": [msgpack.ExtType(5, b"x")]}, None),  # an ext value: taken the long way
        ({"x": b"\x00"}, None),  # binary
        ({"x": [[[[[[[["deep"]]]]]]]]}, None),  # deeper than the one pass goes
    ],
)
def test_what_the_one_pass_does_not_take_is_read_as_before(metadata: dict[str, Any], says: str | None) -> None:
    frame = msgpack.packb([1, Kind.EVENTS, {"events": [["1", "FAILED", 1.0, 1, "m", metadata]]}], use_bin_type=True)
    got = _outcome(frame, decode_to_client)
    assert got == _outcome(frame, to_client._checked)
    assert got.startswith(f"refused: {says}") if says else "FAILED" in got


@pytest.mark.timeout(30)
def test_a_status_whose_key_is_no_utf8_is_refused_as_a_bad_frame() -> None:
    # The agent's lesson (test_wire_messages.py): msgspec raises UnicodeDecodeError for such a string.
    good = wire.encode(Kind.EVENTS, {"events": [_COMPLETED]})
    bad = good.replace(b"\xa7max_rss", b"\xa7\x80ax_rss", 1)
    assert bad != good
    with pytest.raises(ProtocolError, match="not a msgpack frame: UnicodeDecodeError"):
        decode_to_client(bad)
    bad_reply = wire.encode(Kind.REPLY, {"results": [{"id": "1"}], "rid": 1}).replace(b"\xa2id", b"\xa2\xffd")
    with pytest.raises(ProtocolError, match="not a msgpack frame: UnicodeDecodeError"):
        decode_to_client(bad_reply)


@pytest.mark.timeout(30)
def test_the_one_pass_reply_knows_the_protocol_version() -> None:
    assert wire.PROTOCOL_VERSION == 1  # _REPLY's Literal[1]: a new version must change it too


#: What msgpack carries, less binary and ext values: what the one pass may take, to any depth.
_plain = st.recursive(
    st.none() | st.booleans() | _ints | st.floats() | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=12,
)
_wrong = st.one_of(_plain, _plain, _values)
_statuses = st.lists(
    _or_wrong(
        st.tuples(
            _or_wrong(_text, _wrong),
            _or_wrong(st.sampled_from(["QUEUED", "ACTIVE", "COMPLETED", "FAILED"]), _wrong),
            _or_wrong(st.floats() | _ints, _wrong),
            _or_wrong(st.none() | _ints, _wrong),
            _or_wrong(st.none() | _text, _wrong),
            _or_wrong(st.none() | st.dictionaries(_text, _plain, max_size=5) | st.just(_DELIVERED), _wrong),
        ).map(list),
        _wrong,
    ),
    max_size=3,
)
_bodies = st.one_of(
    st.fixed_dictionaries({"events": _statuses}),
    st.fixed_dictionaries({"events": _or_wrong(_statuses, _wrong)}, optional={"rid": _ints}),
    st.fixed_dictionaries({"rid": _or_wrong(_ints, _wrong)}, optional={"results": _or_wrong(st.lists(_plain), _wrong)}),
    st.dictionaries(_text, _wrong, max_size=3),
)
#: Frames as a daemon would write them, of such bodies.
_sent = st.tuples(st.sampled_from([Kind.EVENTS, Kind.REPLY]), _bodies).map(lambda kb: wire.encode(*kb))


def _same_as_the_long_way(frames: list[bytes]) -> None:
    for frame in frames:
        assert _outcome(frame, decode_to_client) == _outcome(frame, to_client._checked)


@pytest.mark.timeout(120)
@UNIT
@given(_frames([Kind.EVENTS, Kind.REPLY], _bodies))
def test_the_one_pass_decoding_reads_every_hostile_frame_as_the_long_way_does(frames: list[bytes]) -> None:
    _same_as_the_long_way(frames)


@pytest.mark.timeout(120)
@UNIT
@given(st.lists(_sent, min_size=1, max_size=3))
@example([wire.encode(Kind.EVENTS, {"events": [_COMPLETED]})])
@example([msgpack.packb([1, "events", {"events": [["1", "QUEUED", math.nan, None, None, {"a": -0.0}]]}])])
def test_the_one_pass_decoding_reads_every_daemon_like_frame_as_the_long_way_does(frames: list[bytes]) -> None:
    _same_as_the_long_way(frames)

"""Unit tests of the wire protocol (pilot/wire.py): the codec and the typed field accessors.

Every frame comes from an untrusted peer, so the contract under test is: a good frame round-trips,
and anything else raises :class:`ProtocolError` (never another exception) with a message that says
what is wrong.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilot import wire
from pilot.model.job_description import DescriptionError, JobDescription
from pilot.model.node import NodeConfigured
from pilot.model.process_order import ProcessOrder
from pilot.wire import Kind, ProtocolError, codec

ALL_KINDS = wire.CLIENT_KINDS | wire.AGENT_KINDS | wire.TO_CLIENT_KINDS | wire.TO_AGENT_KINDS


def raw(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


# -- round trip --------------------------------------------------------------------------------------


def test_round_trip_keeps_kind_and_body() -> None:
    body = {
        "rid": 7,
        "jobs": [{"executable": "/bin/true", "arguments": ["a", "ü", ""], "resources": None}],
        "blob": b"\x00\xff",
        "ratio": 0.25,
        "flag": False,
        "nested": {"list": [1, [2, [3]]], "neg": -(2**63)},
    }
    frame = wire.encode(Kind.SUBMIT, body)
    assert isinstance(frame, bytes)
    msg = wire.decode(frame, allowed=wire.CLIENT_KINDS)
    assert msg == wire.Message(Kind.SUBMIT, body)
    # bin stays bytes and str stays str (use_bin_type): the two are not confused on the way back
    assert isinstance(msg.body["blob"], bytes)
    assert isinstance(msg.body["jobs"][0]["arguments"][1], str)


@pytest.mark.parametrize("kind", sorted(ALL_KINDS))
def test_every_kind_round_trips_where_allowed_and_only_there(kind: str) -> None:
    frame = wire.encode(kind, {"x": 1})
    for allowed in (wire.CLIENT_KINDS, wire.AGENT_KINDS, wire.TO_CLIENT_KINDS, wire.TO_AGENT_KINDS):
        if kind in allowed:
            assert wire.decode(frame, allowed=allowed).kind == kind
        else:
            with pytest.raises(ProtocolError, match="unknown message kind"):
                wire.decode(frame, allowed=allowed)


def test_direction_sets_are_disjoint_where_it_matters() -> None:
    # A client must not be able to speak for an agent, nor an agent for the daemon.
    assert not wire.CLIENT_KINDS & wire.AGENT_KINDS
    assert not wire.CLIENT_KINDS & wire.TO_AGENT_KINDS
    assert not wire.AGENT_KINDS & wire.TO_CLIENT_KINDS


def test_frame_is_a_three_element_array_with_the_version_first() -> None:
    obj = msgpack.unpackb(wire.encode(Kind.HELLO, {"rid": 1}), raw=False)
    assert obj == [wire.PROTOCOL_VERSION, "hello", {"rid": 1}]


# -- malformed frames ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"", "not a msgpack frame"),
        (b"\xc1", "not a msgpack frame"),  # the one byte msgpack never uses
        (wire.encode(Kind.HELLO, {"rid": 1})[:-2], "not a msgpack frame"),  # truncated
        (wire.encode(Kind.HELLO, {"rid": 1}) + b"\x00", "not a msgpack frame"),  # trailing bytes
        (b"\xdd\xff\xff\xff\xff", "not a msgpack frame"),  # array32 header claiming 4G items
        (b"\xdf\xff\xff\xff\xff", "not a msgpack frame"),  # map32 header claiming 4G pairs
        (b"\x91" * 200_000, "not a msgpack frame"),  # nesting deeper than any stack
        (raw([1, "hello", {1: 2}]), "not a msgpack frame"),  # non-string map key
        (raw({"version": 1, "kind": "hello"}), r"not a \[version, kind, body\] array"),
        (raw([1, "hello"]), r"not a \[version, kind, body\] array"),
        (raw([1, "hello", {}, 4]), r"not a \[version, kind, body\] array"),
        (raw("hello"), r"not a \[version, kind, body\] array"),
        (raw(None), r"not a \[version, kind, body\] array"),
        (raw([2, "hello", {"rid": 1}]), "protocol version 2 is not supported"),
        (raw([0, "hello", {"rid": 1}]), "protocol version 0 is not supported"),
        (raw(["1", "hello", {"rid": 1}]), "protocol version '1' is not supported"),
        (raw([1, "no-such-kind", {}]), "unknown message kind 'no-such-kind'"),
        (raw([1, b"hello", {}]), "unknown message kind b'hello'"),
        (raw([1, 5, {}]), "unknown message kind 5"),
        (raw([1, None, {}]), "unknown message kind None"),
        (raw([1, "hello", [1, 2]]), "body of 'hello' is not a map"),
        (raw([1, "hello", None]), "body of 'hello' is not a map"),
        (raw([1, "hello", "rid=1"]), "body of 'hello' is not a map"),
    ],
)
def test_malformed_frames_raise_protocol_error_with_reason(frame: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        wire.decode(frame, allowed=wire.CLIENT_KINDS)


@pytest.mark.parametrize("version", [True, 1.0, [1]])
def test_version_must_be_the_integer_itself(version: Any) -> None:
    # True == 1 and 1.0 == 1 in Python; the protocol version is an integer, nothing that compares equal.
    with pytest.raises(ProtocolError, match="protocol version"):
        wire.decode(raw([version, "hello", {"rid": 1}]), allowed=wire.CLIENT_KINDS)


def test_oversized_frame_is_refused_before_unpacking() -> None:
    frame = wire.encode(Kind.SUBMIT, {"rid": 1, "pad": "x" * 1000})
    assert wire.decode(frame, allowed=wire.CLIENT_KINDS, max_bytes=len(frame)).kind == Kind.SUBMIT
    with pytest.raises(ProtocolError, match=rf"frame of {len(frame)} bytes exceeds the limit of {len(frame) - 1}"):
        wire.decode(frame, allowed=wire.CLIENT_KINDS, max_bytes=len(frame) - 1)
    # the size check comes first: an oversized frame of garbage is reported as oversized
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        wire.decode(b"\xc1" * 11, allowed=wire.CLIENT_KINDS, max_bytes=10)


def test_default_limit_is_max_frame_bytes() -> None:
    assert wire.MAX_FRAME_BYTES == 64 * 1024 * 1024
    big = b"\xc1" * (wire.MAX_FRAME_BYTES + 1)
    with pytest.raises(ProtocolError, match=f"exceeds the limit of {wire.MAX_FRAME_BYTES}"):
        wire.decode(big, allowed=wire.CLIENT_KINDS)


# -- typed field access ----------------------------------------------------------------------------------


def test_field_returns_value_of_the_right_type() -> None:
    body = {"n": 3, "s": "x", "f": 1.5, "b": True, "l": [1], "m": {}}
    assert wire.field(body, "n", int) == 3
    assert wire.field(body, "s", str) == "x"
    assert wire.field(body, "f", (int, float)) == 1.5
    assert wire.field(body, "n", (int, float)) == 3
    assert wire.field(body, "b", bool) is True
    assert wire.field(body, "l", list) == [1]
    assert wire.field(body, "m", dict) == {}


def test_field_missing_is_named() -> None:
    with pytest.raises(ProtocolError, match="missing field 'rid'"):
        wire.field({}, "rid", int)


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("typ", [int, float, (int, float)])
def test_field_rejects_bool_for_numbers(value: bool, typ: Any) -> None:
    with pytest.raises(ProtocolError, match=r"field 'rid' must be .*, not a boolean"):
        wire.field({"rid": value}, "rid", typ)


@pytest.mark.parametrize(
    ("value", "typ", "message"),
    [
        ("1", int, "field 'x' must be int, not str"),
        (1.0, int, "field 'x' must be int, not float"),
        (None, int, "field 'x' must be int, not NoneType"),
        (1, str, "field 'x' must be str, not int"),
        (b"x", str, "field 'x' must be str, not bytes"),
        ({}, list, "field 'x' must be list, not dict"),
        ([], dict, "field 'x' must be dict, not list"),
        ("1", (int, float), "field 'x' must be int or float, not str"),
        (1, bool, "field 'x' must be bool, not int"),
    ],
)
def test_field_rejects_wrong_types_with_clear_message(value: Any, typ: Any, message: str) -> None:
    with pytest.raises(ProtocolError) as info:
        wire.field({"x": value}, "x", typ)
    assert str(info.value) == message


def test_opt_field_default_and_checks() -> None:
    assert wire.opt_field({}, "x", int) is None
    assert wire.opt_field({}, "x", int, 5) == 5
    assert wire.opt_field({"x": None}, "x", int, 5) == 5
    assert wire.opt_field({"x": 2}, "x", int, 5) == 2
    with pytest.raises(ProtocolError, match="not a boolean"):
        wire.opt_field({"x": True}, "x", int, 5)
    with pytest.raises(ProtocolError, match="must be str, not int"):
        wire.opt_field({"x": 1}, "x", str)


def test_str_list_and_int_list() -> None:
    assert wire.str_list({"a": ["x", "y"]}, "a") == ["x", "y"]
    assert wire.str_list({"a": []}, "a") == []
    assert wire.int_list({"a": [0, -1, 2**40]}, "a") == [0, -1, 2**40]
    for bad in (["x", 1], [None], [b"x"], "xy"):
        with pytest.raises(ProtocolError, match="'a' must be"):
            wire.str_list({"a": bad}, "a")
    for bad in ([1, "2"], [1, True], [False], [1.0], {1: 2}):
        with pytest.raises(ProtocolError, match="'a' must be"):
            wire.int_list({"a": bad}, "a")
    with pytest.raises(ProtocolError, match="missing field 'a'"):
        wire.int_list({}, "a")


# -- property tests ------------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=25,
)
_anything = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(max_size=10) | st.binary(max_size=5) | st.integers(-100, 100), inner, max_size=5)
    ),
    max_leaves=25,
)
_fuzz = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_fuzz
@given(st.binary(max_size=512))
def test_decode_of_random_bytes_raises_only_protocol_error(data: bytes) -> None:
    try:
        msg = wire.decode(data, allowed=ALL_KINDS)
    except ProtocolError as exc:
        assert str(exc)
    else:
        assert msg.kind in ALL_KINDS and isinstance(msg.body, dict)


@_fuzz
@given(st.sampled_from(sorted(ALL_KINDS)), st.dictionaries(st.text(max_size=10), _values, max_size=6), st.data())
def test_decode_of_mutated_frames_raises_only_protocol_error(kind: str, body: dict[str, Any], data: Any) -> None:
    """Valid frames with bytes flipped, cut or inserted: closer to real damage than random bytes."""
    frame = bytearray(wire.encode(kind, body))
    assert wire.decode(bytes(frame), allowed=ALL_KINDS) == wire.Message(kind, body)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = data.draw(st.integers(0, max(0, len(frame) - 1)))
        if op == "flip" and frame:
            frame[pos] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del frame[pos:]
        else:
            frame[pos:pos] = data.draw(st.binary(min_size=1, max_size=4))
    try:
        wire.decode(bytes(frame), allowed=ALL_KINDS)
    except ProtocolError:
        pass


@_fuzz
@given(_anything)
def test_decode_of_any_msgpack_value_raises_only_protocol_error(obj: Any) -> None:
    try:
        wire.decode(raw(obj), allowed=ALL_KINDS)
    except ProtocolError:
        pass


@_fuzz
@given(st.sampled_from(sorted(ALL_KINDS)), st.dictionaries(st.text(max_size=10), _values, max_size=6))
def test_round_trip_property(kind: str, body: dict[str, Any]) -> None:
    assert wire.decode(wire.encode(kind, body), allowed=frozenset({kind})) == wire.Message(kind, body)


# The decoders of the bodies carried by frames are hostile-input parsers too: they may refuse with
# their own error type and nothing else.

_body_keys = st.sampled_from(
    [
        # NodeConfigured
        "name", "hostname", "processors", "memory", "gpus", "os", "architecture", "features",
        # ProcessOrder
        "job_id", "slot", "role", "executable", "arguments", "environment", "resolved_environment",
        "inherit_environment", "directory", "stdin_path", "stdout_path", "stderr_path", "truncate_output",
        "cores", "walltime", "rank_environment", "nodefile_hosts", "script",
        # JobDescription
        "launcher", "resources", "duration", "custom_attributes", "pre_launch", "post_launch",
        "node_count", "process_count", "processes_per_node", "cpu_cores_per_process",
        "gpu_cores_per_process", "memory_per_process", "exclusive_node_use",
    ]
)  # fmt: skip
_bodies = st.dictionaries(_body_keys | st.text(max_size=5), _values, max_size=12)


@_fuzz
@given(_bodies | _values)
def test_node_and_order_parsers_raise_only_protocol_error(body: Any) -> None:
    for parse in (NodeConfigured.from_wire, ProcessOrder.from_wire):
        try:
            parse(body)
        except ProtocolError:
            pass
        except (AttributeError, TypeError):
            # NodeConfigured.from_wire is only called on a value already checked to be a map
            assert parse == NodeConfigured.from_wire and not isinstance(body, dict)


@_fuzz
@given(_bodies | _values, st.dictionaries(_body_keys, _values, max_size=8))
def test_job_description_parser_raises_only_description_error(body: Any, resources: dict[str, Any]) -> None:
    for candidate in (body, {"executable": "/bin/true", "resources": resources}):
        try:
            JobDescription.from_wire(candidate)
        except DescriptionError as exc:
            assert str(exc)


@pytest.mark.timeout(10)
def test_a_request_read_before_lets_no_look_alike_of_another_type_through() -> None:
    """Resource requests already read are looked up by their wire form: 1.0 or True equal 1 in Python,
    and must still be refused after a valid 1 was read."""
    good = {"process_count": 2, "exclusive_node_use": False}
    first = JobDescription.from_wire({"executable": "/bin/true", "resources": good})
    assert first.resources.process_count == 2
    assert JobDescription.from_wire({"executable": "/bin/true", "resources": dict(good)}).resources is first.resources
    for twin in ({"process_count": 2.0, "exclusive_node_use": False}, {"process_count": 2, "exclusive_node_use": 0}):
        with pytest.raises(DescriptionError):
            JobDescription.from_wire({"executable": "/bin/true", "resources": twin})


_packable = st.recursive(
    _scalars | st.floats() | st.builds(msgpack.Timestamp, st.integers(-(2**40), 2**40), st.integers(0, 999_999_999)),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=10) | st.binary(max_size=5) | st.integers(-100, 100), inner, max_size=5)
    ),
    max_leaves=25,
)


@pytest.mark.timeout(60)
@_fuzz
@given(st.sampled_from(sorted(ALL_KINDS)), st.dictionaries(st.text(max_size=10), _packable, max_size=6))
def test_encode_writes_the_bytes_msgpack_writes(kind: str, body: dict[str, Any]) -> None:
    """The wire format is msgpack's: the encoder (msgspec) writes byte for byte what msgpack's Packer writes,
    so peers of another version, and the journal's packed orders spliced into a LAUNCH, read the same."""
    assert wire.encode(kind, body) == msgpack.packb([wire.PROTOCOL_VERSION, kind, body], use_bin_type=True)
    assert codec.pack(body) == msgpack.packb(body, use_bin_type=True)

"""Fuzzing (issue 5, item 6): hypothesis-generated hostile input, bounded in time. This module: the wire
maps of jobs, process orders and nodes, and the agent's frame decoding; test_fuzz_documents.py: config
files and SSS XML; test_fuzz_journal.py: the journal; test_fuzz_live.py: a live daemon's client and agent
sockets.

The contract under test: a reader lets only its own documented error escape (``ConfigError``,
``SssError``/``DescriptionError``, ``wire.ProtocolError``, ``JournalError``), with a message; anything
else (TypeError, KeyError, RecursionError, OverflowError, ...) is a bug. What a reader accepts must be
valid. A live daemon answers exactly the well-formed requests (in order), drops the rest, keeps its
agents and the jobs it had, and still runs a job for a normal client afterwards.

The test_hostile_input.py tables cover the hand-picked cases; these generate, and shrink what fails.
``pytest --hypothesis-seed=N`` replays a run; the example counts (tests/fuzzing.py) keep the
fuzzing modules (test_fuzz*.py) near 60 s together on 2 cpus.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest
from fuzzing import (
    STRETCH,
    UNIT,
    _check_description,
    _frames,
    _ints,
    _job_maps,
    _node_maps,
    _or_wrong,
    _resources,
    _text,
    _values,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent.agent import Agent
from pilot import wire
from pilot.model import process_order
from pilot.model.job_description import DescriptionError, JobDescription
from pilot.model.node import NodeConfigured
from pilot.model.process_order import ProcessOrder
from pilot.scheduler.placement import NodeSlots, never_fits, place
from pilot.wire import Kind, ProtocolError

# ============================================================================================================
# The wire maps: JobDescription, ProcessOrder, NodeConfigured
# ============================================================================================================


@pytest.mark.timeout(60 * STRETCH)
@UNIT
@given(st.data())
def test_job_description_from_wire_raises_only_description_error(data: st.DataObject) -> None:
    job = data.draw(_job_maps(Path("/tmp/fuzz")))
    try:
        d = JobDescription.from_wire(job)
    except DescriptionError as exc:
        assert str(exc)
        return
    _check_description(d)


_NODES = [
    NodeSlots.from_configured(NodeConfigured(name=f"n{i}", hostname="h", processors=[0, 1], memory=1 << 30, gpus=[0]))
    for i in range(2)
]


@pytest.mark.timeout(60 * STRETCH)
@UNIT
@given(_resources)
@example({"node_count": 2**40})
@example({"process_count": 2**40, "processes_per_node": 1})
def test_submit_path_judges_any_accepted_request_at_once(resources: dict[str, Any]) -> None:
    """What submit does with a job that passed validation: never_fits against the allocation, then place.
    Counts of 2**40 nodes once built a 2**40-item list (MemoryError in the daemon's I/O task)."""
    try:
        d = JobDescription.from_wire({"executable": "/bin/true", "resources": resources})
    except DescriptionError:
        return
    reason = never_fits(d.resources, _NODES)
    ranks = place(d.resources, [n.idle_copy() for n in _NODES], job_id="1")
    assert (reason is None) == (ranks is not None), (reason, ranks)
    if ranks is not None:
        assert len(ranks) == d.resources.process_count


_VALID_ORDER = ProcessOrder(
    job_id="7",
    slot=0,
    role="rank",
    executable="/bin/true",
    arguments=["a"],
    environment={"A": "1"},
    directory="/tmp",
    stdout_path="out",
    cores=[0],
    walltime=5.0,
    nodefile_hosts=["h"],
    after_cores=True,
).to_wire()
#: Staging steps of a process order: a copy and a cleanup step, and two wrong in one place each.
_STEPS = [
    [["a", "b", "copy", False]],
    [["a", "b", "zap", False]],
    [["a", "b", "copy", 1]],
    [["a", "", "remove", True]],
]


@st.composite
def _order_maps(draw: st.DrawFn) -> Any:
    """A valid order with some fields replaced by wrong or edge values, some dropped, maybe one added."""
    order = dict(_VALID_ORDER)
    for name in draw(st.lists(st.sampled_from(sorted(order)), max_size=4, unique=True)):
        if draw(st.booleans()):
            del order[name]
        else:
            order[name] = draw(
                st.one_of(
                    _values,
                    st.floats(),
                    st.sampled_from(
                        ["pre", "post", "rank", "ranks", "stage_in", -1, -2, [], {}, [["A", "1"]], ["x", 1]]
                    ),
                )
            )
    if draw(st.booleans()):
        order[draw(_text)] = draw(_values)
    if draw(st.booleans()):
        order["staging"] = draw(st.sampled_from(_STEPS) | _values)
    return order if draw(st.integers(0, 9)) else draw(_values)


@pytest.mark.timeout(60 * STRETCH)
@UNIT
@given(_order_maps())
def test_process_order_from_wire_raises_only_protocol_error(raw_order: Any) -> None:
    try:
        order = ProcessOrder.from_wire(raw_order)
    except ProtocolError as exc:
        assert str(exc)
        return
    assert order.role in ("rank", "pre", "post", "stage_in")
    assert all(step[2] in ("copy", "link", "move", "remove") and type(step[3]) is bool for step in order.staging)
    assert order.walltime is None or (math.isfinite(order.walltime) and order.walltime > 0), order.walltime
    assert ProcessOrder.from_wire(order.to_wire()) == order


# ProcessOrder.from_wire's fast path (exact types, one pass) against its field-by-field check: it never
# accepts what the full check refuses, and builds the same order from what both accept.

_EDGE: list[Any] = [
    None, True, False, 0, 1, -1, 2.5, 0.0, -3.0, math.nan, math.inf, "", "x", "rank", "pre", "post",
    [], [1], [True], ["a"], ["a", 1], {}, {"A": "1"}, {"A": 1}, {1: "a"}, [["RLIMIT_CORE", 0, 0]],
    [["RLIMIT_NOPE", 0, 0]],
]  # fmt: skip


@st.composite
def _edge_orders(draw: st.DrawFn) -> Any:
    """A valid order with up to five fields dropped or set to edge values of every type the fields
    take (bool vs int, nan, wrong map keys, unknown limits), maybe an unknown field added."""
    order = dict(_VALID_ORDER)
    for name in draw(st.lists(st.sampled_from(sorted(order)), max_size=5, unique=True)):
        if draw(st.booleans()):
            del order[name]
        else:
            order[name] = draw(st.sampled_from(_EDGE))
    if draw(st.integers(0, 9)) == 0:
        order["unknown"] = 1
    return order


@pytest.mark.timeout(120)
@settings(max_examples=3000, deadline=None)
@given(_edge_orders())
def test_the_fast_path_accepts_only_what_the_full_check_accepts_and_builds_the_same_order(raw: Any) -> None:
    fast = process_order._from_wire_fast(raw)
    try:
        checked = ProcessOrder._from_wire_checked(raw)
    except ProtocolError:
        assert fast is None, f"the fast path accepted {raw!r}, which the full check refuses"
        return
    if fast is not None:
        assert fast == checked


@pytest.mark.timeout(120)
@settings(max_examples=1500, deadline=None)
@given(st.lists(_edge_orders(), min_size=1, max_size=3))
def test_a_launch_decoded_in_one_pass_holds_the_orders_the_full_check_builds(raws: list[Any]) -> None:
    # An agent decodes a LAUNCH's packed orders in one typed pass (orders_from_packed): it never takes
    # a frame the full check would refuse, and builds the same orders from those it takes.
    fast = process_order.orders_from_packed(msgpack.packb(raws, use_bin_type=True))
    try:
        unpacked = [msgpack.unpackb(msgpack.packb(r), strict_map_key=True) for r in raws]
        checked = [ProcessOrder._from_wire_checked(r) for r in unpacked]
    except (ProtocolError, ValueError):
        assert fast is None, f"the one-pass decoding accepted {raws!r}, which the full check refuses"
        return
    if fast is not None:
        assert fast == checked


def test_the_one_pass_decoding_knows_every_field_and_role() -> None:
    # _WireOrder mirrors ProcessOrder: a field or role added to one and not the other would send every
    # order the slow way, or refuse it.
    assert tuple(process_order._WireOrder.__struct_fields__) == process_order._REQUIRED + tuple(
        n for n, _ in process_order._OPTIONAL
    )
    assert set(typing.get_type_hints(process_order._WireOrder)["role"].__args__) == set(process_order.ROLES)


def test_a_daemons_launch_frame_takes_the_one_pass_decoding() -> None:
    orders = [ProcessOrder.from_wire(dict(_VALID_ORDER)), ProcessOrder(job_id="8", slot=1, role="rank", executable="x")]
    frame = wire.messages.Launch.frame([o.to_wire() for o in orders])
    head = len(wire.messages._LAUNCH_HEAD)
    assert process_order.orders_from_packed(frame[head:]) == orders
    assert wire.messages.decode(frame, wire.messages.TO_AGENT) == wire.messages.Launch(tuple(orders))


def test_a_daemons_order_takes_the_fast_path() -> None:
    # The orders a daemon sends (msgpack round trip: exact types) must not fall back to the slow path.
    assert process_order._from_wire_fast(dict(_VALID_ORDER)) == ProcessOrder._from_wire_checked(dict(_VALID_ORDER))


def test_an_order_sends_only_the_fields_that_differ_from_their_defaults() -> None:
    # Half the bytes of a common order to pack, journal, send and check; an absent field reads back
    # as its default, by both paths.
    order = ProcessOrder(job_id="7", slot=0, role="rank", executable="/bin/true", cores=[0], directory="/tmp")
    raw = order.to_wire()
    assert set(raw) == {
        "job_id", "slot", "role", "executable", "arguments", "inherit_environment", "directory",
        "truncate_output", "cores", "gpus",
    }  # fmt: skip
    assert process_order._from_wire_fast(raw) == ProcessOrder._from_wire_checked(raw) == order


def test_the_fast_path_puts_every_field_where_it_belongs() -> None:
    # It builds the order positionally: each field set to a value of its own comes back as sent.
    order = ProcessOrder(
        job_id="7",
        slot=3,
        role="pre",
        executable="/bin/sh",
        arguments=["a"],
        environment={"E": "1"},
        pre_environment={"P": "2"},
        pre_unset=["U"],
        inherit_environment=False,
        directory="/d",
        stdin_path="i",
        stdout_path="o",
        stderr_path="e",
        truncate_output=False,
        cores=[1, 2],
        gpus=[0],
        walltime=9.5,
        rank_environment={"R": "3"},
        nodefile_hosts=["h"],
        script="s.sh",
        after_cores=True,
        stream=True,
    )
    raw = order.to_wire()
    # Every field but the limits and staging steps (which take the checked path) differs.
    assert set(raw) == set(process_order._FIELDS) - {"rlimits", "staging"}
    assert process_order._from_wire_fast(raw) == order


@pytest.mark.timeout(60 * STRETCH)
@UNIT
@given(_node_maps())
def test_node_configured_from_wire_raises_only_protocol_error(body: dict[str, Any]) -> None:
    try:
        node = NodeConfigured.from_wire(body)
    except ProtocolError as exc:
        assert str(exc)
        return
    assert 1 <= len(node.name) <= 255
    assert node.processors and len(set(node.processors)) == len(node.processors) and min(node.processors) >= 0
    assert len(set(node.gpus)) == len(node.gpus) and all(g >= 0 for g in node.gpus), node.gpus
    assert node.memory >= 0
    assert NodeConfigured.from_wire(node.to_wire()) == node


# ============================================================================================================
# The agent's own decoding of what the daemon sends
# ============================================================================================================


@contextmanager
def _idle_agent(tmp: Path) -> Iterator[Agent]:
    """A real Agent, not running: its socket is never connected and its spawner never started, so
    orders are decoded and queued but nothing is spawned."""
    node = NodeConfigured(name="fuzz-0", hostname="h", processors=[0, 1], memory=1 << 30)
    agent = Agent(daemon_url=f"ipc://{tmp}/none.sock", node=node, workdir=tmp)
    try:
        yield agent
    finally:
        agent._sock.close(linger=0)
        agent._ctx.term()
        agent._waiter.close()


_to_agent_bodies = st.one_of(
    st.fixed_dictionaries({"orders": _or_wrong(st.lists(_order_maps(), max_size=3))}),
    st.fixed_dictionaries(
        {
            "processes": _or_wrong(st.lists(st.tuples(_text, _ints).map(list) | _values, max_size=3)),
            "reason": _or_wrong(_text),
        }
    ),
    st.fixed_dictionaries({"heartbeat_interval": _or_wrong(st.floats() | _ints)}, optional={"acked": _or_wrong(_ints)}),
    st.fixed_dictionaries({"known": _or_wrong(st.booleans())}, optional={"acked": _or_wrong(_ints)}),
    st.fixed_dictionaries({}, optional={"reason": _or_wrong(_text)}),
    st.dictionaries(_text, _values, max_size=3),
)
_TO_AGENT = sorted(wire.TO_AGENT_KINDS | {Kind.HEARTBEAT})


@pytest.mark.timeout(60 * STRETCH)
def test_agent_receive_never_raises(tmp_path: Path) -> None:
    with _idle_agent(tmp_path) as agent:

        @UNIT
        @given(st.lists(_frames(_TO_AGENT, _to_agent_bodies), min_size=1, max_size=4))
        def receive(messages: list[list[bytes]]) -> None:
            for frames in messages:
                agent._receive(frames)

        receive()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("interval", [0, -1.0, math.nan])
def test_agent_refuses_a_heartbeat_interval_it_cannot_keep(tmp_path: Path, interval: float) -> None:
    with _idle_agent(tmp_path) as agent:
        before = agent._heartbeat
        agent._receive([wire.encode(Kind.REGISTERED, {"heartbeat_interval": interval})])
        assert agent._heartbeat == before


# ============================================================================================================

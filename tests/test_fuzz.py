"""Fuzzing (issue 5, item 6): hypothesis-generated hostile input, bounded in time, against a live daemon's
client and agent sockets, the agent's frame decoding, and every reader of untrusted text: config files,
SSS XML, the wire maps of jobs, process orders and nodes, and the journal.

The contract under test: a reader lets only its own documented error escape (``ConfigError``,
``SssError``/``DescriptionError``, ``wire.ProtocolError``, ``JournalError``), with a message; anything
else (TypeError, KeyError, RecursionError, OverflowError, ...) is a bug. What a reader accepts must be
valid. A live daemon answers exactly the well-formed requests (in order), drops the rest, keeps its
agents and the jobs it had, and still runs a job for a normal client afterwards.

The test_hostile_input.py tables cover the hand-picked cases; these generate, and shrink what fails.
``pytest --hypothesis-seed=N`` replays a run; every example count below keeps this file near 60 s on 2 cpus.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import shutil
import sqlite3
import sys
import time
import typing
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
import zmq
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st
from pilot_waits import agents_active, reach, wait_for

import client as psij
from agent.agent import Agent
from pilot import config, lrm, wire
from pilot.core.phase import Phase
from pilot.formats import read_job, read_nodes, write_job
from pilot.formats.xml import MAX_DEPTH
from pilot.jobs import JobRecord, ProcessResult
from pilot.launchers.base import PlannedProcess
from pilot.lrm._batch import COMMON_OPTIONS
from pilot.lrm.base import Allocation, AllocationState
from pilot.model import process_order
from pilot.model.job_description import DescriptionError, JobDescription
from pilot.model.job_state import JobState
from pilot.model.node import NodeConfigured
from pilot.model.process_order import PRE, ProcessOrder
from pilot.model.sss import Job, SssError, effective_jobs
from pilot.model.sss.psij import description, from_sss, to_sss
from pilot.scheduler.placement import NodeSlots, RankPlacement, never_fits, place
from pilot.store import JournalError, Store
from pilot.wire import Kind, ProtocolError

Strategy = st.SearchStrategy

#: PILOT_FUZZ_SCALE=10 runs ten times the examples (a longer hunt than CI's bounded one).
SCALE = float(os.environ.get("PILOT_FUZZ_SCALE", "1"))
STRETCH = max(SCALE, 1.0)  # timeouts grow with the examples, never shrink
#: For the readers: many cheap examples.
UNIT = settings(max_examples=int(300 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: For the live daemon: each example is a few socket round trips.
LIVE = settings(
    max_examples=int(150 * SCALE),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- generic values ------------------------------------------------------------------------------------------

_text = st.text(max_size=12)  # no lone surrogates: msgpack and TOML cannot carry them (XML gets its own)
_ints = st.one_of(
    st.integers(-3, 10),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([2**31, 2**32, 2**40, 2**63 - 1, 2**64 - 1, -(2**63)]),
)
_scalars = st.one_of(st.none(), st.booleans(), _ints, st.floats(), _text, st.binary(max_size=12))
_exts = st.one_of(
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=12)),
    st.builds(msgpack.Timestamp, st.integers(0, 2**33), st.integers(0, 999_999_999)),
)
#: Anything msgpack can carry, also what the readers never expect (ext types, bytes, huge ints).
_values: Strategy[Any] = st.recursive(
    _scalars | _exts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=10,
)
#: A wrong value that is never a string (strings in some fields would name programs or paths).
_nonstr = _values.filter(lambda v: not isinstance(v, str))


def _or_wrong(valid: Strategy[Any], wrong: Strategy[Any] = _values) -> Strategy[Any]:
    """Mostly valid-looking values, sometimes any value at all: deep validation gets reached."""
    return st.one_of(valid, valid, wrong)


def raw(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


# -- frames: every way a frame can be wrong ----------------------------------------------------------------

_BAD_VERSIONS = [0, 2, -1, True, False, 1.0, "1", None, 2**64 - 1, [1]]
_HUGE_HEADERS = [
    b"\xdd\xff\xff\xff\xff",  # array32 of 4G items
    b"\xdf\xff\xff\xff\xff",  # map32 of 4G pairs
    b"\xdb\xff\xff\xff\xff",  # str32 of 4 GiB
    b"\xc6\xff\xff\xff\xff",  # bin32 of 4 GiB
    b"\xc9\xff\xff\xff\xff\x05",  # ext32 of 4 GiB
]


def _frames(
    kinds: list[str], bodies: Strategy[dict[str, Any]], requests: Strategy[bytes] | None = None
) -> Strategy[list[bytes]]:
    """One multipart message: usually one frame, sometimes several (the protocol allows exactly one).
    ``requests`` are well-formed frames whose kind and body go together (so that many are acted on)."""
    valid = st.tuples(st.sampled_from(kinds), bodies).map(lambda kb: wire.encode(kb[0], kb[1]))

    @st.composite
    def damaged(draw: st.DrawFn) -> bytes:
        frame = bytearray(draw(valid))
        for _ in range(draw(st.integers(1, 3))):
            op = draw(st.sampled_from(["flip", "cut", "insert"]))
            pos = draw(st.integers(0, max(0, len(frame) - 1)))
            if op == "flip" and frame:
                frame[pos] = draw(st.integers(0, 255))
            elif op == "cut":
                del frame[pos:]
            else:
                frame[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        return bytes(frame)

    any_kind = st.sampled_from(
        sorted(wire.CLIENT_KINDS | wire.AGENT_KINDS | wire.TO_AGENT_KINDS | wire.TO_CLIENT_KINDS)
    )
    envelope = st.tuples(
        st.sampled_from(_BAD_VERSIONS) | st.just(wire.PROTOCOL_VERSION) | _ints,
        any_kind | st.sampled_from(["", "HELLO", "frobnicate"]) | _values,
        bodies | _values,
    ).map(lambda t: raw(list(t)))
    wrong_arity = st.lists(_values, max_size=5).map(raw) | st.dictionaries(_text, _values, max_size=3).map(raw)
    non_string_keys = st.tuples(st.sampled_from(kinds), st.dictionaries(_ints | st.binary(max_size=3), _values)).map(
        lambda kb: raw([wire.PROTOCOL_VERSION, kb[0], kb[1]])
    )
    huge = st.one_of(
        st.tuples(st.sampled_from(kinds), st.sampled_from(_HUGE_HEADERS), st.binary(max_size=16)).map(
            lambda t: b"\x93" + raw(wire.PROTOCOL_VERSION) + raw(t[0]) + t[1] + t[2]
        ),
        st.sampled_from([b"\x91" * 1000, b"\x91" * 100_000, b"\x81\xa1a" * 50_000]),
        st.integers(1, 3 << 20).map(lambda n: raw([wire.PROTOCOL_VERSION, kinds[0], {"rid": 1, "pad": "x" * n}])),
    )
    coherent = valid if requests is None else requests
    one = st.one_of(
        st.binary(max_size=300),
        valid,
        coherent,
        coherent,
        coherent,
        valid.flatmap(lambda f: st.integers(0, len(f) - 1).map(lambda n: f[:n])),  # truncated
        damaged(),
        envelope,
        wrong_arity,
        non_string_keys,
        huge,
    )
    return st.one_of(one.map(lambda f: [f]), one.map(lambda f: [f]), st.lists(one, min_size=2, max_size=3))


# -- job maps: near-valid, mixing valid and invalid field types ------------------------------------------------

SAFE_EXECUTABLES = ("/bin/true", "/bin/false", "true", "/nonexistent-fuzz/x", "")
SAFE_SCRIPTS = (None, "/nonexistent-fuzz/hook.sh")
_ENV_NAMES = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True),
    st.tuples(st.sampled_from(["A", "_x", "PATH"]), st.sampled_from(["\n", "=", " ", "-", "\x00", "é"])).map("".join),
    _text,
)
_counts = st.one_of(
    st.integers(-2, 5), st.sampled_from([2**20, 2**31, 2**40, 2**63 - 1, 2**64 - 1, -(2**63)]), st.none()
)
_RESOURCES_VALID: dict[str, Strategy[Any]] = {
    "node_count": st.integers(1, 2),
    "process_count": st.integers(1, 4),
    "processes_per_node": st.integers(1, 2),
    "cpu_cores_per_process": st.integers(1, 2),
    "gpu_cores_per_process": st.just(0),
    "memory_per_process": st.integers(0, 2**20),
    "exclusive_node_use": st.booleans(),
}
_resources = st.fixed_dictionaries(
    {},
    optional={k: _or_wrong(_counts) for k in _RESOURCES_VALID if k != "exclusive_node_use"}
    | {"exclusive_node_use": _or_wrong(st.booleans()), "cores": _values},  # "cores" is not a field
)


def _job_maps(tmp: Path) -> Strategy[Any]:
    """Job maps as a client sends them: some clean (they run), most with a few wrong fields, some not a map."""
    valid: dict[str, Strategy[Any]] = {
        "arguments": st.lists(_text, max_size=4),
        "directory": st.sampled_from([None, str(tmp), "/nonexistent-fuzz", "~/nonexistent-fuzz"]),
        "submit_directory": st.sampled_from([None, str(tmp), "relative-fuzz"]),
        "name": _text,
        "inherit_environment": st.booleans(),
        "environment": st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True), _text, max_size=3),
        "stdin_path": st.sampled_from([None, "/dev/null", "/nonexistent-fuzz/in"]),
        "stdout_path": st.sampled_from([None, str(tmp / "out"), "/nonexistent-fuzz/out", "nonexistent-fuzz/out"]),
        "stderr_path": st.sampled_from([None, str(tmp / "out"), "/nonexistent-fuzz/out"]),
        "pre_launch": st.sampled_from(SAFE_SCRIPTS),
        "post_launch": st.sampled_from(SAFE_SCRIPTS),
        "launcher": st.sampled_from(["single", "multiple"]),
        "resources": st.fixed_dictionaries({}, optional=_RESOURCES_VALID),
        "duration": st.sampled_from([None, 0.001, 0.5, 60, 1e9]),
        "queue_name": _text,
        "project_name": _text,
        "reservation_id": _text,
        "custom_attributes": st.dictionaries(_text, _values, max_size=3),
    }
    wrong: dict[str, Strategy[Any]] = {
        "directory": st.sampled_from(["relative-fuzz", ""]) | _nonstr,
        "submit_directory": _nonstr,
        "environment": st.dictionaries(_ENV_NAMES, _text, max_size=3) | _values,
        "stdin_path": _nonstr,
        "stdout_path": _nonstr,
        "stderr_path": _nonstr,
        "pre_launch": _nonstr,
        "post_launch": _nonstr,
        "launcher": st.sampled_from(["srun", "mpi", ""]) | _nonstr,
        "resources": _resources | _values,
        "duration": st.floats() | st.integers(-1, 0) | st.sampled_from([2**64 - 1]) | _values,
    }
    executable = st.sampled_from(SAFE_EXECUTABLES)
    clean = st.fixed_dictionaries({"executable": executable}, optional=valid)
    noisy = st.fixed_dictionaries(
        {"executable": _or_wrong(executable, _nonstr)},
        optional={k: _or_wrong(v, wrong.get(k, _values)) for k, v in valid.items()} | {"rm": _values},
    )
    return st.one_of(clean, clean, noisy, noisy, _values)


def _runs_safely(d: JobDescription, tmp: Path) -> bool:
    """A job the barrage may really run: harmless programs, no paths outside ``tmp`` that could exist."""
    safe_paths = {None, str(tmp / "out"), "/nonexistent-fuzz/out", "nonexistent-fuzz/out", "/dev/null"}
    safe_paths |= {"/nonexistent-fuzz/in"}
    safe_dirs = {None, str(tmp), "/nonexistent-fuzz", "relative-fuzz", "~/nonexistent-fuzz"}
    return (
        d.executable in SAFE_EXECUTABLES
        and d.launcher != "mpirun"
        and d.pre_launch in SAFE_SCRIPTS
        and d.post_launch in SAFE_SCRIPTS
        and {d.stdin_path, d.stdout_path, d.stderr_path} <= safe_paths
        and {d.directory, d.submit_directory} <= safe_dirs
    )


# ============================================================================================================
# The wire maps: JobDescription, ProcessOrder, NodeConfigured
# ============================================================================================================


def _check_description(d: JobDescription) -> None:
    """What every accepted description must satisfy (the daemon relies on it without checking again)."""
    r = d.resources
    assert d.executable and isinstance(d.executable, str)
    assert r.process_count >= 1 and r.cpu_cores_per_process >= 1
    assert r.gpu_cores_per_process >= 0 and r.memory_per_process >= 0
    assert r.node_count is None or 1 <= r.node_count <= r.process_count
    assert r.processes_per_node is None or r.processes_per_node >= 1
    assert d.duration is None or (math.isfinite(d.duration) and d.duration > 0), d.duration
    for name in d.environment:
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), f"accepted variable name {name!r}"
    assert JobDescription.from_wire(d.to_wire()) == d


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


_VALID_NODE = NodeConfigured(
    name="n1", hostname="h1", processors=[0, 1], memory=1 << 30, gpus=[0], os="Linux", architecture="x86_64"
).to_wire()


@st.composite
def _node_maps(draw: st.DrawFn, name: Strategy[Any] = _text) -> dict[str, Any]:
    node: dict[str, Any] = dict(_VALID_NODE, name=draw(name))
    edge = {
        "processors": st.lists(st.integers(-2, 70), max_size=6) | st.just(list(range(64))),
        "gpus": st.lists(st.integers(-2, 4), max_size=4),
        "memory": _ints,
        "features": st.lists(_text, max_size=3),
        "name": st.sampled_from(["", "x" * 256, "local-0"]),
    }
    for key in draw(st.lists(st.sampled_from(sorted(node)), max_size=4, unique=True)):
        choice = draw(st.integers(0, 2))
        if choice == 0:
            del node[key]
        elif choice == 1:
            node[key] = draw(_values)
        else:
            node[key] = draw(edge.get(key, _text))
    return node


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
# Config files
# ============================================================================================================


def _toml_str(s: str) -> str:
    out = ['"']
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out) + '"'


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_str(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise AssertionError(v)


def _toml(doc: dict[str, Any]) -> str:
    lines = []
    for table, body in doc.items():
        if isinstance(body, dict):
            lines.append(f"[{_toml_str(table)}]")
            lines += [f"{_toml_str(k)} = {_toml_value(v)}" for k, v in body.items()]
        else:
            lines.insert(0, f"{_toml_str(table)} = {_toml_value(body)}")
    return "\n".join(lines) + "\n"


_toml_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_toml_scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-3, 100),
    st.floats(),
    st.floats(0.001, 100),
    _toml_text,
    st.sampled_from(
        ["", "1", "1h", "2h30m", "30m", "10s", "0s", "1.5d", "01:00:00", "1-00:00:00", "00:00", "4G", "512M", "4GiB"]
    ),
    st.sampled_from(["1e999s", "9" * 400 + "s", "9" * 400 + ":00", "9" * 5000 + ":00", "9" * 400, "²s", "1_0s"]),
    st.sampled_from(["ipc", "tcp", "info", "debug", "default", "a b", "name\n", "8G\n"]),
)
_toml_values = st.recursive(
    _toml_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_toml_text, inner, max_size=2),
    max_leaves=6,
)
_PILOT_KEYS = sorted(f.name for f in fields(config.PilotSettings))
_LRM_KEYS = sorted(
    {"lrm", "nodes", "walltime", "cores_per_node", "gpus_per_node", "memory_per_node", "features", "agent_python"}
    | set(COMMON_OPTIONS)
    | {k for cls in lrm._REGISTRY.values() for k in getattr(cls, "own_options", {})}
)


@st.composite
def _config_docs(draw: st.DrawFn) -> dict[str, Any]:
    def table(keys: list[str]) -> dict[str, Any]:
        chosen = draw(st.lists(st.sampled_from(keys) | _toml_text, max_size=5, unique=True))
        return {k: draw(_toml_values) for k in chosen}

    doc: dict[str, Any] = {}
    if draw(st.booleans()):
        doc["pilot"] = table(_PILOT_KEYS)
    if draw(st.integers(0, 4)):
        alloc = table(_LRM_KEYS)
        alloc.setdefault("lrm", draw(st.sampled_from(sorted(lrm._REGISTRY)) | _toml_values))
        doc["allocation"] = alloc
    if not draw(st.integers(0, 9)):
        doc[draw(_toml_text)] = draw(_toml_values)
    return doc


def _check_config(cfg: config.Config) -> None:
    p = cfg.pilot
    for name in ("heartbeat_interval", "agent_timeout", "kill_grace", "walltime_margin", "agent_start_timeout"):
        value = getattr(p, name)
        assert math.isfinite(value) and value > 0, f"accepted pilot.{name} = {value}"
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", p.name), f"accepted pilot.name = {p.name!r}"
    assert p.agent_timeout > p.heartbeat_interval
    w = cfg.allocation.walltime
    assert w is None or (math.isfinite(w) and w > 0), f"accepted allocation.walltime = {w}"
    assert cfg.allocation.nodes >= 1


def _load_config(path: Path) -> None:
    """What ``pilot up`` does with a config file before it starts anything."""
    try:
        cfg = config.load(path)
        _check_config(cfg)
        lrm.create(cfg.allocation.lrm, options=cfg.allocation.options, source=cfg.source)
    except config.ConfigError as exc:
        assert str(exc)


@pytest.mark.timeout(60 * STRETCH)
def test_config_files_raise_only_config_error(tmp_path: Path) -> None:
    path = tmp_path / "fuzz.toml"

    @UNIT
    @given(_config_docs())
    @example({"allocation": {"lrm": "slurm", "walltime": "9" * 400 + ":00"}})
    @example({"pilot": {"heartbeat_interval": math.nan}})
    @example({"allocation": {"lrm": "local", "memory_per_node": "9" * 400}})
    def load(doc: dict[str, Any]) -> None:
        text = _toml(doc)
        note(text)
        path.write_text(text)
        _load_config(path)

    load()


@pytest.mark.timeout(60 * STRETCH)
def test_damaged_config_files_raise_only_config_error(tmp_path: Path) -> None:
    path = tmp_path / "fuzz.toml"
    shipped = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.toml"))
    assert shipped
    sources = [p.read_bytes() for p in shipped]

    @UNIT
    @given(st.sampled_from(sources), st.lists(st.tuples(st.floats(0, 1), st.binary(max_size=3)), max_size=4))
    @example(b'[pilot]\nname = "x"\n', [(0.5, b"\xff")])
    def load(source: bytes, edits: list[tuple[float, bytes]]) -> None:
        data = bytearray(source)
        for where, new in edits:
            pos = int(where * len(data))
            data[pos : pos + len(new)] = new
        path.write_bytes(bytes(data))
        _load_config(path)

    load()


# ============================================================================================================
# SSS XML
# ============================================================================================================

_XML_TAGS = [
    "JobGroup", "Job", "JobDefaults", "TaskGroup", "TaskGroupDefaults", "Task", "TaskDefaults", "Requested",
    "Delivered", "Environment", "Variable", "Executable", "Arguments", "Processors", "Memory", "Duration",
    "NodeCount", "TaskCount", "TaskDistribution", "Resource", "ResourceLimit", "Dependency", "Extension",
    "Feature", "Node", "Hold", "OutputFile", "InputFile", "Name", "Id", "Priority", "StartTime", "Interactive",
    "Data", "Configured", "Available", "Utilized", "Opsys", "Arch", "Swap", "Teleport",
]  # fmt: skip
_XML_ATTRS = [
    "awarenessPolicy", "op", "conj", "group", "preference", "performanceFactor", "units", "metric", "name",
    "type", "export", "redirectList", "aggregation", "count", "condition", "code", "designator", "context",
    "dynamic", "wallDuration", "colour",
]  # fmt: skip
_XML_WORDS = st.sampled_from(
    [
        "", "1", "0", "-1", "16", "3600", "1.5", "nan", "inf", "-0", "1e400", "9" * 5000, "true", "false",
        "Reject", "Warn", "Ignore", "EQ", "GE", "Match", "And", "MB", "GB", "B", "GPU", "TasksPerNode",
        "RoundRobin", "CustomAttribute", "PSIJ", "Launcher", "OnExit", "JobId", "/bin/true", "#1", "'unbalanced",
        "unlimited", "CPUTime", "Hard", '{"a": [1]}', "Append,Close", "List",
    ]
)  # fmt: skip
_xml_safe_text = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00\ufffe\uffff", min_codepoint=9).filter(
        lambda c: c in "\t\n\r" or ord(c) >= 32
    ),
    max_size=12,
)


def _esc(s: str, attr: bool = False) -> str:
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return s.replace('"', "&quot;").replace("\n", "&#10;") if attr else s


def _render(tag: str, attrs: dict[str, str], text: str, children: list[str]) -> str:
    attributes = "".join(f' {k}="{_esc(v, True)}"' for k, v in attrs.items())
    return f"<{tag}{attributes}>{_esc(text)}{''.join(children)}</{tag}>"


_attrs = st.dictionaries(st.sampled_from(_XML_ATTRS), _XML_WORDS | _xml_safe_text, max_size=3)
_element: Strategy[str] = st.recursive(
    st.builds(_render, st.sampled_from(_XML_TAGS), _attrs, _XML_WORDS | _xml_safe_text, st.just([])),
    lambda inner: st.builds(
        _render, st.sampled_from(_XML_TAGS), _attrs, _XML_WORDS | _xml_safe_text, st.lists(inner, max_size=4)
    ),
    max_leaves=20,
)
_roots = st.builds(
    lambda root, attrs, body: _render(root, attrs, "", body),
    st.sampled_from(["Job", "JobGroup", "Node", "Data", "Task"]),
    _attrs,
    st.lists(_element, max_size=6),
)
_documents = st.builds(
    lambda decl, root: decl + root,
    st.sampled_from(["", '<?xml version="1.0"?>\n', '<?xml version="1.0" encoding="UTF-8"?>']),
    _roots,
)
_ACCESSORS = ("arguments", "environment", "resource_limits", "dependencies", "duration", "custom_attributes")


def _read_sss(data: str | bytes) -> None:
    """Everything a reader of an SSS document does with it: read, resolve defaults, convert to the job
    descriptions the daemon would run, write back. Only SssError (a DescriptionError) may escape."""
    try:
        read_nodes(data)
    except SssError as exc:
        assert str(exc)
    try:
        result = read_job(data)
    except SssError as exc:
        assert str(exc)
        return
    value = result.value
    assert read_job(write_job(value)).value == value
    try:
        for job in effective_jobs(value):
            for p in (job.properties, *(tg.properties for tg in job.task_groups)):
                for accessor in _ACCESSORS:
                    getattr(p, accessor)
            for tg in job.task_groups:
                _check_description(description(job, tg))
        if isinstance(value, Job):
            _check_description(from_sss(value))
    except DescriptionError as exc:
        assert str(exc)


@pytest.mark.timeout(60 * STRETCH)
@UNIT
@given(_documents)
@example(
    "<Job><Executable>x</Executable><TaskGroup>"
    '<TaskDistribution type="TasksPerNode">abc</TaskDistribution></TaskGroup></Job>'
)
def test_generated_sss_documents_raise_only_sss_error(doc: str) -> None:
    _read_sss(doc)
    _read_sss(doc.encode())


_psij_maps = st.fixed_dictionaries(
    {"executable": st.sampled_from(["/bin/true", "/usr/bin/env"])},
    optional={
        "arguments": st.lists(st.sampled_from(["a", "b c", "'q'", '"', "${HOME}"]), max_size=3),
        "directory": st.sampled_from(["/tmp", "~/x"]),
        "name": _xml_safe_text,
        "inherit_environment": st.booleans(),
        "environment": st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,5}", fullmatch=True), _xml_safe_text),
        "stdout_path": st.just("/tmp/out"),
        "launcher": st.sampled_from(["single", "multiple", "mpirun"]),
        "pre_launch": st.just("/tmp/pre.sh"),
        "duration": st.floats(0.5, 1e6),
        "queue_name": _xml_safe_text,
        "custom_attributes": st.dictionaries(st.sampled_from(["a", "b.c"]), st.integers() | _xml_safe_text, max_size=2),
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "process_count": st.integers(1, 8),
                "node_count": st.integers(1, 4),
                "processes_per_node": st.integers(1, 4),
                "cpu_cores_per_process": st.integers(1, 4),
                "gpu_cores_per_process": st.integers(0, 2),
                "memory_per_process": st.integers(0, 2**40),
                "exclusive_node_use": st.booleans(),
            },
        ),
    },
)


def _valid_description(job: dict[str, Any]) -> JobDescription | None:
    try:
        return JobDescription.from_wire(job)
    except DescriptionError:
        return None


_psij_descriptions = _psij_maps.map(_valid_description).filter(lambda d: d is not None)
_SPOTS = re.compile(r'>([^<]*)</|="([^"]*)"')


@st.composite
def _psij_documents(draw: st.DrawFn) -> tuple[JobDescription, str, int]:
    """A PSI/J job as SSS XML (what to_sss writes), with a few of its texts and attribute values changed."""
    d = draw(_psij_descriptions)
    assert d is not None
    text = write_job(to_sss(d))
    changes = draw(st.integers(0, 3))
    for _ in range(changes):
        spot = draw(st.sampled_from(list(_SPOTS.finditer(text))))
        group = 1 if spot.group(1) is not None else 2
        word = _esc(draw(_XML_WORDS | _xml_safe_text), attr=True)
        text = text[: spot.start(group)] + word + text[spot.end(group) :]
    return d, text, changes


@pytest.mark.timeout(60 * STRETCH)
@UNIT
@given(_psij_documents())
@example(
    (
        JobDescription(executable="/bin/true"),
        '<Job><Executable>x</Executable><TaskGroup><TaskCount>1</TaskCount><Memory units="EB">1e300</Memory>'
        "</TaskGroup></Job>",
        1,
    )
)
def test_psij_jobs_as_changed_sss_xml_raise_only_sss_error(case: tuple[JobDescription, str, int]) -> None:
    """to_sss/from_sss invert each other; a document changed in a few places is refused with SssError
    or gives a description the daemon accepts."""
    d, text, changes = case
    note(text)
    if not changes:
        read = read_job(text).value
        assert isinstance(read, Job) and from_sss(read) == d
    _read_sss(text)


@pytest.mark.timeout(60 * STRETCH)
@UNIT
@given(
    st.one_of(
        st.text(max_size=200),
        st.text(st.characters(categories=["Cs", "Cc", "Co", "Zs"]), max_size=20),
        st.binary(max_size=200),
        st.tuples(st.sampled_from(["utf-8", "utf-16", "latin-1", "ascii", "bogus", "", "x" * 300]), _roots).map(
            lambda t: f'<?xml version="1.0" encoding="{t[0]}"?>{t[1]}'
        ),
        _documents.flatmap(lambda d: st.integers(0, len(d)).map(lambda n: d[:n])),
    ).flatmap(lambda d: st.sampled_from([d, d.encode("utf-8", "surrogatepass")]) if isinstance(d, str) else st.just(d))
)
@example("\ud800")
@example(b'<?xml version="1.0" encoding="bogus"?><Job/>')
def test_random_and_truncated_xml_raise_only_sss_error(data: str | bytes) -> None:
    _read_sss(data)


@st.composite
def _hostile_xml(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["entities", "external", "parameter", "deep", "attribute", "attributes", "wide"]))
    if kind == "entities":
        depth, width = draw(st.integers(1, 6)), draw(st.integers(2, 10))
        ents = ['<!ENTITY e0 "lol">'] + [f'<!ENTITY e{i} "{f"&e{i - 1};" * width}">' for i in range(1, depth + 1)]
        return f'<?xml version="1.0"?><!DOCTYPE Job [{"".join(ents)}]><Job><Executable>&e{depth};</Executable></Job>'
    if kind == "external":
        url = draw(st.sampled_from(["file:///etc/passwd", "http://127.0.0.1:9/x", "/dev/zero", "x.dtd"]))
        return f'<!DOCTYPE Job [<!ENTITY x SYSTEM "{url}">]><Job><Executable>&x;</Executable></Job>'
    if kind == "parameter":
        return '<!DOCTYPE Job [<!ENTITY % p SYSTEM "file:///etc/passwd"> %p;]><Job/>'
    if kind == "deep":
        n = draw(st.integers(MAX_DEPTH - 2, MAX_DEPTH + 50))
        tag = draw(st.sampled_from(["TaskGroup", "Job", "Environment", "x"]))
        return "<Job>" + f"<{tag}>" * n + f"</{tag}>" * n + "</Job>"
    if kind == "attribute":
        size = draw(st.integers(1, 4 << 20))
        return f'<Job><Executable name="{"a" * size}">x</Executable></Job>'
    if kind == "attributes":
        n = draw(st.integers(1, 3000))
        attrs = " ".join(f'a{i}="{i}"' for i in range(n))
        return f'<Job awarenessPolicy="Ignore"><Executable {attrs}>x</Executable></Job>'
    n = draw(st.integers(1, 20_000))
    return "<Job><Executable>x</Executable>" + "<Hold>User</Hold>" * n + "</Job>"


@pytest.mark.timeout(60 * STRETCH)
@settings(UNIT, max_examples=int(60 * SCALE))
@given(_hostile_xml())
def test_hostile_xml_is_refused_or_read_within_limits(doc: str) -> None:
    _read_sss(doc)
    if "<!ENTITY" in doc:
        with pytest.raises(SssError, match="DTD"):
            read_job(doc)


# ============================================================================================================
# The journal
# ============================================================================================================


def _write_journal(path: Path) -> None:
    node = NodeConfigured(name="n0", hostname="h0", processors=[0, 1], memory=1 << 30, gpus=[0])
    alloc = Allocation(
        native_id="1", lrm="local", state=AllocationState.ACTIVE, nodes=1, expected_nodes=[node], hosts=["h0"]
    )
    order = ProcessOrder(job_id="1", slot=0, role="rank", executable="/bin/echo", cores=[0], directory="/tmp")
    desc = JobDescription(executable="/bin/echo", arguments=["a"], environment={"A": "1"}, duration=30.0)

    with Store.open(path) as store:
        with store.batch() as tx:
            for i in (1, 2, 3):
                tx.job_accepted(str(i), i, desc, float(i))
            tx.allocation(alloc)
        with store.batch() as tx:
            running = JobRecord(id="1", description=desc, submitted=1.0, state=JobState.ACTIVE, phase=Phase.RANKS)
            running.run.started, running.run.ranks = 2.0, [RankPlacement("n0", [0], [0], 100)]
            running.run.add_process(0, PlannedProcess("n0", order, [0]))
            tx.process_dispatched("1", running.run.processes[0])
            tx.job_update(running, placed=True)
            pre = JobRecord(id="2", description=desc, submitted=2.0, phase=Phase.PRE_LAUNCH)
            pre.run.started, pre.run.ranks = 3.0, [RankPlacement("n0", [1], [], 0)]
            pre.run.add_process(PRE, PlannedProcess("n0", ProcessOrder("2", PRE, "pre", "/bin/sh"), []))
            tx.process_dispatched("2", pre.run.processes[PRE])
            tx.job_update(pre, placed=True)
            tx.pre_launch_environment("2", {"B": "2"}, ["C"])
            tx.process_result("3", 0, ProcessResult("n0", "rank", exit_code=1, data={"max_rss": 5}))
            failed = JobRecord(id="3", description=desc, submitted=3.0, state=JobState.FAILED, state_time=4.0)
            failed.exit_code, failed.message, failed.metadata = 1, "boom", {"wall_duration": 1}
            tx.job_update(failed)


#: Exceptions other than JournalError the journal reader may let escape: none (fuzzing found
#: UnicodeDecodeError from a damaged schema byte and OverflowError from a REAL infinity; both fixed).
KNOWN_STORE_ESCAPES: tuple[type[BaseException], ...] = ()


def _load_journal(path: Path) -> None:
    try:
        with Store.open(path) as store:
            store.load()
    except JournalError as exc:
        assert str(exc)
    except KNOWN_STORE_ESCAPES:
        pass


@pytest.fixture
def journal(tmp_path: Path) -> Callable[[], Path]:
    """A fresh copy of a valid journal per call (each example corrupts its own)."""
    source = tmp_path / "source.db"
    _write_journal(source)
    with Store.open(source) as store:
        assert [j.id for j in store.load().jobs] == ["1", "2", "3"]
    counter = itertools.count()

    def fresh() -> Path:
        d = tmp_path / f"j{next(counter)}"
        d.mkdir()
        shutil.copy(source, d / "journal.db")
        return d / "journal.db"

    return fresh


@pytest.mark.timeout(60 * STRETCH)
def test_journal_with_damaged_bytes_raises_only_journal_error(journal: Callable[[], Path]) -> None:
    @UNIT
    @given(
        st.lists(st.tuples(st.floats(0, 1), st.binary(min_size=1, max_size=8)), max_size=6),
        st.lists(st.tuples(st.integers(0, 99), st.integers(0, 255)), max_size=3),  # the header's bytes
        st.none() | st.floats(0, 1),
    )
    def load(edits: list[tuple[float, bytes]], header: list[tuple[int, int]], cut: float | None) -> None:
        path = journal()
        data = bytearray(path.read_bytes())
        for where, new in edits:
            pos = int(where * (len(data) - 1))
            data[pos : pos + len(new)] = new
        for pos, byte in header:
            data[pos] = byte
        if cut is not None:
            del data[int(cut * len(data)) :]
        path.write_bytes(bytes(data))
        _load_journal(path)
        shutil.rmtree(path.parent)

    load()


_COLUMNS = {
    "jobs": ["id", "seq", "description", "submitted", "state", "state_time", "exit_code", "message", "metadata",
             "phase", "started", "ended", "cancel_reason", "closing", "ranks", "environment", "unset", "orders"],
    "results": ["job_id", "slot", "node", "role", "exit_code", "signal", "message", "reason", "data"],
    "allocation": ["lrm", "native_id", "state", "nodes", "submitted", "started", "walltime", "expected_nodes",
                   "hosts", "message"],
    "meta": ["key", "value"],
}  # fmt: skip
_cells = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    _text,
    st.binary(max_size=20),
    _values.map(raw),
    st.sampled_from(
        [
            raw([["n0", [0], [0], 1, False]]),
            raw([["n0", 0, [0], "x", False]]),
            raw([[1, 2]]),
            raw({"executable": "/bin/true", "resources": {"node_count": 0}}),
            raw({"job_id": "1", "slot": 0}),
            raw([[0, "n0", raw({"job_id": "1", "slot": 0}), [0]]]),
            raw([[0, "n0", b"\xc1", [0]]]),
            raw([{"name": "n"}]),
            b"\x91" * 100_000,
            "Idle",
            "COMPLETED",
        ]
    ),
)


@st.composite
def _statements(draw: st.DrawFn) -> tuple[str, tuple[Any, ...]]:
    """One change a damaged or foreign journal may hold: a cell of any type, a missing table or column."""
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return draw(
            st.sampled_from(
                [
                    ("DROP TABLE results", ()),
                    ("ALTER TABLE jobs DROP COLUMN orders", ()),
                    ("DROP TABLE allocation", ()),
                    ("ALTER TABLE results DROP COLUMN data", ()),
                    ("DELETE FROM meta", ()),
                    (
                        "INSERT INTO jobs (id, seq, description, submitted, state, state_time) "
                        "VALUES ('9', 'x', x'c1', 1, 'NEW', 1)",
                        (),
                    ),
                ]
            )
        )
    if choice == 1:
        pragma = draw(st.sampled_from(["user_version", "application_id"]))
        return (f"PRAGMA {pragma} = {draw(st.integers(-(2**31), 2**31 - 1))}", ())
    table = draw(st.sampled_from(sorted(_COLUMNS)))
    column = draw(st.sampled_from(_COLUMNS[table]))
    return (f"UPDATE {table} SET {column} = ?", (draw(_cells),))


@pytest.mark.timeout(60 * STRETCH)
def test_journal_with_damaged_records_raises_only_journal_error(journal: Callable[[], Path]) -> None:
    @UNIT
    @given(st.lists(_statements(), min_size=1, max_size=3))
    def load(statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        path = journal()
        db = sqlite3.connect(path)
        for sql, args in statements:
            try:
                db.execute(sql, args)
            except sqlite3.Error:
                pass  # a constraint held: that change is not made
        db.commit()
        db.close()
        _load_journal(path)
        shutil.rmtree(path.parent)

    load()


@pytest.mark.timeout(30)
def test_journal_with_a_damaged_schema_byte_raises_journal_error(journal: Callable[[], Path]) -> None:
    path = journal()
    data = bytearray(path.read_bytes())
    table = data.find(b"CREATE TABLE meta")
    end = data.find(b"WITHOUT ROWID", table) + len(b"WITHOUT ROWID") - 1
    assert table >= 0 and end > table
    data[end] = 0x80  # the D of ROWID
    path.write_bytes(bytes(data))
    with pytest.raises(JournalError, match=r"corrupt|cannot be used"), Store.open(path) as store:
        store.load()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "sql",
    [
        # The next sequence number as earlier pilots kept it (now max(seq) of the jobs: no row of its own)
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('seq', 9e999)",
        "UPDATE jobs SET seq = 9e999 WHERE id = '1'",  # where it comes from now
        "UPDATE jobs SET ranks = x'9195a26e30910090cb7ff0000000000000c2' WHERE id = '1'",  # memory: inf
    ],
)
def test_journal_with_an_infinite_integer_raises_journal_error(journal: Callable[[], Path], sql: str) -> None:
    path = journal()
    db = sqlite3.connect(path)
    assert db.execute(sql).rowcount == 1
    db.commit()
    db.close()
    with pytest.raises(JournalError), Store.open(path) as store:
        store.load()


# ============================================================================================================
# A live daemon
# ============================================================================================================


class Peer:
    """A raw DEALER socket on one of the daemon's sockets."""

    def __init__(self, url: str, identity: bytes | None = None) -> None:
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.connect(url)

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def drain(self) -> None:
        """Drop what is waiting (the replies of an example that failed: the next one starts clean)."""
        while self.sock.poll(0):
            self.sock.recv_multipart()

    def recv(self, allowed: frozenset[str], timeout: float = 10) -> wire.Message:
        assert self.sock.poll(int(timeout * 1000)), f"the daemon sent nothing for {timeout} s"
        frames = self.sock.recv_multipart()
        assert len(frames) == 1, frames
        return wire.decode(frames[0], allowed=allowed)  # the daemon itself always speaks the protocol

    def close(self) -> None:
        self.sock.close(linger=0)


def _decode_request(frames: list[bytes], allowed: frozenset[str]) -> wire.Message | None:
    """The message the daemon will act on, or None for one it must drop (its own rule: one payload frame
    that decodes)."""
    if len(frames) != 1:
        return None
    try:
        return wire.decode(frames[0], allowed=allowed)
    except ProtocolError:
        return None


def _agent_pids(pilot: Any) -> list[int]:
    return sorted(p.pid for p in psutil.Process(pilot.pid).children() if p.cmdline()[1:3] == ["-m", "agent"])


def _still_serving(pilot: Any, agent_pids: list[int], active: list[str], after: str) -> None:
    daemon = psutil.Process(pilot.pid)
    assert daemon.is_running() and daemon.status() != psutil.STATUS_ZOMBIE, f"the daemon died after {after}"
    assert _agent_pids(pilot) == agent_pids, f"agent processes changed after {after}"
    ex = pilot.executor()
    nodes = {n["name"]: n["agent"] for n in ex.pilot_status()["nodes"]}
    assert all(nodes.get(name) == "active" for name in active), f"an agent was disturbed by {after}: {nodes}"
    job = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(job)
    status = job.wait(timeout=30)
    assert status is not None and status.state is psij.JobState.COMPLETED, f"after {after}: {status}"
    log = pilot.rundir.log_file.read_text()
    assert "Traceback" not in log and '"exception"' not in log, "the daemon logged an unexpected exception"


def _still_there(pilot: Any, jobs: dict[str, psij.JobState]) -> None:
    """Jobs accepted before the barrage: a new client attaching finds each in the state it had."""
    ex = pilot.executor()
    for native_id, state in jobs.items():
        job = psij.Job()
        ex.attach(job, native_id)
        assert job.status.state is state, (native_id, job.status)


def _client_requests(tmp: Path) -> Strategy[bytes]:
    rid = st.integers(0, 2**31)
    ids = st.lists(_text | st.integers(10**6, 10**9).map(str), max_size=4)
    return st.one_of(
        st.builds(
            lambda r, jobs: wire.encode(Kind.SUBMIT, {"rid": r, "jobs": jobs}),
            rid,
            st.lists(_job_maps(tmp), min_size=1, max_size=4),
        ),
        st.builds(
            lambda k, r, i: wire.encode(k, {"rid": r, "ids": i}), st.sampled_from([Kind.CANCEL, Kind.ATTACH]), rid, ids
        ),
        st.builds(
            lambda k, r, extra: wire.encode(k, {**extra, "rid": r}),
            st.sampled_from([Kind.HELLO, Kind.LIST, Kind.STATUS, Kind.SHUTDOWN]),
            rid,
            st.dictionaries(_text, _values, max_size=2),
        ),
    )


def _client_bodies(tmp: Path) -> Strategy[dict[str, Any]]:
    rids = st.one_of(st.integers(0, 2**31), st.integers(0, 2**31), _values)
    ids = st.lists(_text | st.integers(10**6, 10**9).map(str), max_size=4)
    requests = st.one_of(
        st.fixed_dictionaries({"jobs": _or_wrong(st.lists(_job_maps(tmp), max_size=4))}),
        st.fixed_dictionaries({"jobs": st.integers(1000, 50_000).map(lambda n: [5] * n)}),
        st.fixed_dictionaries({"ids": _or_wrong(ids)}),
        st.dictionaries(_text, _values, max_size=3),
        st.just({}),
    )
    return st.tuples(requests, st.none() | rids).map(lambda t: t[0] if t[1] is None else {**t[0], "rid": t[1]})


def _defang(frames: list[bytes], protected: set[str], tmp: Path) -> list[bytes]:
    """Garbage may do anything except what a legitimate client may do to the test itself: shut the pilot
    down, cancel the jobs submitted before the barrage, or run a program that is not harmless."""
    msg = _decode_request(frames, wire.CLIENT_KINDS)
    if msg is None:
        return frames
    body = msg.body
    if msg.kind == Kind.SHUTDOWN and type(body.get("rid")) is int:
        return [b"\xc1"]
    if msg.kind == Kind.CANCEL and isinstance(body.get("ids"), list) and protected & set(map(str, body["ids"])):
        return [b"\xc1"]
    if msg.kind == Kind.SUBMIT and isinstance(body.get("jobs"), list):
        for job in body["jobs"]:
            try:
                d = JobDescription.from_wire(job)
            except DescriptionError:
                continue
            if not _runs_safely(d, tmp):
                return [b"\xc1"]
    return frames


def _check_reply(request: wire.Message, reply: wire.Message) -> None:
    """A reply to a request the daemon decoded: errors where the request was wrong, one result per item."""
    body = reply.body
    assert reply.kind == Kind.REPLY
    if request.kind == Kind.SUBMIT:
        jobs = request.body.get("jobs")
        if not isinstance(jobs, list):
            assert body["error"].startswith("bad submit request"), body
            return
        assert len(body["results"]) == len(jobs)
        for job, result in zip(jobs, body["results"], strict=True):
            try:
                JobDescription.from_wire(job)
            except DescriptionError as exc:
                assert result == {"error": str(exc)}, (job, result)
            else:
                assert "id" in result or "error" in result, result
    elif request.kind in (Kind.CANCEL, Kind.ATTACH):
        ids = request.body.get("ids")
        if isinstance(ids, list) and all(isinstance(i, str) for i in ids):
            assert len(body["results"]) == len(ids)
        else:
            assert body["error"].startswith(f"bad {request.kind} request"), body


CLIENT_CONFIG = '[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 2\n'


@pytest.mark.timeout(150 * STRETCH)
def test_client_socket_barrage(start_pilot: Any, tmp_path: Path) -> None:
    pilot = start_pilot(CLIENT_CONFIG)
    ex = pilot.executor()
    agents_active(ex, 2)
    agent_pids = _agent_pids(pilot)
    done = psij.Job(psij.JobSpec(executable="/bin/true"))
    long = psij.Job(psij.JobSpec(executable="/bin/sleep", arguments=["600"]))
    held = psij.Job(psij.JobSpec(executable="/bin/true", resources=psij.ResourceSpecV1(process_count=4, node_count=2)))
    ex.submit(done)
    assert done.wait(timeout=20) is not None and done.status.state is psij.JobState.COMPLETED
    ex.submit(long)
    reach(long, psij.JobState.ACTIVE)
    ex.submit(held)  # every core: it waits behind the long job
    reach(held, psij.JobState.QUEUED)
    before = {
        str(done.native_id): psij.JobState.COMPLETED,
        str(long.native_id): psij.JobState.ACTIVE,
        str(held.native_id): psij.JobState.QUEUED,
    }
    peer = Peer(pilot.info["client_url"])
    barrier = itertools.count(10**12)
    kinds = sorted(wire.CLIENT_KINDS)

    @LIVE
    @given(st.lists(_frames(kinds, _client_bodies(tmp_path), _client_requests(tmp_path)), min_size=1, max_size=5))
    def barrage(messages: list[list[bytes]]) -> None:
        peer.drain()
        tally["examples"] += 1
        expected: list[tuple[int, wire.Message]] = []
        for frames in messages:
            frames = _defang(frames, set(before), tmp_path)
            msg = _decode_request(frames, wire.CLIENT_KINDS)
            if msg is not None and type(msg.body.get("rid")) is int:
                expected.append((msg.body["rid"], msg))
                tally[msg.kind] += 1
            else:
                tally["dropped"] += 1
            peer.send(frames)
        mark = next(barrier)
        peer.send([wire.encode(Kind.HELLO, {"rid": mark})])
        # Replies come in request order; the garbage gets none, and events for accepted jobs may interleave.
        got: list[int] = []
        while not got or got[-1] != mark:
            reply = peer.recv(wire.TO_CLIENT_KINDS)
            if reply.kind == Kind.REPLY:
                got.append(reply.body["rid"])
                if len(got) <= len(expected):
                    _check_reply(expected[len(got) - 1][1], reply)
                    for result in (
                        reply.body.get("results", []) if expected[len(got) - 1][1].kind == Kind.SUBMIT else []
                    ):
                        tally["job accepted" if "id" in result else "job refused"] += 1
                        if "error" in result:  # why, for the assertion's message below
                            tally["refused: " + str(result["error"])[:60]] += 1
        assert got == [rid for rid, _ in expected] + [mark]

    tally: Counter[str] = Counter()
    try:
        barrage()
    finally:
        peer.close()
    # Not a vacuous barrage: garbage was dropped, requests were answered, jobs accepted and refused.
    assert all(tally[k] for k in ("dropped", Kind.SUBMIT, "job accepted", "job refused")), tally
    _still_there(pilot, before)
    _still_serving(pilot, agent_pids, ["local-0", "local-1"], "the client socket barrage")
    assert long.status.state is psij.JobState.ACTIVE and held.status.state is psij.JobState.QUEUED


def _agent_bodies(name: Strategy[Any], job_ids: list[str]) -> dict[str, Strategy[dict[str, Any]]]:
    """Bodies an agent sends, by kind: near-valid, with wrong values mixed in."""
    event = st.tuples(
        _or_wrong(st.sampled_from([*job_ids, "999999"]) | _text),
        _or_wrong(st.integers(-3, 3)),
        _or_wrong(st.sampled_from(["started", "exited", "failed"])),
        _or_wrong(st.floats(0, 2e9)),
        _or_wrong(
            st.fixed_dictionaries(
                {},
                optional={
                    k: _values for k in ("exit_code", "signal", "message", "reason", "spawned", "environment", "unset")
                },
            )
        ),
    ).map(list)
    events = st.lists(event | _values, max_size=4)
    running = st.lists(st.tuples(_text, st.integers(-2, 3)).map(list) | _values, max_size=2)
    return {
        Kind.REGISTER: st.fixed_dictionaries(
            {"node": _or_wrong(_node_maps(name) | name.map(lambda n: dict(_VALID_NODE, name=n)))},
            optional={"running": _or_wrong(running), "events": _or_wrong(events), "seq": _or_wrong(_ints)},
        ),
        Kind.HEARTBEAT: st.fixed_dictionaries(
            {}, optional={"time": _values, "running": _values, "load": _or_wrong(st.lists(st.floats(), max_size=4))}
        ),
        Kind.TASK_EVENTS: st.fixed_dictionaries({"events": _or_wrong(events)}, optional={"seq": _or_wrong(_ints)}),
        Kind.BYE: st.fixed_dictionaries({}, optional={"node": _or_wrong(name)}),
    }


def _agent_frames(name: Strategy[Any], job_ids: list[str], kinds: list[str]) -> Strategy[list[bytes]]:
    by_kind = _agent_bodies(name, job_ids)
    bodies = st.one_of(*by_kind.values(), st.dictionaries(_text, _values, max_size=3))
    requests = st.one_of(*(by_kind[k].map(_encoder(k)) for k in kinds))
    return _frames(kinds, bodies, requests)


def _encoder(kind: str) -> Callable[[dict[str, Any]], bytes]:
    return lambda body: wire.encode(kind, body)


def _identity_text(s: str, n: int) -> str:
    # Unique per example (zmq refuses an identity still connected), and of one length whatever the count:
    # what the strategies draw next must not depend on state outside the example (hypothesis checks).
    return f"{s.lstrip(chr(0)) or 'x'}#{n:09d}"


@pytest.mark.timeout(150 * STRETCH)
def test_agent_socket_barrage(start_pilot: Any, tmp_path: Path) -> None:
    """Fake agents with random identities, and one impostor registered as a node whose agent never came."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\n[ "$PILOT_AGENT_NODE" = local-2 ] && exec sleep 600\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    pilot = start_pilot(
        "[pilot]\nheartbeat_interval = 0.5\nagent_timeout = 5\n"
        f'[allocation]\nlrm = "local"\nnodes = 3\ncores_per_node = 1\nagent_python = "{python}"\n'
    )
    ex = pilot.executor()
    wait_for(lambda: sum(n["agent"] == "active" for n in ex.pilot_status()["nodes"]) == 2, what="local-0 and local-1")
    agent_pids = _agent_pids(pilot)
    long = psij.Job(psij.JobSpec(executable="/bin/sleep", arguments=["600"]))
    held = psij.Job(psij.JobSpec(executable="/bin/true", resources=psij.ResourceSpecV1(process_count=3, node_count=3)))
    ex.submit(long)
    reach(long, psij.JobState.ACTIVE)
    ex.submit(held)
    reach(held, psij.JobState.QUEUED)
    before = {str(long.native_id): psij.JobState.ACTIVE, str(held.native_id): psij.JobState.QUEUED}
    url = pilot.info["agent_url"]
    kinds = sorted(wire.AGENT_KINDS)
    counter = itertools.count()
    allowed = wire.TO_AGENT_KINDS | {Kind.HEARTBEAT}
    beat = wire.encode(Kind.HEARTBEAT, {"time": time.time(), "running": 0, "load": [0.0]})
    # Identities that are not UTF-8 are dropped whole: this one must never hear anything.
    mute = Peer(url, identity=b"\xff\xfefuzz")
    anonymous = Peer(url)

    @LIVE
    @given(st.data())
    def strangers(data: st.DataObject) -> None:
        """Unknown agents: everything but REGISTER is answered 'known: false'; nothing registers them."""
        name = _identity_text(data.draw(_text, label="identity"), next(counter))
        peer = Peer(url, identity=name.encode())
        try:
            messages = data.draw(
                st.lists(_agent_frames(st.just(name) | _text, list(before), kinds), min_size=1, max_size=5)
            )
            answered = 0
            for frames in messages:
                msg = _decode_request(frames, wire.AGENT_KINDS)
                answered += msg is not None and msg.kind != Kind.REGISTER
                tally["stranger " + (msg.kind if msg is not None else "dropped")] += 1
                peer.send(frames)
                mute.send(frames)
                anonymous.send(frames)
            peer.send([beat])
            for _ in range(answered + 1):
                reply = peer.recv(allowed)
                assert reply.kind == Kind.HEARTBEAT and reply.body.get("known") is False, reply
        finally:
            peer.close()

    impostor = Peer(url, identity=b"local-2")
    node = NodeConfigured(name="local-2", hostname="fake", processors=[0], memory=1 << 30)

    def register() -> bool:
        impostor.send([wire.encode(Kind.REGISTER, {"node": node.to_wire(), "running": []})])
        return impostor.recv(allowed).kind == Kind.REGISTERED

    @LIVE
    @given(
        st.lists(
            _agent_frames(st.just("local-2") | _text, list(before), [Kind.REGISTER, Kind.HEARTBEAT, Kind.TASK_EVENTS]),
            min_size=1,
            max_size=5,
        )
    )
    def registered(messages: list[list[bytes]]) -> None:
        """A registered node's agent: every heartbeat is answered 'known: true' (and a REGISTER at most with
        REGISTERED); its task events about processes it does not hold change nothing."""
        impostor.drain()
        beats = registers = 0
        for frames in messages:
            msg = _decode_request(frames, wire.AGENT_KINDS)
            if msg is not None and msg.kind == Kind.BYE:  # damage can make one: it would really unregister
                frames, msg = [b"\xc1"], None
            if msg is not None and msg.kind == Kind.TASK_EVENTS and isinstance(msg.body, dict):
                # Unnumbered: a batch numbered past the next is a gap, which really asks for a REGISTER
                # (tests/core/test_core_exactly_once.py checks that).
                frames = [wire.encode(Kind.TASK_EVENTS, {**msg.body, "seq": 0})]
            beats += msg is not None and msg.kind == Kind.HEARTBEAT
            registers += msg is not None and msg.kind == Kind.REGISTER
            tally["registered " + (msg.kind if msg is not None else "dropped")] += 1
            impostor.send(frames)
        impostor.send([beat])
        heard = registered = 0
        while heard < beats + 1:
            reply = impostor.recv(allowed)
            if reply.kind == Kind.HEARTBEAT:
                assert reply.body.get("known") is True, f"the registered node was forgotten: {reply}"
                heard += 1
            elif reply.kind == Kind.REGISTERED:
                registered += 1
        assert registered <= registers
        tally["registered again"] += registered

    tally: Counter[str] = Counter()
    try:
        strangers()
        assert register()
        registered()
        impostor.send([wire.encode(Kind.BYE, {"node": "local-2"})])
        impostor.send([beat])
        assert impostor.recv(allowed).body.get("known") is False
        assert not mute.sock.poll(0), "a peer whose identity is not UTF-8 was answered"
    finally:
        for p in (impostor, mute, anonymous):
            p.close()
    # Not vacuous: strangers and the registered impostor sent garbage and requests of every kind.
    for who, kinds_sent in (("stranger", kinds), ("registered", [Kind.REGISTER, Kind.HEARTBEAT, Kind.TASK_EVENTS])):
        assert all(tally[f"{who} {k}"] for k in [*kinds_sent, "dropped"]), tally
    _still_there(pilot, before)
    _still_serving(pilot, agent_pids, ["local-0", "local-1"], "the agent socket barrage")
    nodes = {n["name"]: n["agent"] for n in ex.pilot_status()["nodes"]}
    assert nodes == {"local-0": "active", "local-1": "active", "local-2": "stopped"}, nodes
    assert long.status.state is psij.JobState.ACTIVE and held.status.state is psij.JobState.QUEUED

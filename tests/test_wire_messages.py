"""The typed messages (pilot/wire/messages.py): each kind round-trips through its frame, each side
accepts only its own kinds, and a hostile body is refused with a ProtocolError that names the field."""

from __future__ import annotations

from typing import Any

import pytest

from pilot import wire
from pilot.model.node import NodeConfigured
from pilot.model.process_order import ProcessOrder
from pilot.wire import Kind, ProtocolError
from pilot.wire import messages as m

pytestmark = pytest.mark.timeout(30)

NODE = NodeConfigured(name="n0", hostname="h0", processors=[0, 1], memory=1 << 30)
NODE2 = NodeConfigured(name="n1", hostname="h1", processors=[0, 1], memory=1 << 30)
NODE3 = NodeConfigured(name="n2", hostname="h2", processors=[0], memory=1 << 30)
EVENT = m.TaskEvent("7~1", 0, "exited", 12.5, {"exit_code": 0, "max_rss": 100})
ORDER = ProcessOrder(job_id="7", slot=0, role="rank", executable="/bin/true", cores=[1], directory="/tmp")

SAMPLES: list[Any] = [
    m.Register(NODE, (("7", 0),), (EVENT,), 3, {"load_avg": 0.5}, {"cpu": 12.0}),
    m.Register(
        NODE,
        values={},
        utilized={},
        more=(m.Register(NODE2, (("8", 1),), (), 2, {"a": 1}, {}), m.Register(NODE3, values={}, utilized={})),
    ),
    m.Heartbeat((0.5, 0.25, 0.125), {"mem_free": 10}, {"cpu": 1.0}),
    m.Heartbeat((0.5,), {}, {}, nodes=("n1", "n2")),
    m.TaskEvents((EVENT, m.TaskEvent("8", 2, "started", 1.0, {"pid": 5})), 9),
    m.Bye("n0"),
    m.Registered(1.0, 4),
    m.HeartbeatReply(known=True, acked=2),
    m.HeartbeatReply(known=False),
    m.HeartbeatReply(known=True, acked=2, acks={"n1": 0, "n2": 7}, unknown=("n3",)),
    m.Launch((ORDER,)),
    m.Kill((("7", 0), ("8~1", 3)), "canceled"),
    m.Withdraw((("9", 0),)),
    m.Stop("pilot stopped"),
    m.Submit(1, [{"executable": "/bin/true"}], ["k-1"]),
    m.Cancel(2, ("1", "2")),
    m.CancelWhere(2, ("QUEUED",), "run-1"),
    m.CancelWhere(2, run="run-1"),
    m.Attach(3, ("1",)),
    m.Explain(4, ("1",)),
    m.Show(5, ("1",)),
    m.Release(6, ("1",)),
    m.Hello(7),
    m.ListJobs(8),
    m.ListJobs(8, ranges=True),
    m.Status(9),
    m.Nodes(10),
    m.Shutdown(11, drain=True),
    m.Abandon(12, ("k-1", "k-2")),
    m.Jobs(13, ("FAILED",), run="run-1", limit=5, delivered=True),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda x: type(x).__name__)
def test_each_message_round_trips_on_its_side(msg: Any) -> None:
    frame = m.encode(msg)
    if isinstance(msg, m.ClientRequest):
        assert m.decode_request(frame) == (msg.rid, msg)
        return
    side = m.TO_AGENT if type(msg) in m.TO_AGENT.values() else m.TO_DAEMON_FROM_AGENT
    assert m.decode(frame, side) == msg


def test_each_side_refuses_the_other_sides_kinds() -> None:
    with pytest.raises(ProtocolError, match="unknown message kind 'launch'"):
        m.decode(m.encode(m.Launch((ORDER,))), m.TO_DAEMON_FROM_AGENT)
    with pytest.raises(ProtocolError, match="unknown message kind 'register'"):
        m.decode(m.encode(m.Register(NODE)), m.TO_AGENT)
    with pytest.raises(ProtocolError, match="unknown message kind 'kill'"):
        m.decode_request(m.encode(m.Kill((), "x")))


def test_the_kind_tables_agree_with_the_codecs_sets() -> None:
    assert set(m.TO_DAEMON_FROM_AGENT) == wire.AGENT_KINDS
    assert set(m.TO_AGENT) == wire.TO_AGENT_KINDS | {Kind.HEARTBEAT}
    assert set(m.TO_DAEMON_FROM_CLIENT) == wire.CLIENT_KINDS


@pytest.mark.parametrize(
    ("kind", "body", "says"),
    [
        (Kind.TASK_EVENTS, {"events": [["1", 0, "exited", 1.0]]}, "a task event is [job_id, slot, kind, time, data]"),
        (Kind.TASK_EVENTS, {"events": [["1", True, "exited", 1.0, {}]]}, "a task event has wrong field types"),
        (Kind.TASK_EVENTS, {"events": [["1", 0, "exploded", 1.0, {}]]}, "unknown task event kind 'exploded'"),
        (Kind.TASK_EVENTS, {"events": [["1", 0, "exited", True, {}]]}, "a task event has wrong field types"),
        (Kind.TASK_EVENTS, {"events": [["1", 0, "exited", "1.0", {}]]}, "a task event has wrong field types"),
        (Kind.TASK_EVENTS, {"events": [["1", 0, "exited", 1.0, []]]}, "a task event has wrong field types"),
        (Kind.TASK_EVENTS, {"events": [[1, 0, "exited", 1.0, {}]]}, "a task event has wrong field types"),
        (Kind.TASK_EVENTS, {"events": "x"}, "field 'events' must be list"),
        (Kind.REGISTER, {"node": NODE.to_wire(), "running": [["1"]]}, "running must be [job_id, slot] pairs"),
        (Kind.REGISTER, {"running": []}, "missing field 'node'"),
        (Kind.REGISTER, {"node": NODE.to_wire(), "running": [], "more": {}}, "field 'more' must be list"),
        (Kind.REGISTER, {"node": NODE.to_wire(), "running": [], "more": [1]}, "must be a list of REGISTER bodies"),
        (Kind.REGISTER, {"node": NODE.to_wire(), "running": [], "more": [{"running": []}]}, "missing field 'node'"),
        (
            Kind.REGISTER,
            {"node": NODE.to_wire(), "running": [], "more": [{"node": NODE2.to_wire(), "running": [], "more": []}]},
            "must not carry 'more' itself",
        ),
        (
            Kind.REGISTER,
            {"node": NODE.to_wire(), "running": [], "more": [{"node": NODE.to_wire(), "running": []}]},
            "names a node twice",
        ),
        (
            Kind.REGISTER,
            {"node": NODE.to_wire(), "running": [], "more": [{}] * m.MOST_HOSTED},
            f"at most {m.MOST_HOSTED - 1} go with one REGISTER",
        ),
        (Kind.HEARTBEAT, {"nodes": "n1"}, "field 'nodes' must be list"),
        (Kind.HEARTBEAT, {"nodes": ["n1", 2]}, "field 'nodes' must be a list of node names"),
        (Kind.HEARTBEAT, {"nodes": [""]}, "field 'nodes' must be a list of node names"),
        (Kind.HEARTBEAT, {"nodes": ["x" * 256]}, "field 'nodes' must be a list of node names"),
        (Kind.HEARTBEAT, {"nodes": ["n"] * m.MOST_HOSTED}, f"at most {m.MOST_HOSTED - 1} go with one message"),
    ],
)
def test_hostile_agent_bodies_are_refused_whole(kind: str, body: dict[str, Any], says: str) -> None:
    with pytest.raises(ProtocolError) as info:
        m.decode(wire.encode(kind, body), m.TO_DAEMON_FROM_AGENT)
    assert says in str(info.value)


@pytest.mark.parametrize(
    ("kind", "body", "says"),
    [
        (Kind.KILL, {"processes": [["1", "0"]], "reason": "x"}, "processes must be [job_id, slot] pairs"),
        (Kind.KILL, {"processes": []}, "missing field 'reason'"),
        (Kind.REGISTERED, {"heartbeat_interval": float("nan")}, "is not between 0.01 and 3600 s"),
        (Kind.REGISTERED, {"heartbeat_interval": 0.0}, "is not between 0.01 and 3600 s"),
        (Kind.LAUNCH, {"orders": "x"}, "field 'orders' must be list"),
        (Kind.HEARTBEAT, {"known": True, "acks": ["n1"]}, "field 'acks' must be dict"),
        (Kind.HEARTBEAT, {"known": True, "acks": {"n1": "1"}}, "field 'acks' must map"),
        (Kind.HEARTBEAT, {"known": True, "acks": {"n1": -1}}, "field 'acks' must map"),
        (Kind.HEARTBEAT, {"known": True, "acks": {"n1": True}}, "field 'acks' must map"),
        (Kind.HEARTBEAT, {"known": True, "unknown": [3]}, "field 'unknown' must be a list of node names"),
    ],
)
def test_hostile_daemon_bodies_are_refused(kind: str, body: dict[str, Any], says: str) -> None:
    with pytest.raises(ProtocolError) as info:
        m.decode(wire.encode(kind, body), m.TO_AGENT)
    assert says in str(info.value)


def test_a_bad_request_says_which_kind_and_keeps_its_rid() -> None:
    rid, error = m.decode_request(wire.encode(Kind.CANCEL, {"rid": 5, "ids": [1]}))
    assert rid == 5 and isinstance(error, ProtocolError)
    assert str(error) == "bad cancel request: field 'ids' must be a list of strings"
    with pytest.raises(ProtocolError, match="missing field 'rid'"):
        m.decode_request(wire.encode(Kind.STATUS, {}))
    _, error = m.decode_request(wire.encode(Kind.JOBS, {"rid": 6, "delivered": 1}))
    assert str(error) == "bad jobs request: field 'delivered' must be bool, not int"


def test_heartbeat_measures_keep_only_well_typed_entries() -> None:
    hb = m.Heartbeat.from_body({"load": [1, 2, 3, 4], "values": {"a": 1, "b": [1], 3: 4}, "utilized": "x"})
    assert hb.load == (1.0, 2.0, 3.0) and hb.values == {"a": 1} and hb.utilized is None
    assert m.Heartbeat.from_body({"load": [True]}).load == ()


def test_status_report_is_checked() -> None:
    assert m.StatusReport.from_wire(["1", "COMPLETED", 2, 0, None, {"a": 1}]) == (
        "1",
        "COMPLETED",
        2.0,
        0,
        None,
        {"a": 1},
    )
    with pytest.raises(ProtocolError, match="wrong field types"):
        m.StatusReport.from_wire(["1", "COMPLETED", "now", 0, None, None])


def test_a_launch_frame_from_the_journals_packed_orders_is_the_frame_packed_afresh() -> None:
    """The daemon sends the orders' bytes its journal batch packed: the agent must read the same frame,
    also with an order the batch does not hold (one held back from an earlier flush) among them."""
    from pilot.launchers.base import PlannedProcess
    from pilot.store_batch import Batch

    tx = Batch()
    orders = []
    for i in range(3):
        order = ProcessOrder(str(i + 1), 0, "rank", "/bin/true", cores=[i], rank_environment={"PILOT_RANK": "0"})
        w = order.to_wire()
        tx.process_dispatched(str(i + 1), PlannedProcess("n0", order, [0]), order_wire=w)
        orders.append(w)
    held = ProcessOrder("9", 0, "rank", "/bin/echo", arguments=["x" * 40]).to_wire()
    assert tx.packed_order(dict(orders[0])) is None  # an equal map is not the journaled one
    for sent in (orders, [held, *orders], []):
        frame = m.Launch.frame(sent, tx.packed_order)
        assert frame == m.Launch.frame(sent)
        back = m.decode(frame, m.TO_AGENT)
        assert isinstance(back, m.Launch)
        assert [o.to_wire() for o in back.orders] == sent


def test_a_launch_whose_order_has_a_key_that_is_no_utf8_is_refused_as_a_bad_frame() -> None:
    """Found by test_fuzz.py: the one-pass decoding let a UnicodeDecodeError out of an agent's receive
    (a map key of the bytes 0x80...), where every other bad frame is a ProtocolError the agent logs."""
    good = m.Launch.frame([ProcessOrder("7", 0, "rank", "/bin/true", cores=[0]).to_wire()])
    bad = good.replace(b"\xa6job_id", b"\xa6\x80ob_id")
    assert bad != good
    with pytest.raises(ProtocolError, match="not a msgpack frame: UnicodeDecodeError"):
        m.decode(bad, m.TO_AGENT)


def test_an_order_with_every_field_set_sends_every_field_in_field_order() -> None:
    """to_wire names each optional field by hand: one it forgot would read back as its default."""
    from dataclasses import fields

    from pilot.model import process_order

    order = ProcessOrder(
        job_id="7~1", slot=3, role="pre", executable="/bin/sh", arguments=["a"], environment={"E": "1"},
        pre_environment={"P": "2"}, pre_unset=["U"], inherit_environment=False, directory="/d", stdin_path="",
        stdout_path="o", stderr_path="e", truncate_output=False, cores=[1, 2], gpus=[0], walltime=9.5,
        rank_environment={"R": "3"}, nodefile_hosts=[], script="s.sh", after_cores=True,
        rlimits=[["RLIMIT_CORE", 0, 0]], staging=[["/a", "a", "copy", False]], stream=True,
    )  # fmt: skip
    raw = order.to_wire()
    names = [f.name for f in fields(ProcessOrder)]
    assert sorted(raw) == sorted(names)
    assert list(raw) == list(process_order._REQUIRED) + [n for n in names if n not in process_order._REQUIRED]
    assert ProcessOrder._from_wire_checked(raw) == order
    assert all(value == getattr(order, name) for name, value in raw.items())


def test_a_rank_order_puts_each_of_its_jobs_fields_where_it_belongs() -> None:
    """rank_order builds the order positionally: each field of the job it carries comes out in its place."""
    from pilot.launchers.base import rank_order
    from pilot.model.job_description import JobDescription

    d = JobDescription(
        executable="/bin/x", arguments=["a"], directory="/d", inherit_environment=False, environment={"E": "1"},
        stdin_path="i", stdout_path="o", stderr_path="e", duration=7.5,
    )  # fmt: skip
    o = rank_order(
        job_id="9", slot=2, description=d, cores=[3, 4], gpus=[1], hosts=["h1", "h2", "h3"],
        environment={"P": "1"}, truncate=False,
    )  # fmt: skip
    assert o == ProcessOrder(
        job_id="9", slot=2, role="rank", executable="/bin/x", arguments=["a"], environment={"E": "1"},
        pre_environment={"P": "1"}, inherit_environment=False, directory="/d", stdin_path="i", stdout_path="o",
        stderr_path="e", truncate_output=False, cores=[3, 4], gpus=[1], walltime=7.5,
        rank_environment={"PILOT_JOB_ID": "9", "PILOT_RANK": "2", "PILOT_SIZE": "3"}, nodefile_hosts=["h1", "h2", "h3"],
    )  # fmt: skip
    bare = rank_order(
        job_id="1", slot=0, description=JobDescription(executable="/bin/true", submit_directory="/s"), cores=[0],
        gpus=[], hosts=["h"], environment=None, truncate=True,
    )  # fmt: skip
    assert (bare.directory, bare.pre_environment, bare.walltime, bare.truncate_output) == ("/s", {}, None, True)


def test_task_events_read_back_with_their_time_as_a_float() -> None:
    events = m.TaskEvents.from_body({"events": [["1", 0, "started", 5, {"pid": 7}], ["2~1", 1, "exited", 2.5, {}]]})
    assert events.events == (m.TaskEvent("1", 0, "started", 5.0, {"pid": 7}), m.TaskEvent("2~1", 1, "exited", 2.5, {}))
    assert all(type(e.time) is float for e in events.events)

"""Fuzzing of a live daemon's client and agent sockets (see test_fuzz.py for the contract)."""

from __future__ import annotations

import itertools
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq
from fuzzing import (
    _VALID_NODE,
    LIVE,
    STRETCH,
    Strategy,
    _frames,
    _ints,
    _job_maps,
    _node_maps,
    _or_wrong,
    _runs_safely,
    _text,
    _values,
)
from hypothesis import given
from hypothesis import strategies as st
from pilot_waits import agents_active, reach, wait_for

import client as psij
from pilot import wire
from pilot.model.job_description import DescriptionError, JobDescription
from pilot.model.node import NodeConfigured
from pilot.wire import Kind, ProtocolError

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

"""Hostile input on the daemon's live sockets: raw ZeroMQ peers send garbage to the client and agent
sockets, and fake agents try to register bogus nodes or report on jobs they do not hold. After each,
the daemon is alive, real agents are untouched and a normal client still runs a job to completion."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
import zmq
from conftest import _running
from pilot_waits import agents_active, ends, reach, wait_for

import client as psij
from pilot import wire
from pilot.wire import Kind

CONFIG = '[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 2\n'


def raw(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


class Peer:
    """A raw DEALER socket: sends whatever it is given, reads frames with a deadline."""

    def __init__(self, url: str, identity: bytes | None = None) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.connect(url)

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def recv(self, timeout: float = 10) -> wire.Message | None:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return wire.decode(self.sock.recv(), allowed=wire.TO_CLIENT_KINDS | wire.TO_AGENT_KINDS | {Kind.HEARTBEAT})

    def close(self) -> None:
        self.sock.close(linger=0)


class Checks:
    """What must hold after every piece of garbage."""

    def __init__(self, pilot: Any, nodes: int) -> None:
        self.pilot = pilot
        self.ex = pilot.executor()
        self.nodes = nodes
        self.baseline = agents_active(self.ex, nodes)
        self.agent_pids = sorted(
            p.pid for p in psutil.Process(pilot.pid).children() if p.cmdline()[1:3] == ["-m", "agent"]
        )
        assert len(self.agent_pids) == nodes

    def healthy(self, after: str) -> None:
        daemon = psutil.Process(self.pilot.pid)
        assert daemon.is_running() and daemon.status() != psutil.STATUS_ZOMBIE, f"daemon died after {after}"
        st = self.ex.pilot_status()
        names = sorted(n["name"] for n in st["nodes"])
        assert names == [f"local-{i}" for i in range(self.nodes)], f"nodes changed after {after}: {names}"
        assert all(n["agent"] == "active" for n in st["nodes"]), f"an agent was disturbed by {after}"
        assert sorted(p.pid for p in daemon.children() if p.cmdline()[1:3] == ["-m", "agent"]) == self.agent_pids, (
            f"agent processes changed after {after}"
        )
        job = psij.Job(psij.JobSpec(executable="/bin/sh", arguments=["-c", "exit 0"]))
        self.ex.submit(job)
        status = job.wait(timeout=20)
        assert status is not None and status.state is psij.JobState.COMPLETED, f"after {after}: {status}"


# -- the client socket --------------------------------------------------------------------------------------

_rng = random.Random(20240611)
DROPPED: list[tuple[str, list[bytes]]] = [
    ("random bytes", [_rng.randbytes(64)]),
    ("4 MiB of random bytes", [_rng.randbytes(4 << 20)]),
    ("an empty frame", [b""]),
    ("no frame at all but an empty multipart", [b"", b""]),
    ("truncated msgpack", [wire.encode(Kind.SUBMIT, {"rid": 1, "jobs": [{"executable": "/bin/true"}]})[:-7]]),
    ("trailing bytes", [wire.encode(Kind.HELLO, {"rid": 1}) + b"\x00"]),
    ("the reserved msgpack byte", [b"\xc1" * 32]),
    ("a header claiming 4G items", [b"\xdd\xff\xff\xff\xff"]),
    ("nesting deeper than any stack", [b"\x91" * 100_000]),
    ("a non-string map key", [raw([1, "hello", {1: 2, "rid": 1}])]),
    ("a bare map", [raw({"kind": "hello", "rid": 1})]),
    ("a two-element array", [raw([1, "hello"])]),
    ("protocol version 2", [raw([2, "hello", {"rid": 1}])]),
    ("protocol version true", [raw([True, "hello", {"rid": 1}])]),
    ("an unknown kind", [wire.encode("frobnicate", {"rid": 1})]),
    ("an agent's register", [wire.encode(Kind.REGISTER, {"rid": 1, "node": {"name": "evil"}, "running": []})]),
    ("an agent's task events", [wire.encode(Kind.TASK_EVENTS, {"rid": 1, "events": [["1", 0, "exited", 0, {}]]})]),
    ("a daemon's launch order", [wire.encode(Kind.LAUNCH, {"rid": 1, "orders": []})]),
    ("a daemon's reply", [wire.encode(Kind.REPLY, {"rid": 1})]),
    ("a body that is a list", [raw([1, "hello", [1, 2]])]),
    ("a body that is nil", [raw([1, "status", None])]),
    ("no rid", [wire.encode(Kind.HELLO, {})]),
    ("a boolean rid", [wire.encode(Kind.STATUS, {"rid": True})]),
    ("a string rid", [wire.encode(Kind.STATUS, {"rid": "1"})]),
    ("a float rid", [wire.encode(Kind.STATUS, {"rid": 1.0})]),
    ("two valid frames in one message", [wire.encode(Kind.HELLO, {"rid": 1}), wire.encode(Kind.HELLO, {"rid": 2})]),
    ("three frames", [b"a", b"b", b"c"]),
    ("a shutdown split over two frames", [wire.encode(Kind.SHUTDOWN, {"rid": 1}), b""]),
    ("an ext type body", [raw([1, "hello", msgpack.ExtType(42, b"boom")])]),
]


def _job(**fields: Any) -> dict[str, Any]:
    return {"jobs": [{"executable": "/bin/true", **fields}]}


REJECTED: list[tuple[str, str, dict[str, Any], str]] = [
    # name, kind, body, what the error must say (whole reply error, or the first result's)
    ("jobs not a list", Kind.SUBMIT, {"jobs": "x"}, "bad submit request: field 'jobs' must be list, not str"),
    ("jobs missing", Kind.SUBMIT, {}, "bad submit request: missing field 'jobs'"),
    ("a job that is a number", Kind.SUBMIT, {"jobs": [5]}, "job description must be a map"),
    ("a job that is an ext type", Kind.SUBMIT, {"jobs": [msgpack.ExtType(1, b"")]}, "job description must be a map"),
    ("a numeric executable", Kind.SUBMIT, {"jobs": [{"executable": 5}]}, "JobSpec.executable must be a string"),
    ("an unknown job field", Kind.SUBMIT, _job(rm="-rf"), "unknown job description field(s): rm"),
    (
        "bool cores",
        Kind.SUBMIT,
        _job(resources={"cpu_cores_per_process": True}),
        "cpu_cores_per_process must be an integer",
    ),
    (
        "negative memory",
        Kind.SUBMIT,
        _job(resources={"memory_per_process": -1}),
        "memory_per_process must not be negative",
    ),
    (
        "huge core count",
        Kind.SUBMIT,
        _job(resources={"cpu_cores_per_process": 2**63}),
        "can never run in this allocation",
    ),
    ("an environment of numbers", Kind.SUBMIT, _job(environment={"A": 1}), "environment must map strings to strings"),
    ("a relative directory", Kind.SUBMIT, _job(directory="../../etc"), "must be absolute"),
    ("srun outside a Slurm allocation", Kind.SUBMIT, _job(launcher="srun"), "'srun' needs a Slurm allocation"),
    ("too many arguments", Kind.SUBMIT, _job(arguments=["x"] * 70_000), "more than 65536 items"),
    (
        "submit_ids not a list",
        Kind.SUBMIT,
        {**_job(), "submit_ids": "k"},
        "bad submit request: field 'submit_ids' must be list",
    ),
    (
        "a submit id per two jobs",
        Kind.SUBMIT,
        {"jobs": [{"executable": "/bin/true"}] * 2, "submit_ids": ["k"]},
        "1 entries for 2",
    ),
    (
        "a numeric submit id",
        Kind.SUBMIT,
        {**_job(), "submit_ids": [7]},
        "a submit id must be a string of 1 to 128 characters",
    ),
    (
        "an empty submit id",
        Kind.SUBMIT,
        {**_job(), "submit_ids": [""]},
        "a submit id must be a string of 1 to 128 characters",
    ),
    (
        "a huge submit id",
        Kind.SUBMIT,
        {**_job(), "submit_ids": ["k" * 129]},
        "a submit id must be a string of 1 to 128 characters",
    ),
    (
        "a submit's 'again' not a boolean",
        Kind.SUBMIT,
        {"jobs": [{"executable": "/bin/true"}], "submit_ids": ["k"], "again": "yes"},
        "field 'again' must be",
    ),
    ("cancel ids not strings", Kind.CANCEL, {"ids": [1, 2]}, "bad cancel request: field 'ids' must be a list"),
    ("cancel of no such job", Kind.CANCEL, {"ids": ["424242"]}, "no job '424242' in this pilot"),
    ("cancel where nothing is named", Kind.CANCEL_WHERE, {}, "give 'states', 'run' or both"),
    ("cancel where a state is no state", Kind.CANCEL_WHERE, {"states": ["DONE"]}, "unknown state 'DONE'"),
    ("cancel where the run is a number", Kind.CANCEL_WHERE, {"run": 7}, "bad cancel_where request: field 'run'"),
    ("attach ids a string", Kind.ATTACH, {"ids": "1"}, "bad attach request: field 'ids' must be list, not str"),
    ("attach of no such job", Kind.ATTACH, {"ids": ["-1"]}, "no job '-1' in this pilot"),
]


def hello_round_trip(peer: Peer, rid: int, *, after: str = "garbage") -> None:
    """The first reply after a garbage frame is the reply to this hello: the garbage got none."""
    peer.send(wire.encode(Kind.HELLO, {"rid": rid}))
    msg = peer.recv()
    assert msg is not None, f"the daemon stopped answering after {after}"
    assert msg.kind == Kind.REPLY and msg.body.get("rid") == rid, (after, msg)
    assert "error" not in msg.body


def test_garbage_on_the_client_socket_is_dropped(start_pilot: Any) -> None:
    pilot = start_pilot(CONFIG)
    checks = Checks(pilot, 2)
    peer = Peer(pilot.info["client_url"])
    try:
        for i, (name, frames) in enumerate(DROPPED):
            peer.send(*frames)
            hello_round_trip(peer, 1000 + i, after=name)
        checks.healthy("all the dropped garbage")
    finally:
        peer.close()
    log = pilot.rundir.log_file.read_text()
    assert "dropped client frame" in log and "dropped client message" in log


def test_wrong_types_on_the_client_socket_get_a_clear_error(start_pilot: Any) -> None:
    pilot = start_pilot(CONFIG)
    checks = Checks(pilot, 2)
    peer = Peer(pilot.info["client_url"])
    try:
        for i, (name, kind, body, error) in enumerate(REJECTED):
            rid = 2000 + i
            peer.send(wire.encode(kind, {**body, "rid": rid}))
            msg = peer.recv()
            assert msg is not None and msg.kind == Kind.REPLY and msg.body["rid"] == rid, (name, msg)
            results = msg.body.get("results")
            said = msg.body["error"] if "error" in msg.body else results[0]["error"]
            assert error in said, (name, said)
        st = checks.ex.pilot_status()
        assert st["jobs"] == {} and st["queued"] == 0, "a rejected job was accepted"
        checks.healthy("requests with wrong field types")
    finally:
        peer.close()


def test_a_flood_of_garbage_does_not_starve_real_clients(start_pilot: Any) -> None:
    pilot = start_pilot(CONFIG)
    checks = Checks(pilot, 2)
    peer = Peer(pilot.info["client_url"])
    try:
        rng = random.Random(7)
        for _ in range(20_000):
            peer.send(rng.randbytes(rng.randrange(0, 200)))
        hello_round_trip(peer, 1)
        checks.healthy("20000 garbage frames")
    finally:
        peer.close()


def test_a_daemon_that_always_finds_input_still_answers_sigterm(start_pilot: Any) -> None:
    """A daemon whose agent socket never runs dry (a flood faster than it reads, as 10,000 nodes'
    heartbeats can be) must still let its other tasks run: SIGTERM stops it. Before, its loop found
    input at every turn and never yielded, so the signal (and an embedded pilot's parent watch) waited
    for ever."""
    pilot = start_pilot(CONFIG)
    agents_active(pilot.executor(), 2)
    stop = threading.Event()
    frame = wire.encode(Kind.HEARTBEAT, {"load": [0.0, 0.0, 0.0], "running": []})

    def flood() -> None:
        peer = Peer(pilot.info["agent_url"], identity=b"flood-1")
        try:
            while not stop.is_set():
                try:
                    for _ in range(1000):
                        peer.sock.send(frame, zmq.NOBLOCK)
                except zmq.Again:  # its queue is full (the daemon reads slower, or is gone)
                    time.sleep(0.001)
        finally:
            peer.close()

    flooders = [threading.Thread(target=flood) for _ in range(2)]
    for t in flooders:
        t.start()
    try:
        time.sleep(2)  # well behind by now
        daemon = psutil.Process(pilot.pid)
        daemon.send_signal(signal.SIGTERM)
        assert not _running([daemon], timeout=30), "the flooded daemon did not stop on SIGTERM"
    finally:
        stop.set()
        for t in flooders:
            t.join()


def test_hostile_values_in_well_formed_jobs_fail_only_those_jobs(start_pilot: Any, tmp_path: Path) -> None:
    """Jobs that pass validation but cannot be started (NUL bytes, missing paths) fail with a message;
    the agent that got them keeps working."""
    pilot = start_pilot('[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n')
    checks = Checks(pilot, 1)
    specs = {
        "NUL in the executable": psij.JobSpec(executable="/bin/tr\x00ue"),
        "NUL in an argument": psij.JobSpec(executable="/bin/echo", arguments=["a\x00b"]),
        "NUL in the environment": psij.JobSpec(executable="/bin/true", environment={"A": "x\x00y"}),
        "NUL in stdout_path": psij.JobSpec(executable="/bin/true", stdout_path=tmp_path / "o\x00ut"),
        "a missing directory": psij.JobSpec(executable="/bin/true", directory=tmp_path / "nope"),
        "a missing executable": psij.JobSpec(executable=str(tmp_path / "nope")),
        "an unwritable stdout": psij.JobSpec(executable="/bin/true", stdout_path="/proc/version/x"),
    }
    jobs = {name: psij.Job(spec) for name, spec in specs.items()}
    for job in jobs.values():
        checks.ex.submit(job)
    for name, job in jobs.items():
        status = job.wait(timeout=20)
        assert status is not None and status.state is psij.JobState.FAILED, (name, status)
        assert status.message, name
    checks.healthy("jobs that could not start")


def test_oversized_frames_are_dropped_unread(start_pilot: Any) -> None:
    pilot = start_pilot(CONFIG)
    checks = Checks(pilot, 2)
    big = b"\x00" * (wire.MAX_FRAME_BYTES + 1)
    for url in (pilot.info["client_url"], pilot.info["agent_url"]):
        peer = Peer(url, identity=b"big-sender")
        try:
            peer.send(big)
            # zmq refuses the frame and drops the connection; the peer gets nothing back
            assert peer.recv(timeout=0.5) is None
        finally:
            peer.close()
    daemon = psutil.Process(pilot.pid)
    assert daemon.memory_info().rss < 2 * wire.MAX_FRAME_BYTES
    checks.healthy("oversized frames")


# -- the agent socket ----------------------------------------------------------------------------------------


def unknown_agent_ack(peer: Peer, *, after: str = "garbage") -> None:
    """A heartbeat from an identity the daemon does not know is answered 'known: false'. Used as a
    barrier: frames from one peer are handled in order, so everything sent before has been handled."""
    peer.send(wire.encode(Kind.HEARTBEAT, {"time": time.time(), "running": 0, "load": [0.0]}))
    msg = peer.recv()
    assert msg is not None, f"the daemon stopped answering on the agent socket after {after}"
    assert msg.kind == Kind.HEARTBEAT and msg.body == {"known": False}, (after, msg)


def node_body(name: str, **override: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "hostname": "evil",
        "processors": list(range(64)),
        "memory": 1 << 40,
        "gpus": [0, 1, 2, 3],
        "os": "Linux",
        "architecture": "x86_64",
        "features": [],
    }
    body.update(override)
    return body


def test_garbage_on_the_agent_socket_is_dropped(start_pilot: Any) -> None:
    pilot = start_pilot(CONFIG)
    checks = Checks(pilot, 2)
    url = pilot.info["agent_url"]
    anonymous = Peer(url)  # zmq's generated identity: not even valid UTF-8, most of the time
    fake = Peer(url, identity=b"fake-1")
    garbage: list[tuple[str, list[bytes]]] = [
        ("random bytes", [random.Random(3).randbytes(256)]),
        ("an empty frame", [b""]),
        ("truncated msgpack", [wire.encode(Kind.REGISTER, {"node": node_body("fake-1"), "running": []})[:-9]]),
        ("protocol version 0", [raw([0, "heartbeat", {}])]),
        ("a client's submit", [wire.encode(Kind.SUBMIT, {"rid": 1, "jobs": [{"executable": "/bin/true"}]})]),
        ("a client's shutdown", [wire.encode(Kind.SHUTDOWN, {"rid": 1})]),
        ("a daemon's stop", [wire.encode(Kind.STOP, {"reason": "x"})]),
        ("a daemon's launch", [wire.encode(Kind.LAUNCH, {"orders": []})]),
        ("two frames", [wire.encode(Kind.BYE, {}), wire.encode(Kind.BYE, {})]),
        ("a body that is a list", [raw([1, "heartbeat", []])]),
        ("an unknown kind", [wire.encode("reboot", {})]),
        ("a heartbeat with junk load", [wire.encode(Kind.HEARTBEAT, {"load": "high", "running": "many"})]),
        ("task events not a list", [wire.encode(Kind.TASK_EVENTS, {"events": "x"})]),
        ("a bye", [wire.encode(Kind.BYE, {"node": "local-0"})]),
    ]
    try:
        for name, frames in garbage:
            anonymous.send(*frames)
            fake.send(*frames)
            unknown_agent_ack(fake, after=name)
            pilot_alive = psutil.Process(pilot.pid).is_running()
            assert pilot_alive, f"daemon died after {name}"
        checks.healthy("garbage on the agent socket")
    finally:
        anonymous.close()
        fake.close()
    assert "dropped agent frame" in pilot.rundir.log_file.read_text()


BOGUS_NODES: list[tuple[str, Any]] = [
    ("a node that is a string", "local-9"),
    ("no node at all", None),
    ("missing fields", {"name": "fake-1"}),
    ("no processors", node_body("fake-1", processors=[])),
    ("negative processors", node_body("fake-1", processors=[-1, 0])),
    ("duplicate processors", node_body("fake-1", processors=[0, 0])),
    ("string processors", node_body("fake-1", processors=["0"])),
    ("boolean processors", node_body("fake-1", processors=[True])),
    ("memory as text", node_body("fake-1", memory="1T")),
    ("negative memory", node_body("fake-1", memory=-1)),
    ("boolean memory", node_body("fake-1", memory=True)),
    ("duplicate GPUs", node_body("fake-1", gpus=[0, 0])),
    ("features not strings", node_body("fake-1", features=[1])),
    ("an empty name", node_body("")),
    ("another node's name", node_body("local-0")),
    ("a node outside the allocation", node_body("fake-1")),
]


def test_fake_agent_with_a_bogus_node_is_not_registered(start_pilot: Any) -> None:
    pilot = start_pilot(CONFIG)
    checks = Checks(pilot, 2)
    fake = Peer(pilot.info["agent_url"], identity=b"fake-1")
    impostor = Peer(pilot.info["agent_url"], identity=b"local-0")  # a live agent's identity: zmq refuses it
    try:
        for name, node in BOGUS_NODES:
            body = {"running": [["1", 0]]} if node is None else {"node": node, "running": [["1", 0]]}
            fake.send(wire.encode(Kind.REGISTER, body))
            # not registered: the daemon does not answer 'registered', and still does not know it
            unknown_agent_ack(fake, after=name)
        fake.send(wire.encode(Kind.REGISTER, {"node": node_body("fake-1"), "running": "all"}))
        unknown_agent_ack(fake)
        # the impostor says the real local-0 is leaving; it must not be heard
        impostor.send(wire.encode(Kind.BYE, {"node": "local-0"}))
        impostor.send(wire.encode(Kind.REGISTER, {"node": node_body("local-0", processors=[0]), "running": []}))
        assert impostor.recv(timeout=1) is None
        checks.healthy("bogus registrations")
        # never_fits still judges against the real nodes only (2 cores each): a 64-core job is refused
        with pytest.raises(psij.InvalidJobException, match="can never run"):
            huge = psij.ResourceSpecV1(cpu_cores_per_process=64)
            checks.ex.submit(psij.Job(psij.JobSpec(executable="/bin/true", resources=huge)))
    finally:
        fake.close()
        impostor.close()


def test_events_from_an_unknown_agent_do_not_touch_real_jobs(start_pilot: Any) -> None:
    pilot = start_pilot(CONFIG)
    checks = Checks(pilot, 2)
    job = psij.Job(psij.JobSpec(executable="/bin/sh", arguments=["-c", "sleep 1; exit 0"]))
    everything = psij.ResourceSpecV1(process_count=4, node_count=2, cpu_cores_per_process=1)
    queued = psij.Job(psij.JobSpec(executable="/bin/true", resources=everything))
    checks.ex.submit(job)
    reach(job, psij.JobState.ACTIVE)
    checks.ex.submit(queued)  # needs every core; waits behind the running job
    fake = Peer(pilot.info["agent_url"], identity=b"fake-1")
    try:
        now = time.time()
        for ev in (
            [job.native_id, 0, "exited", now, {"exit_code": 7, "signal": None}],
            [job.native_id, 0, "failed", now, {"message": "forged"}],
            [queued.native_id, 0, "started", now, {"pid": 1}],
            [job.native_id, -1, "exited", now, {"exit_code": 0, "environment": {"PATH": "/evil"}}],
        ):
            fake.send(wire.encode(Kind.TASK_EVENTS, {"events": [ev]}))
        fake.send(wire.encode(Kind.BYE, {"node": "local-0"}))
        unknown_agent_ack(fake)
    finally:
        fake.close()
    assert job.status.state is psij.JobState.ACTIVE
    assert queued.status.state is psij.JobState.QUEUED
    status = job.wait(timeout=20)
    assert status is not None and status.state is psij.JobState.COMPLETED and status.exit_code == 0, status
    assert (status.metadata or {})["wall_duration"] >= 0.9
    ends(queued, psij.JobState.COMPLETED)
    checks.healthy("forged task events")


def test_a_registered_agent_cannot_report_on_processes_of_another_node(start_pilot: Any) -> None:
    """Take over a node's identity after its agent died (before the daemon noticed) and report the
    other node's job as finished: the daemon only believes the node that holds the process."""
    pilot = start_pilot(CONFIG)
    checks = Checks(pilot, 2)
    job = psij.Job(psij.JobSpec(executable="/bin/sh", arguments=["-c", "sleep 1.5; exit 0"]))
    checks.ex.submit(job)
    reach(job, psij.JobState.ACTIVE)
    st = checks.ex.pilot_status()
    holder = next(n["name"] for n in st["nodes"] if n["processes"])
    victim = next(n["name"] for n in st["nodes"] if not n["processes"])
    agent = next(p for p in psutil.Process(pilot.pid).children() if p.environ().get("PILOT_AGENT_NODE") == victim)
    os.kill(agent.pid, signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(agent.pid) or agent.status() == psutil.STATUS_ZOMBIE, what="agent death")

    # zmq frees the identity once it has seen the old connection close: retry until the daemon answers
    def take_over() -> Peer | None:
        peer = Peer(pilot.info["agent_url"], identity=victim.encode())
        peer.send(wire.encode(Kind.HEARTBEAT, {"time": time.time(), "running": 0, "load": []}))
        msg = peer.recv(timeout=0.5)
        if msg is not None and msg.body.get("known") is True:
            return peer
        peer.close()
        return None

    fake: Peer = wait_for(take_over, what=f"taking over {victim}'s identity")
    try:
        forged = [job.native_id, 0, "exited", time.time(), {"exit_code": 9}]
        fake.send(wire.encode(Kind.TASK_EVENTS, {"events": [forged]}))
        fake.send(wire.encode(Kind.HEARTBEAT, {"time": time.time(), "running": 0, "load": []}))
        ack = fake.recv()
        assert ack is not None and ack.body.get("known") is True
        assert job.status.state is psij.JobState.ACTIVE, job.status
        # leave cleanly, so the daemon stops counting on the node
        fake.send(wire.encode(Kind.BYE, {"node": victim}))
        fake.send(wire.encode(Kind.HEARTBEAT, {"time": time.time(), "running": 0, "load": []}))
        ack = fake.recv()
        assert ack is not None and ack.body.get("known") is False
    finally:
        fake.close()
    status = job.wait(timeout=20)
    assert status is not None and status.state is psij.JobState.COMPLETED and status.exit_code == 0, status
    assert (status.metadata or {})["nodes"] == [holder]
    nodes = {n["name"]: n["agent"] for n in checks.ex.pilot_status()["nodes"]}
    assert nodes == {holder: "active", victim: "stopped"}


def test_a_fifo_as_stdin_does_not_wedge_the_node(start_pilot: Any, tmp_path: Path) -> None:
    pilot = start_pilot('[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n')
    ex = pilot.executor()
    agents_active(ex, 1)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    blocked = psij.Job(psij.JobSpec(executable="/bin/cat", stdin_path=fifo))
    ex.submit(blocked)
    try:
        after = psij.Job(psij.JobSpec(executable="/bin/true"))
        ex.submit(after)
        status = after.wait(timeout=3)
        assert status is not None and status.state is psij.JobState.COMPLETED, status
    finally:
        # unwedge the agent for the teardown: a writer that opens and closes gives its reader EOF
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader is blocked on it
        blocked.wait(timeout=20)

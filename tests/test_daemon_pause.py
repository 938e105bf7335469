"""A paused daemon blames no one (issue 19): a daemon stopped by SIGSTOP for several agent timeouts and
request timeouts, then resumed, declares no agent lost and fails no job, and every submit made to it
meanwhile -- lone, batched or pipelined -- waits for it and gets a definite answer. A submit given up
(its daemon gone, or its executor closed) is withdrawn on both sides: the client says the job will not
run, and no daemon of the run directory runs it (a job already made under its submit id is canceled). Real
daemons, agents, processes and signals; ``tests/stress/daemon_pauses.py`` repeats the pause under load."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from conftest import PYTHON, Pilot
from pilot_waits import agents_active, ends, reach, wait_for
from test_hostile_input import Peer

import client as psij
from client._translate import spec_to_wire
from pilot import wire
from pilot.core.admission import ABANDONED
from pilot.wire import Kind

pytestmark = pytest.mark.timeout(120)

CONFIG = """
[pilot]
heartbeat_interval = 0.5
agent_timeout = 2

[allocation]
lrm = "local"
nodes = 2
cores_per_node = 2
"""

PAUSE = 7.0  # three agent timeouts, seven request timeouts
TIMEOUT = 1.0  # the executors' request_timeout here


def executor(p: Pilot, *, pipelined: bool = False) -> psij.JobExecutor:
    ex = psij.JobExecutor.get_instance("pilot", url=str(p.rundir.path), pipelined=pipelined, request_timeout=TIMEOUT)
    p.executors.append(ex)
    return ex


def marker(out: Path, name: str) -> psij.JobSpec:
    """A job that appends ``name`` to ``out``: a line per run, so a job run twice shows twice."""
    return psij.JobSpec(executable="/bin/sh", arguments=["-c", f"echo {name} >> {out}"])


def gated(gate: Path) -> psij.JobSpec:
    return psij.JobSpec(executable="/bin/sh", arguments=["-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"])


def runs(out: Path) -> Counter[str]:
    return Counter(out.read_text().split()) if out.exists() else Counter()


@pytest.fixture
def stopped() -> Iterator[Callable[[int], None]]:
    """``stop(pid)``: SIGSTOP a daemon; it is sent SIGCONT at the end of the test whatever happens."""
    pids: list[int] = []

    def stop(pid: int) -> None:
        pids.append(pid)
        os.kill(pid, signal.SIGSTOP)

    yield stop
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def agents_lost(p: Pilot) -> list[str]:
    return [line for line in p.rundir.log_file.read_text().splitlines() if "agent gone" in line]


def test_a_paused_daemon_declares_no_agent_lost_and_its_running_jobs_complete(
    start_pilot: Callable[..., Pilot], tmp_path: Path, stopped: Callable[[int], None]
) -> None:
    p = start_pilot(CONFIG)
    ex = executor(p)
    agents_active(ex, 2)
    gate = tmp_path / "gate"
    jobs = [psij.Job(gated(gate)) for _ in range(4)]  # every core of both nodes
    for job in jobs:
        ex.submit(job)
    for job in jobs:
        reach(job, psij.JobState.ACTIVE)
    pid = p.pid
    stopped(pid)
    time.sleep(PAUSE)  # the agents heartbeat on into the stopped daemon's socket
    os.kill(pid, signal.SIGCONT)
    gate.touch()
    for job in jobs:
        ends(job, psij.JobState.COMPLETED)
    assert agents_lost(p) == []
    assert all(n["agent"] == "active" for n in agents_active(ex, 2)["nodes"])
    assert "agents are not blamed for it" in p.rundir.log_file.read_text()  # the pause was measured


def test_submits_to_a_stopped_daemon_wait_for_it_and_each_job_runs_once(
    start_pilot: Callable[..., Pilot], tmp_path: Path, stopped: Callable[[int], None]
) -> None:
    p = start_pilot(CONFIG)
    lone, piped = executor(p), executor(p, pipelined=True)
    agents_active(lone, 2)
    out = tmp_path / "out"
    single = psij.Job(marker(out, "single"))
    batch = [psij.Job(marker(out, f"batch-{i}")) for i in range(40)]
    stream = [psij.Job(marker(out, f"stream-{i}")) for i in range(40)]
    errors: list[BaseException] = []

    def run(call: Callable[[], object]) -> threading.Thread:
        def target() -> None:
            try:
                call()
            except BaseException as exc:  # recorded for the asserts
                errors.append(exc)

        t = threading.Thread(target=target)
        t.start()
        return t

    pid = p.pid
    stopped(pid)
    threads = [run(lambda: lone.submit(single)), run(lambda: lone.submit_all(batch))]
    for job in stream:
        piped.submit(job)  # returns at once: the answers come as statuses
    time.sleep(PAUSE)
    # Seven request timeouts later, nobody has been told anything: they all wait for the live daemon.
    assert all(t.is_alive() for t in threads) and not errors, errors
    assert all(job.status.state is psij.JobState.NEW for job in [single, *batch, *stream])
    os.kill(pid, signal.SIGCONT)
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    for job in [single, *batch, *stream]:
        ends(job, psij.JobState.COMPLETED, timeout=60)
    assert runs(out) == Counter(["single", *(f"batch-{i}" for i in range(40)), *(f"stream-{i}" for i in range(40))])
    assert agents_lost(p) == []


def test_submits_given_up_when_their_daemon_died_are_withdrawn_and_never_run(
    start_pilot: Callable[..., Pilot], tmp_path: Path, stopped: Callable[[int], None]
) -> None:
    p = start_pilot(CONFIG)
    piped = executor(p, pipelined=True)
    agents_active(executor(p), 2)
    out = tmp_path / "out"
    stopped(p.pid)
    jobs = [psij.Job(marker(out, f"j{i}")) for i in range(6)]
    for job in jobs:
        piped.submit(job)
    conn = piped._backend.connection
    wait_for(lambda: conn.unsent() == 0 and conn.in_flight(), what="the jobs to be sent (never answered)")
    p.kill9()
    said = [str(ends(job, psij.JobState.FAILED, timeout=30).message) for job in jobs]
    # Sent: withdrawn. Held in the executor behind two unanswered requests: never sent.
    assert "it was withdrawn: no pilot of" in said[0], said
    assert all("it was withdrawn" in m or "was not sent" in m for m in said), said
    assert not any("may" in m for m in said), said
    p.up_again()
    again = psij.Job(marker(out, "again"))
    wait_for(lambda: _submitted(executor(p), again), what="a submit to the restarted pilot")
    ends(again, psij.JobState.COMPLETED, timeout=30)
    assert runs(out) == Counter(["again"])


def _submitted(ex: psij.JobExecutor, job: psij.Job) -> bool:
    try:
        ex.submit(job)
    except psij.SubmitException:
        return False
    return True


def _submit_with_id(peer: Peer, spec: psij.JobSpec, submit_id: str, rid: int) -> dict[str, object]:
    peer.send(wire.encode(Kind.SUBMIT, {"rid": rid, "jobs": [spec_to_wire(spec)], "submit_ids": [submit_id]}))
    reply = peer.recv()
    assert reply is not None and reply.body["rid"] == rid, reply
    (result,) = reply.body["results"]
    assert isinstance(result, dict)
    return result


def test_a_job_made_under_a_submit_id_given_up_is_canceled_by_this_daemon_or_the_next(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    """What a client does when it gives up on a submit the pilot has already taken (its answer lost
    with a connection or a daemon): the submit id goes to the run directory's list (or, from a remote client,
    in an ABANDON request), and the job is canceled -- by the running daemon, or by the next one."""
    p = start_pilot(CONFIG)
    ex = executor(p)
    agents_active(ex, 2)
    gate = tmp_path / "gate"
    peer = Peer(str(p.info["client_url"]))
    try:
        made = [_submit_with_id(peer, gated(gate), f"gone-{i}", rid=i + 1) for i in range(2)]
    finally:
        peer.close()
    jobs = [psij.Job() for _ in made]
    for job, result in zip(jobs, made, strict=True):
        ex.attach(job, str(result["id"]))
        reach(job, psij.JobState.ACTIVE)

    p.rundir.abandon(["gone-0"])  # a local client gave up: the running daemon reads it
    status = ends(jobs[0], psij.JobState.CANCELED)
    assert status.message == ABANDONED, status

    p.kill9()
    p.rundir.abandon(["gone-1"])  # given up while no daemon ran: the next one reads it when it starts
    p.up_again()
    status = ends(jobs[1], psij.JobState.CANCELED, timeout=30)
    assert status.message == ABANDONED, status

    peer = Peer(str(p.info["client_url"]))  # a remote client's way: ABANDON, then the submit id is refused
    try:
        peer.send(wire.encode(Kind.ABANDON, {"rid": 7, "submit_ids": ["gone-2"]}))
        reply = peer.recv()
        assert reply is not None and reply.body["results"] == [{"submit_id": "gone-2"}], reply
        for submit_id in ("gone-0", "gone-2"):
            said = _submit_with_id(peer, marker(tmp_path / "out", submit_id), submit_id, rid=8)
            assert said == {"error": ABANDONED}, said
    finally:
        peer.close()
    assert not (tmp_path / "out").exists()


_CLOSER = textwrap.dedent(
    """
    import json, sys
    import client as psij

    url, out = sys.argv[1], sys.argv[2]
    ex = psij.JobExecutor.get_instance("pilot", url=url, pipelined=True, request_timeout=1)
    ex.list()  # connected
    print("ready", flush=True)
    sys.stdin.readline()  # the daemon is stopped now
    jobs = [psij.Job(psij.JobSpec(executable="/bin/sh", arguments=["-c", f"echo {i} >> {out}"])) for i in range(3)]
    for job in jobs:
        ex.submit(job)
    ex.close()  # nothing answered within request_timeout
    print(json.dumps([[str(job.status.state), job.status.message] for job in jobs]))
    """
)


def test_closing_an_executor_withdraws_what_the_stopped_daemon_did_not_answer(
    start_pilot: Callable[..., Pilot], tmp_path: Path, stopped: Callable[[int], None]
) -> None:
    p = start_pilot(CONFIG)
    ex = executor(p)
    agents_active(ex, 2)
    out = tmp_path / "out"
    pid = p.pid
    closer = subprocess.Popen(
        [PYTHON, "-c", _CLOSER, str(p.rundir.path), str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=p.env,
    )
    try:
        assert closer.stdout is not None
        wait_for(lambda: closer.stdout.readline() == "ready\n", what="the closer to connect")  # type: ignore[union-attr]
        stopped(pid)
        said_out, _ = closer.communicate("go\n", timeout=60)
    finally:
        if closer.poll() is None:
            closer.kill()
    assert closer.returncode == 0
    said = json.loads(said_out.splitlines()[-1])  # after any log line
    assert all(state == "FAILED" for state, _ in said), said
    assert "it was withdrawn" in said[0][1], said  # sent: withdrawn
    assert all("it was withdrawn" in m or "it was not sent" in m for _, m in said), said  # held back: never sent
    os.kill(pid, signal.SIGCONT)
    # The daemon reads the withdrawal before the submits waiting in its socket: none is taken.
    ok = psij.Job(marker(out, "ok"))
    ex.submit(ok)
    ends(ok, psij.JobState.COMPLETED)
    assert ex.list() == [ok.native_id]
    assert runs(out) == Counter(["ok"])
    assert psutil.Process(pid).is_running()

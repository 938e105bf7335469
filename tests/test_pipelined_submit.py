"""Pipelined submits (``JobExecutor(pipelined=True)``): ``submit()`` returns before the pilot's answer,
QUEUED or FAILED follows as a status, and jobs (each with its submit id) are never made twice nor lost
when a daemon dies with its answers (or the jobs themselves) in flight."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq
from conftest import Pilot
from pilot_waits import agents_active, ends, wait_for
from test_hostile_input import Peer

import client as psij
from pilot import wire
from pilot.wire import Kind

pytestmark = pytest.mark.timeout(120)

CONFIG = '[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n'


class Recorder:
    """Every status each job's callback saw, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[int, list[psij.JobState]] = {}

    def job(self, out: Path, i: int) -> psij.Job:
        """A job that appends ``i`` to ``out`` (a line per run: a job run twice shows twice)."""
        job = psij.Job(psij.JobSpec(executable="/bin/sh", arguments=["-c", f"echo {i} >> {out}"]))
        self.seen[i] = []

        def cb(_: psij.Job, status: psij.JobStatus) -> None:
            with self.lock:
                self.seen[i].append(status.state)

        job.set_job_status_callback(cb)
        return job


def runs(out: Path) -> Counter[int]:
    """How many times each job ran."""
    return Counter(int(line) for line in out.read_text().split()) if out.exists() else Counter()


def test_submit_returns_before_the_answer_and_every_job_runs_once(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    p = start_pilot(CONFIG)
    ex = p.executor(pipelined=True)
    assert ex.pipelined
    agents_active(p.executor(), 1)
    out = tmp_path / "out"
    rec = Recorder()
    conn = ex._backend.connection
    warm = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(warm)  # an executor's first submit waits for the ids the pilot leases it
    ends(warm, psij.JobState.COMPLETED)
    frames = conn.submit_frames
    os.kill(p.pid, signal.SIGSTOP)  # a daemon that answers nothing: submit() must not wait for it
    try:
        held = [rec.job(out, i) for i in range(50)]
        for job in held:
            ex.submit(job)
        assert all(job.status.state is psij.JobState.NEW and job.native_id is not None for job in held)
        # The first job went alone, the next ones in a second request (OUTSTANDING); any more wait in the
        # executor for an answer, together.
        wait_for(lambda: conn.unsent() == 0, what="the requests handed over to be sent")
        assert conn.submit_frames - frames == 2, conn.submit_frames
    finally:
        os.kill(p.pid, signal.SIGCONT)
    ends(held[-1], psij.JobState.COMPLETED, timeout=60)
    assert conn.submit_frames - frames <= 3, conn.submit_frames
    more = [rec.job(out, i) for i in range(50, 400)]
    for job in more:
        ex.submit(job)
    jobs = held + more
    for job in jobs:
        ends(job, psij.JobState.COMPLETED, timeout=60)
    assert runs(out) == Counter(range(400))
    wait_for(lambda: all(len(s) == 3 for s in rec.seen.values()), what="every callback to have run")
    assert all(s == [psij.JobState.QUEUED, psij.JobState.ACTIVE, psij.JobState.COMPLETED] for s in rec.seen.values())
    ids = [job.native_id for job in jobs]
    assert None not in ids and len(set(ids)) == 400 and set(ids) <= set(ex.list())  # type: ignore[arg-type]


def test_a_job_the_pilot_refuses_ends_failed_with_its_reason(start_pilot: Callable[..., Pilot]) -> None:
    p = start_pilot(CONFIG)
    ex = p.executor(pipelined=True)
    agents_active(p.executor(), 1)
    too_big = psij.Job(psij.JobSpec(executable="/bin/true", resources=psij.ResourceSpecV1(process_count=64)))
    no_launcher = psij.Job(psij.JobSpec(executable="/bin/true", launcher="nope"))
    good = psij.Job(psij.JobSpec(executable="/bin/true"))
    seen: list[psij.JobState] = []
    too_big.set_job_status_callback(lambda _, s: seen.append(s.state))
    for job in (too_big, good, no_launcher):
        ex.submit(job)  # nothing raises: the refusals come as statuses
    status = ends(too_big, psij.JobState.FAILED)
    assert "can never run in this allocation" in str(status.message), status
    status = ends(no_launcher, psij.JobState.FAILED)
    assert "JobSpec.launcher 'nope' is not known" in str(status.message), status
    ends(good, psij.JobState.COMPLETED)
    # Each has the id the client gave it at submit (leased from the pilot), refused or not.
    assert too_big.native_id is not None and no_launcher.native_id is not None
    assert len({too_big.native_id, good.native_id, no_launcher.native_id}) == 3
    assert seen == [psij.JobState.QUEUED, psij.JobState.FAILED]  # PSI/J's order: QUEUED is never skipped
    assert ex.list() == [good.native_id]
    with pytest.raises(psij.InvalidJobException, match="executable"):  # what the client checks itself raises
        ex.submit(psij.Job(psij.JobSpec()))


def test_jobs_in_flight_when_the_daemon_is_killed_are_sent_again_and_run_once(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    """Jobs sent to a daemon that dies before reading them: the new daemon on the same run directory
    gets them again, and each runs exactly once."""
    p = start_pilot(CONFIG)
    ex = p.executor(pipelined=True)
    agents_active(p.executor(), 1)
    out = tmp_path / "out"
    rec = Recorder()
    first = [rec.job(out, i) for i in range(20)]
    for job in first:
        ex.submit(job)
    for job in first:
        ends(job, psij.JobState.COMPLETED)
    os.kill(p.pid, signal.SIGSTOP)
    jobs = [rec.job(out, i) for i in range(20, 60)]
    for job in jobs:
        ex.submit(job)
    conn = ex._backend.connection
    wait_for(lambda: conn.unsent() == 0 and conn.in_flight(), what="the jobs to be sent (never answered)")
    p.kill9()
    p.up_again()
    for job in jobs:
        ends(job, psij.JobState.COMPLETED, timeout=60)
    assert runs(out) == Counter(range(60))
    assert len({job.native_id for job in first + jobs}) == 60


def test_a_submit_id_the_pilot_knows_is_answered_with_the_job_it_made(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    """The daemon side of a lost answer, over a raw socket: a job with a submit id sent again (in the same
    frame, in a later one, or to a daemon restarted after SIGKILL, each marked ``again`` as a client marks
    what it sends again) is the job its submit id made, never a second one."""
    p = start_pilot(CONFIG)
    agents_active(p.executor(), 1)
    out = tmp_path / "out"

    def job(i: int) -> dict[str, Any]:
        return {"executable": "/bin/sh", "arguments": ["-c", f"echo {i} >> {out}"]}

    def submit(
        peer: Peer, rid: int, submit_ids: list[str], jobs: list[dict[str, Any]], *, again: bool = True
    ) -> list[dict[str, Any]]:
        body = {"rid": rid, "jobs": jobs, "submit_ids": submit_ids, "again": again}
        peer.send(wire.encode(Kind.SUBMIT, body))
        while True:
            msg = peer.recv()
            assert msg is not None, "no answer"
            if msg.kind == Kind.REPLY:
                assert msg.body["rid"] == rid, msg
                results: list[dict[str, Any]] = msg.body["results"]
                return results

    peer = Peer(p.info["client_url"])
    try:
        a = submit(peer, 1, ["k1", "k2", "k2"], [job(1), job(2), job(2)], again=False)
        assert a[0]["id"] != a[1]["id"] and a[1]["id"] == a[2]["id"], a
        b = submit(peer, 2, ["k2", "k3"], [job(2), job(3)])
        assert b[0]["id"] == a[1]["id"] and b[0]["status"][1] in ("QUEUED", "ACTIVE", "COMPLETED"), b
        assert b[1]["id"] not in (a[0]["id"], a[1]["id"]) and "status" not in b[1], b
        wait_for(lambda: runs(out) == Counter([1, 2, 3]), what="the three jobs to run")
    finally:
        peer.close()
    p.kill9()
    p.up_again()
    peer = Peer(p.info["client_url"])
    try:
        c = submit(peer, 3, ["k1", "k4"], [job(1), job(4)])
        assert c[0]["id"] == a[0]["id"] and c[0]["status"][1] == "COMPLETED", c
        wait_for(lambda: runs(out) == Counter([1, 2, 3, 4]), what="the new job to run")
    finally:
        peer.close()
    assert runs(out) == Counter([1, 2, 3, 4])


class LossyRelay:
    """One client's connection to the daemon through a relay (real sockets both ways) that can swallow
    the daemon's answers and then drop the client's connection: an answer lost after the daemon
    journaled the jobs, made to happen."""

    def __init__(self, daemon_url: str, path: Path) -> None:
        self.url = f"ipc://{path}"
        self.swallow = threading.Event()
        self.swallowed = 0
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(daemon_url,), daemon=True)
        self._thread.start()

    def cut(self) -> None:
        """Close the client's side (its connection is lost) and listen again for its next one."""
        self._cut.set()
        wait_for(lambda: not self._cut.is_set(), what="the relay to drop the client")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self, daemon_url: str) -> None:
        ctx = zmq.Context.instance()
        back = ctx.socket(zmq.DEALER)
        back.setsockopt(zmq.LINGER, 0)
        back.connect(daemon_url)
        front = ctx.socket(zmq.ROUTER)
        front.setsockopt(zmq.LINGER, 0)
        front.bind(self.url)
        client = b""
        try:
            while not self._stop.is_set():
                if self._cut.is_set():
                    front.close(linger=0)
                    front = ctx.socket(zmq.ROUTER)
                    front.setsockopt(zmq.LINGER, 0)
                    front.bind(self.url)
                    self._cut.clear()
                for sock in zmq.select([front, back], [], [], 0.05)[0]:
                    if sock is front:
                        client, payload = front.recv_multipart()
                        back.send(payload)
                    else:
                        payload = back.recv()
                        reply = wire.decode(payload, allowed=wire.TO_CLIENT_KINDS).kind == Kind.REPLY
                        if reply and self.swallow.is_set():
                            self.swallowed += 1
                        elif client:
                            front.send_multipart([client, payload])
        finally:
            front.close(linger=0)
            back.close(linger=0)


def test_answers_lost_after_the_journal_took_the_jobs_are_made_good(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    """The daemon journals pipelined jobs and answers, the answers are lost with the connection: sent
    again on the next one, each is answered with the job it made, which runs once."""
    p = start_pilot(CONFIG)
    watcher = p.executor()
    agents_active(watcher, 1)
    relay = LossyRelay(str(p.info["client_url"]), tmp_path / "relay.sock")
    ex = psij.JobExecutor.get_instance("pilot", url=relay.url, pipelined=True)
    p.executors.append(ex)
    out = tmp_path / "out"
    rec = Recorder()
    try:
        before = [rec.job(out, i) for i in range(10)]
        for job in before:
            ex.submit(job)
        for job in before:
            ends(job, psij.JobState.COMPLETED)
        relay.swallow.set()
        lost = [rec.job(out, i) for i in range(10, 40)]
        for job in lost:
            ex.submit(job)
        # The requests sent (the rest wait in the executor for their answers) are journaled, their jobs run,
        # their answers are swallowed: well within the 10 s request timeout.
        conn = ex._backend.connection
        wait_for(
            lambda: conn.unsent() == 0 and relay.swallowed == conn.in_flight() > 0,
            what="the daemon to answer every request sent",
        )
        taken = len(watcher.list()) - 10
        assert 0 < taken <= 30, taken
        wait_for(lambda: len(runs(out)) == 10 + taken, what="the jobs taken to run, unknown to their client")
        assert all(job.status.state is psij.JobState.NEW for job in lost)  # no answer came: QUEUED did not
        relay.swallow.clear()
        relay.cut()
        for job in lost:
            ends(job, psij.JobState.COMPLETED, timeout=30)
    finally:
        relay.close()
    assert runs(out) == Counter(range(40))
    assert len(watcher.list()) == 40 and len({job.native_id for job in before + lost}) == 40
    wait_for(lambda: all(s[-1] is psij.JobState.COMPLETED for s in rec.seen.values()), what="the callbacks")
    assert all(s == [psij.JobState.QUEUED, psij.JobState.ACTIVE, psij.JobState.COMPLETED] for s in rec.seen.values())


def test_pipelined_jobs_survive_daemons_killed_mid_stream(start_pilot: Callable[..., Pilot], tmp_path: Path) -> None:
    """A stream of pipelined submits while the daemon is SIGKILLed and restarted twice: whatever was in
    flight (jobs unread, answers unsent), every job ends COMPLETED and runs exactly once."""
    p = start_pilot(CONFIG)
    ex = p.executor(pipelined=True)
    agents_active(p.executor(), 1)
    out = tmp_path / "out"
    rec = Recorder()
    n = 1500
    jobs = [rec.job(out, i) for i in range(n)]
    submitted = 0

    def stream() -> None:
        nonlocal submitted
        for job in jobs:
            while True:
                try:
                    ex.submit(job)
                    break
                except psij.SubmitException as exc:  # no daemon at that moment: the job was not sent
                    assert exc.transient and job.status.state is psij.JobState.NEW, exc
                    time.sleep(0.05)
            submitted += 1

    t = threading.Thread(target=stream)
    t.start()
    rng = random.Random(11)
    try:
        for k in range(2):
            wait_for(lambda k=k: submitted >= (k + 1) * n // 3, timeout=60, what="jobs to be submitted")
            time.sleep(rng.uniform(0, 0.05))
            p.kill9()
            p.up_again()
    finally:
        t.join(timeout=90)
    assert not t.is_alive()
    for job in jobs:
        ends(job, psij.JobState.COMPLETED, timeout=60)
    assert runs(out) == Counter(range(n))


def test_close_waits_for_the_answers(start_pilot: Callable[..., Pilot]) -> None:
    p = start_pilot(CONFIG)
    agents_active(p.executor(), 1)
    ex = psij.JobExecutor.get_instance("pilot", url=str(p.rundir.path), pipelined=True)
    for _ in range(300):
        ex.submit(psij.Job(psij.JobSpec(executable="/bin/true")))
    ex.close()
    assert len(p.executor().list()) == 300


def test_jobs_refused_for_want_of_room_are_sent_again(start_pilot: Callable[..., Pilot]) -> None:
    """Past ``pilot.max_queued`` the daemon holds submits, then refuses them; pipelined jobs are sent
    again until there is room, and none fails for it."""
    p = start_pilot('[pilot]\nmax_queued = 3\n[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 1\n')
    ex = p.executor(pipelined=True)
    agents_active(p.executor(), 1)
    blocker = psij.Job(psij.JobSpec(executable="/bin/sleep", arguments=["7"]))  # longer than the daemon holds
    ex.submit(blocker)
    jobs = [psij.Job(psij.JobSpec(executable="/bin/true")) for _ in range(10)]
    for job in jobs:
        ex.submit(job)
    for job in jobs:
        ends(job, psij.JobState.COMPLETED, timeout=60)
    ends(blocker, psij.JobState.COMPLETED)


def test_jobs_wait_for_a_stopped_daemon_and_are_withdrawn_when_it_dies(start_pilot: Callable[..., Pilot]) -> None:
    """Issue 19 changed this promise: jobs sent to a stopped daemon no longer end FAILED at
    ``request_timeout`` saying that the pilot "may still" take them (which it then did, with nobody
    following): they wait for the live daemon and run. Jobs sent to a daemon that then dies end FAILED
    when no pilot is back within the timeout, withdrawn -- the next daemon does not run them -- and new
    submits raise at once (not sent) until one is back."""
    p = start_pilot(CONFIG)
    agents_active(p.executor(), 1)
    ex = psij.JobExecutor.get_instance("pilot", url=str(p.rundir.path), pipelined=True, request_timeout=1.0)
    p.executors.append(ex)
    ok = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(ok)
    ends(ok, psij.JobState.COMPLETED)

    os.kill(p.pid, signal.SIGSTOP)
    try:
        silent = [psij.Job(psij.JobSpec(executable="/bin/true")) for _ in range(3)]
        for job in silent:
            ex.submit(job)
        for job in silent:
            assert job.wait(timeout=3) is None  # three request timeouts: still waiting, not FAILED
    finally:
        os.kill(p.pid, signal.SIGCONT)
    for job in silent:
        ends(job, psij.JobState.COMPLETED)
    assert len(p.executor().list()) == 4

    os.kill(p.pid, signal.SIGSTOP)
    orphans = [psij.Job(psij.JobSpec(executable="/bin/true")) for _ in range(3)]
    for job in orphans:
        ex.submit(job)
    conn = ex._backend.connection
    wait_for(lambda: conn.unsent() == 0 and conn.in_flight(), what="the jobs to be sent (never answered)")
    p.kill9()
    said = [str(ends(job, psij.JobState.FAILED, timeout=20).message) for job in orphans]
    # Sent: withdrawn. Held in the executor behind two unanswered requests: never sent.
    assert "it was withdrawn" in said[0], said
    assert all("it was withdrawn" in m or "the request was not sent" in m for m in said), said
    with pytest.raises(psij.SubmitException, match="no pilot is running") as err:
        ex.submit(psij.Job(psij.JobSpec(executable="/bin/true")))
    assert err.value.transient
    p.up_again()  # the next pilot on the run directory is found by the same executor
    again = psij.Job(psij.JobSpec(executable="/bin/true"))
    wait_for(lambda: _submitted(ex, again), what="a submit to the restarted pilot")
    ends(again, psij.JobState.COMPLETED, timeout=30)
    assert len(p.executor().list()) == 5  # none of the orphans


def _submitted(ex: psij.JobExecutor, job: psij.Job) -> bool:
    try:
        ex.submit(job)
    except psij.SubmitException:
        return False
    return True


def test_pipelined_is_chosen_by_keyword_then_config_then_environment(
    pilot_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No pilot is needed: an executor connects on first use."""

    def made(**kwargs: Any) -> bool:
        ex = psij.JobExecutor.get_instance("pilot", **kwargs)
        try:
            return ex.pipelined
        finally:
            ex.close()

    monkeypatch.delenv("PILOT_PIPELINED", raising=False)
    assert made()  # the default
    assert not made(pipelined=False)
    assert made(pipelined=True)
    assert made(config=psij.JobExecutorConfig(pipelined=True))
    monkeypatch.setenv("PILOT_PIPELINED", "yes")
    assert made()
    assert not made(pipelined=False) and not made(config=psij.JobExecutorConfig(pipelined=False))
    monkeypatch.setenv("PILOT_PIPELINED", "0")
    assert not made()
    monkeypatch.setenv("PILOT_PIPELINED", "maybe")
    with pytest.raises(ValueError, match="PILOT_PIPELINED='maybe': use 1"):
        made()
    with pytest.raises(TypeError, match="pipelined must be True or False"):
        made(config=psij.JobExecutorConfig(pipelined="yes"))
    assert list(pilot_home.iterdir()) == []  # nothing was started


def test_cancel_before_the_answer_waits_for_it_even_from_a_callback(start_pilot: Callable[..., Pilot]) -> None:
    """``cancel()`` of a pipelined job the pilot has not answered yet cancels it once the answer comes:
    from the submitting thread, and from a callback, which holds up the delivery of that job's QUEUED."""
    p = start_pilot(CONFIG)
    agents_active(p.executor(), 1)
    ex = psij.JobExecutor.get_instance("pilot", url=str(p.rundir.path), pipelined=True, request_timeout=60)
    p.executors.append(ex)

    def sleeper() -> psij.Job:
        return psij.Job(psij.JobSpec(executable="/bin/sleep", arguments=["60"]))

    first, second, third = sleeper(), sleeper(), sleeper()
    errors: list[BaseException] = []

    def submit_and_cancel_second(job: psij.Job, status: psij.JobStatus) -> None:
        if status.state is psij.JobState.QUEUED:
            try:
                ex.submit(second)
                ex.cancel(second)  # its QUEUED can only be delivered after this callback returns
            except BaseException as exc:
                errors.append(exc)

    first.set_job_status_callback(submit_and_cancel_second)
    warm = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(warm)  # an executor's first submit waits for the ids the pilot leases it
    ends(warm, psij.JobState.COMPLETED)
    os.kill(p.pid, signal.SIGSTOP)
    try:
        ex.submit(third)
        canceller = threading.Thread(target=ex.cancel, args=(third,))
        canceller.start()  # waits for the answer
    finally:
        os.kill(p.pid, signal.SIGCONT)
    canceller.join(timeout=30)
    assert not canceller.is_alive()
    ends(third, psij.JobState.CANCELED, timeout=20)
    ex.submit(first)
    ends(second, psij.JobState.CANCELED, timeout=20)  # well before the 60 s request_timeout
    assert not errors, errors
    ex.cancel(first)
    ends(first, psij.JobState.CANCELED)

"""A journal that cannot be written does not stop the pilot (issue 19, point 3).

The run directory (journal, logs, agents' logs) lives on a small tmpfs the test mounts and fills: a real
daemon with real agents and tasks goes through a full file system -- its reserve used, then changes held
in memory -- and space coming back, and a daemon SIGKILLed while it holds changes is started again. Root
only (it mounts the tmpfs); skipped otherwise."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Pilot
from pilot_waits import agents_active, list_when_back, wait_for

import client as psij
from bench.daemon_cost import Harness, exited, launch_orders
from client._requests import SubmitIds
from client._translate import spec_to_wire
from pilot import wire
from pilot.journal_guard import RETRY
from pilot.store import JOURNAL_FILE
from pilot.wire.messages import Cancel, Status, Submit, TaskEvents, encode

pytestmark = pytest.mark.timeout(300)

CONFIG = """
[pilot]
heartbeat_interval = 0.5
agent_timeout = 4
backlog = 0
journal_snapshot_seconds = 0

[allocation]
lrm = "local"
nodes = 1
cores_per_node = 2
"""


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs, mounted for this test and unmounted after it."""
    if os.getuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {proc.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def pilot_home(small_fs: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The run directories on the small file system (overrides conftest's)."""
    home = small_fs / "ph"
    home.mkdir()
    monkeypatch.setenv("PILOT_HOME", str(home))
    monkeypatch.delenv("PILOT_CONFIG", raising=False)
    return home


def _fill(path: Path) -> None:
    """Write zeros to ``path`` until its file system is full."""
    with open(path, "ab", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            while True:
                try:
                    f.write(b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break


def _gated(marks: Path, gate: Path, name: str) -> psij.Job:
    """A job that marks its start, waits for ``gate`` to exist, and marks its end: run once, its mark file
    reads 'start, end'."""
    script = f"echo start >> {marks / name}; while [ ! -e {gate} ]; do sleep 0.05; done; echo end >> {marks / name}"
    return psij.Job(psij.JobSpec(executable="/bin/sh", arguments=["-c", script], name=name))


def _marking(marks: Path, name: str) -> psij.Job:
    return psij.Job(psij.JobSpec(executable="/bin/sh", arguments=["-c", f"echo run >> {marks / name}"], name=name))


def _journal(ex: psij.JobExecutor) -> dict[str, Any]:
    journal: dict[str, Any] = ex.pilot_status()["pilot"]["journal"]
    return journal


def _submit_until_refused(ex: psij.JobExecutor, make: Callable[[int], psij.Job]) -> tuple[list[psij.Job], str]:
    """Submit jobs one by one until the pilot refuses one: those it accepted, and its refusal."""
    accepted = []
    for i in range(200):
        job = make(i)
        try:
            ex.submit(job)
        except psij.SubmitException as exc:
            assert exc.transient, exc
            return accepted, str(exc)
        accepted.append(job)
    raise AssertionError("200 jobs accepted on a full file system")


def _ends(job: psij.Job, state: psij.JobState = psij.JobState.COMPLETED) -> None:
    status = job.wait(timeout=60)
    assert status is not None and status.state is state, (job.native_id, status)


def test_full_file_system_refuses_new_jobs_and_loses_nothing(
    start_pilot: Callable[..., Pilot], small_fs: Path, tmp_path: Path
) -> None:
    p = start_pilot(CONFIG)
    journal_path = p.rundir.path / JOURNAL_FILE
    pid = p.pid
    marks = tmp_path / "marks"
    marks.mkdir()
    ex = p.executor()
    agents_active(ex, 1)
    gate1 = tmp_path / "gate1"
    running = {f"running-{i}": _gated(marks, gate1, f"running-{i}") for i in range(2)}  # both cores, throughout
    for job in running.values():
        ex.submit(job)
    for job in running.values():
        job.wait(timeout=30, target_states=[psij.JobState.ACTIVE])

    # The file system fills: the next commit uses the journal's reserve, and new jobs are refused with a
    # transient error naming the cause and the journal.
    _fill(small_fs / "filler-1")
    accepted, refusal = _submit_until_refused(ex, lambda i: _marking(marks, f"queued-{i}"))
    assert accepted, "a job accepted as the disk filled is journaled in the reserve's room"
    assert "database or disk is full" in refusal and str(journal_path) in refusal, refusal
    shown = p.cli("status").stdout
    assert "new jobs refused" in shown and "database or disk is full" in shown and str(journal_path) in shown, shown
    assert _journal(ex)["held"] == 0

    # The reserve's room is used up too: the running jobs end, and what follows is held in memory -- their
    # statuses are not sent, nothing new is placed -- until it can be written.
    _fill(small_fs / "filler-2")
    gate1.touch()
    for name in running:
        wait_for(lambda name=name: (marks / name).read_text() == "start\nend\n", 30, f"{name} to end")
    wait_for(lambda: _journal(ex)["held"] > 0, 30, "changes to be held in memory")
    journal = json.loads(p.cli("status", "--json").stdout)["pilot"]["journal"]
    assert journal["writable"] is False and "database or disk is full" in journal["error"], journal
    assert "held in memory" in p.cli("status").stdout
    assert not any(job.status.state.final for job in running.values()), "a status left before the journal held it"
    assert not list(marks.glob("queued-*")), "a job started while its start could not be journaled"
    assert p.pid == pid, "the daemon stays up"

    # Space comes back: the held changes are written, what waited goes out, new jobs are taken again.
    for filler in small_fs.glob("filler-*"):
        filler.unlink()
    wait_for(lambda: _journal(ex)["writable"], 30, "the journal to take new jobs again")
    assert _journal(ex)["held"] == 0
    later = _marking(marks, "later")
    ex.submit(later)
    for job in [*running.values(), *accepted, later]:
        _ends(job)
    for name in running:
        assert (marks / name).read_text() == "start\nend\n"
    for name in [f"queued-{i}" for i in range(len(accepted))] + ["later"]:
        assert (marks / name).read_text() == "run\n", name
    assert p.pid == pid

    # Full again, changes held, and the daemon SIGKILLed: the agent kept the events that were never
    # acknowledged, and the daemon started again (with room) gets them all.
    gate2 = tmp_path / "gate2"
    again = {f"again-{i}": _gated(marks, gate2, f"again-{i}") for i in range(2)}
    for job in again.values():
        ex.submit(job)
    for job in again.values():
        job.wait(timeout=30, target_states=[psij.JobState.ACTIVE])
    _fill(small_fs / "filler-3")
    queued, _ = _submit_until_refused(ex, lambda i: _marking(marks, f"queued-again-{i}"))
    _fill(small_fs / "filler-4")
    gate2.touch()
    wait_for(lambda: _journal(ex)["held"] > 0, 30, "changes to be held in memory")
    ids = {name: str(job.native_id) for name, job in again.items()}
    ids |= {f"queued-again-{i}": str(job.native_id) for i, job in enumerate(queued)}
    ex.close()
    p.kill9()
    for filler in small_fs.glob("filler-*"):
        filler.unlink()
    p.up_again()
    ex2 = p.executor()
    assert set(ids.values()) <= set(list_when_back(ex2))
    for name, native_id in ids.items():
        follow = psij.Job()
        ex2.attach(follow, native_id)
        _ends(follow)
        assert (marks / name).read_text() == ("start\nend\n" if name in again else "run\n"), name


def test_a_read_only_answer_is_not_held_with_a_burst_that_cannot_be_written(small_fs: Path) -> None:
    """A status request read in the very turn whose journal write fails first is answered at once: only
    what says a change was made waits for the journal (here the jobs' final statuses and the next
    order). A real daemon in this process (bench.daemon_cost's), its journal on the full tmpfs, fed over
    inproc sockets turn by turn, so the request and the unwritable exits are in one burst every time."""
    h = Harness(small_fs, nodes=1, cores=2, pilot={"journal_checkpoint_mib": 1, "backlog": 0})
    d, client, agent = h.daemon, h.client, h.agents["local-0"]
    try:
        description = spec_to_wire(psij.JobSpec(executable="/bin/true"))
        ids = SubmitIds()

        def submit(n: int, rid: int) -> dict[str, Any]:
            client.send(encode(Submit(rid, [description] * n, list(ids.take(n)))))
            d.turn()
            return _reply(client, rid)

        assert all(r.get("error") is None for r in submit(2, 1)["results"])
        orders = launch_orders(agent.recv())
        assert len(orders) == 2
        assert d.store is not None
        d.store.checkpoint()  # the WAL emptied: the next commits must grow it
        _fill(small_fs / "filler-1")
        third = submit(1, 2)["results"]  # written in the reserve's room; from now on new jobs are refused
        assert d.guard is not None and d.guard.trouble is not None and not d.guard.held, third
        _fill(small_fs / "filler-2")

        # One burst: both exits (their write fails) and a status request.
        ended = time.time()
        agent.send(encode(TaskEvents(tuple(exited(o, ended) for o in orders), 1)))
        client.send(encode(Status(3)))
        d.turn()
        assert d.guard.held, "the exits were written: the file system was not full"
        states: list[str] = []
        answer = _reply(client, 3, states=states)
        assert "COMPLETED" not in states, "a final status left while the journal held it"
        assert answer["pilot"]["journal"]["writable"] is False, answer
        assert not agent.poll(0), "an order left while the journal held its start"

        # While held: a refusal changes nothing and is answered at once; a cancel is answered once the
        # journal holds it. The canceled job's order, held, is not lost: it goes, and its kill after it.
        client.send(encode(Submit(4, [description], list(ids.take(1)))))
        client.send(encode(Cancel(5, ("3",))))
        d.turn()
        # (inproc: a frame sent is at its peer when send returns, so polls of 0 see every answer sent)
        answered = {}
        while client.poll(0):
            m = wire.decode(client.recv(), allowed=wire.TO_CLIENT_KINDS)
            if m.kind == wire.Kind.REPLY:
                answered[m.body["rid"]] = m.body
        assert 4 in answered and "error" in answered[4]["results"][0], answered
        assert 5 not in answered, "the cancel was answered while the journal could not hold it"
        assert not agent.poll(0), "a kill went ahead of the order it kills"
        for filler in small_fs.glob("filler-*"):
            filler.unlink()
        time.sleep(RETRY)
        d.turn()
        assert not d.guard.held
        assert _reply(client, 5)["results"] == [{"id": "3"}]
        released = []  # the statuses held with the journal follow the replies of the flush that wrote it
        while client.poll(0):
            m = wire.decode(client.recv(), allowed=wire.TO_CLIENT_KINDS)
            if m.kind == wire.Kind.EVENTS:
                released += [(e[0], str(e[1])) for e in m.body["events"]]
        assert {("1", "COMPLETED"), ("2", "COMPLETED")} <= set(released), released
        to_agent = [wire.decode(agent.recv(), allowed=wire.TO_AGENT_KINDS) for _ in range(2)]
        assert [m.kind for m in to_agent] == [wire.Kind.LAUNCH, wire.Kind.KILL], to_agent
        assert [o["job_id"] for o in to_agent[0].body["orders"]] == ["3"]
        assert to_agent[1].body["processes"] == [["3", 0]]
    finally:
        h.close()


def _reply(sock: Any, rid: int, *, timeout_ms: int = 2000, states: list[str] | None = None) -> dict[str, Any]:
    """The body of the reply to request ``rid``; the job states of the statuses before it go to ``states``."""
    while sock.poll(timeout_ms):
        m = wire.decode(sock.recv(), allowed=wire.TO_CLIENT_KINDS)
        if m.kind == wire.Kind.EVENTS and states is not None:
            states.extend(str(e[1]) for e in m.body["events"])
        elif m.kind == wire.Kind.REPLY and m.body.get("rid") == rid:
            body: dict[str, Any] = m.body
            return body
    raise AssertionError(f"no reply to request {rid} within {timeout_ms} ms")

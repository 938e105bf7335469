"""Job ids leased to clients (pilot/core/leases.py, client/_leases.py), over the real wire of a real
pilot: a raw client leases a block and names its jobs itself; ids it was not given are refused; an
id that made its job is followed, never made twice; attach from another executor waits for a submit
still on its way; the leases outlive a daemon restart on the same run directory."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Pilot
from pilot_waits import agents_active, ends
from test_hostile_input import Peer

import client as psij
from client._translate import spec_to_wire
from pilot import wire
from pilot.wire import Kind

pytestmark = pytest.mark.timeout(120)

CONFIG = '[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n'


class Raw:
    """A client that speaks the wire itself."""

    def __init__(self, p: Pilot) -> None:
        self.peer = Peer(str(p.info["client_url"]))
        self.rid = 0

    def ask(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        self.rid += 1
        self.peer.send(wire.encode(kind, {**body, "rid": self.rid}))
        while True:  # the statuses of jobs it submitted come too: skipped
            reply = self.peer.recv()
            assert reply is not None, f"no reply to {kind}"
            if reply.kind == Kind.REPLY:
                break
        assert reply.body.get("rid") == self.rid, (body, reply.body)
        return reply.body

    def submit(self, spec: psij.JobSpec, submit_id: str) -> dict[str, Any]:
        (result,) = self.ask(Kind.SUBMIT, {"jobs": [spec_to_wire(spec)], "submit_ids": [submit_id]})["results"]
        assert isinstance(result, dict)
        return result


def marker(out: Path, name: str) -> psij.JobSpec:
    return psij.JobSpec(executable="/bin/sh", arguments=["-c", f"echo {name} >> {out}"])


def test_a_leased_id_names_its_job_once_and_others_are_refused(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    p = start_pilot(CONFIG)
    ex = p.executor()
    agents_active(ex, 1)
    raw = Raw(p)
    try:
        lease = raw.ask(Kind.LEASE, {"count": 4})
        first, last = lease["first"], lease["last"]
        assert last - first == 3, lease
        again = raw.ask(Kind.LEASE, {"count": 2})
        assert again["first"] == last + 1, again  # never an id given before
        for bad in (0, -1, 70_000, "x", None):
            body = raw.ask(Kind.LEASE, {"count": bad})
            assert "error" in body and "count" in str(body["error"]), (bad, body)

        out = tmp_path / "out"
        made = raw.submit(marker(out, "a"), str(first))
        assert made.get("id") == str(first), made
        followed = raw.submit(marker(out, "a-again"), str(first))  # its answer was lost: sent again
        assert followed.get("id") == str(first) and "status" in followed, followed
        job = psij.Job()
        ex.attach(job, str(first))
        assert ends(job, psij.JobState.COMPLETED).state is psij.JobState.COMPLETED
        assert out.read_text().split() == ["a"]  # made once
        out.unlink()

        # An id the pilot gave a job itself: followed, not made again.
        own = psij.Job(psij.JobSpec(executable="/bin/true"))
        ex.submit(own)
        result = raw.submit(marker(out, "stolen"), str(own.native_id))
        assert result.get("id") == own.native_id and "status" in result, result
        # An id above every id given: taken on with the block a lease can hold from it (a predecessor's
        # client's, whose journal is gone); an id below it that no lease holds and no job has: refused.
        far = 10**12
        assert raw.submit(marker(out, "far"), str(far)).get("id") == str(far)
        assert raw.submit(marker(out, "far-next"), str(far + 1)).get("id") == str(far + 1)
        assert raw.ask(Kind.LEASE, {"count": 1})["first"] > far + 1  # nobody else gets that block
        refused = raw.submit(marker(out, "hole"), "100")
        assert "error" in refused and refused.get("unleased") and "not leased" in refused["error"], refused
        for odd in ("007", "1e3", "+5", "٣"):  # not the decimal form of an id: an opaque submit id
            result = raw.submit(marker(out, f"odd{len(odd)}"), odd)
            assert "id" in result and result["id"] not in (odd, "7", "5"), (odd, result)
    finally:
        raw.peer.close()


def test_attach_waits_for_a_submit_still_on_its_way(start_pilot: Callable[..., Pilot], tmp_path: Path) -> None:
    """Another process may attach to a job id the moment submit() gave it out; the pilot may not have
    the job yet. The attach waits for it (up to request_timeout) instead of failing at once."""
    p = start_pilot(CONFIG)
    follower = p.executor()
    agents_active(follower, 1)
    raw = Raw(p)
    try:
        lease = raw.ask(Kind.LEASE, {"count": 2})
        early, never = str(lease["first"]), str(lease["last"])
        job = psij.Job()
        attached = threading.Thread(target=follower.attach, args=(job, early))
        attached.start()
        attached.join(0.5)
        assert attached.is_alive() and job.status.state is psij.JobState.NEW  # waiting for the submit
        out = tmp_path / "out"
        assert raw.submit(marker(out, "late"), early).get("id") == early
        attached.join(10)
        assert not attached.is_alive()
        assert ends(job, psij.JobState.COMPLETED).state is psij.JobState.COMPLETED
        assert out.read_text().split() == ["late"]

        quick = psij.JobExecutor.get_instance("pilot", url=str(p.rundir.path), request_timeout=1)
        p.executors.append(quick)
        lost = psij.Job()
        quick.attach(lost, never)  # leased, never submitted: given up after request_timeout
        assert lost.status.state is psij.JobState.FAILED and "not in this pilot yet" in str(lost.status.message)
    finally:
        raw.peer.close()


def _leased_job_then_sigkill(
    p: Pilot, spec: psij.JobSpec, *, ended: bool
) -> tuple[dict[str, Any], psij.JobExecutor, Raw]:
    """A block of 8 ids leased, ``spec`` submitted under its first id (and, with ``ended``, run to its
    end), the daemon SIGKILLed and started again: the lease, and an executor and a raw client of the
    new daemon, its agent registered."""
    ex = p.executor()
    agents_active(ex, 1)
    raw = Raw(p)
    lease = raw.ask(Kind.LEASE, {"count": 8})
    first = str(lease["first"])
    assert raw.submit(spec, first).get("id") == first
    if ended:
        job = psij.Job()
        ex.attach(job, first)
        ends(job, psij.JobState.COMPLETED)
    raw.peer.close()
    p.kill9()
    p.up_again()
    ex = p.executor()
    agents_active(ex, 1)
    return lease, ex, Raw(p)


def test_leases_outlive_a_daemon_restart(start_pilot: Callable[..., Pilot], tmp_path: Path) -> None:
    """A block leased before a SIGKILL is the client's after it: its ids still make jobs (once), and the
    next daemon's own ids and leases come after it."""
    out = tmp_path / "out"
    lease, ex, raw = _leased_job_then_sigkill(start_pilot(CONFIG), marker(out, "before"), ended=False)
    try:
        again = raw.submit(marker(out, "before-again"), str(lease["first"]))
        assert again.get("id") == str(lease["first"]) and "status" in again, again
        nxt = raw.submit(marker(out, "after"), str(lease["first"] + 1))
        assert nxt.get("id") == str(lease["first"] + 1) and "status" not in nxt, nxt
        fresh = raw.ask(Kind.LEASE, {"count": 1})
        assert fresh["first"] > lease["last"], fresh
        own = psij.Job(marker(out, "own"))
        ex.submit(own)
        assert int(str(own.native_id)) > lease["last"]
        for native_id in (str(lease["first"] + 1), str(own.native_id)):
            job = psij.Job()
            ex.attach(job, native_id)
            ends(job, psij.JobState.COMPLETED)
        assert sorted(out.read_text().split()) == ["after", "before", "own"]
    finally:
        raw.peer.close()


def test_a_leased_id_whose_job_ended_before_a_restart_is_followed_not_made_again(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    """The restarted daemon leaves its ended jobs in the journal (it counts them): an id of a kept
    lease that made a job which ended before the SIGKILL is still known as used, and a submit sent
    again under it follows that job; the job's final state is counted in the status."""
    out = tmp_path / "out"
    lease, ex, raw = _leased_job_then_sigkill(start_pilot(CONFIG), marker(out, "once"), ended=True)
    first = str(lease["first"])
    try:
        again = raw.submit(marker(out, "twice"), first)
        assert again.get("id") == first and again["status"][1] == "COMPLETED", again
        assert ex.pilot_status()["jobs"].get("COMPLETED") == 1
        nxt = raw.submit(marker(out, "next"), str(lease["first"] + 1))
        assert nxt.get("id") == str(lease["first"] + 1), nxt
        job = psij.Job()
        ex.attach(job, str(lease["first"] + 1))
        ends(job, psij.JobState.COMPLETED)
        assert sorted(out.read_text().split()) == ["next", "once"]
    finally:
        raw.peer.close()


def test_ids_an_executor_never_used_are_given_back_at_close(start_pilot: Callable[..., Pilot]) -> None:
    """Each executor leases a block; at close it gives back what it never handed out, so the next
    executor's (or the pilot's own) ids follow on: a run of short scripts does not leave gaps of a
    block each. Ranges it does not hold are ignored, malformed ones refused."""
    p = start_pilot(CONFIG)
    agents_active(p.executor(), 1)
    ids = []
    for pipelined in (True, True, False, True):
        ex = psij.JobExecutor.get_instance("pilot", url=str(p.rundir.path), pipelined=pipelined)
        job = psij.Job(psij.JobSpec(executable="/bin/true"))
        ex.submit(job)
        assert ends(job, psij.JobState.COMPLETED)
        ids.append(int(str(job.native_id)))
        ex.close()
    assert ids == list(range(ids[0], ids[0] + 4)), ids
    raw = Raw(p)
    try:
        lease = raw.ask(Kind.LEASE, {"count": 10})
        assert raw.ask(Kind.LEASE, {"count": 0, "give_back": [[lease["first"] + 5, lease["last"]]]}) == {
            "given_back": True,
            "rid": raw.rid,
        }
        assert raw.ask(Kind.LEASE, {"count": 1})["first"] == lease["first"] + 5  # the tail came back
        ignored = raw.ask(Kind.LEASE, {"count": 0, "give_back": [[1, 3]]})  # not a lease's: jobs' ids
        assert ignored.get("given_back"), ignored
        assert raw.submit(psij.JobSpec(executable="/bin/true"), str(lease["first"])).get("id") == str(lease["first"])
        for bad in ([[5, 1]], [[0, 2]], [["a", 2]], [[1, 2]] * 3, "x"):
            body = raw.ask(Kind.LEASE, {"count": 0, "give_back": bad})
            assert "error" in body and "give_back" in str(body["error"]), (bad, body)
        assert "count" in str(raw.ask(Kind.LEASE, {"count": 0})["error"])
    finally:
        raw.peer.close()


def test_the_next_block_is_asked_for_once_half_of_the_current_one_is_used(
    start_pilot: Callable[..., Pilot],
) -> None:
    """An executor asks for one block up front and the next only once half of it is handed out: a single
    submit leaves exactly one request in flight (its own), never a lease besides it."""
    p = start_pilot(CONFIG)
    ex = psij.JobExecutor.get_instance("pilot", url=str(p.rundir.path), pipelined=True)
    try:
        ids = ex._backend.pipeline._ids  # type: ignore[attr-defined]
        job = psij.Job(psij.JobSpec(executable="/bin/true"))
        ex.submit(job)
        assert ends(job, psij.JobState.COMPLETED)
        first = int(str(job.native_id))
        taken = 1
        while not (ids._asking or ids._ahead is not None) and taken < 1000:
            ex.submit(psij.Job(psij.JobSpec(executable="/bin/true")))
            taken += 1
        block = ids._last - first + 1
        assert block >= 256, block
        assert taken == block // 2 + 1, (taken, block)  # asked once fewer than half of the block was left
    finally:
        ex.close()

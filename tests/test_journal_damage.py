"""A damaged or missing journal is never a silent fresh start (issue 19, point 4).

A real daemon with real agents and tasks is SIGKILLed, its journal is damaged -- truncated to 0 bytes,
missing, garbage in its WAL, a corrupt page -- and ``pilot up`` must refuse, saying what it found and
what to do; then ``pilot up --restore`` rebuilds from the daemon's last snapshot and what the agents
still hold (no job runs twice), or ``pilot up --fresh`` starts anew and stops what the earlier pilot left
running."""

from __future__ import annotations

import os
import shutil
import sqlite3
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import PYTHON, Pilot
from pilot_waits import agents_active, gone, list_when_back, read_pid, wait_for

import client as psij
from pilot.store import JOURNAL_FILE

pytestmark = pytest.mark.timeout(180)

CONFIG = """
[pilot]
heartbeat_interval = 0.5
agent_timeout = 4
backlog = 0
journal_snapshot_seconds = {snapshot}
journal_checkpoint_mib = {checkpoint}

[allocation]
lrm = "local"
nodes = 1
cores_per_node = 2
"""


def _agents(p: Pilot) -> list[psutil.Process]:
    """The pilot's agent processes: their PILOT_AGENT_DIR is in its run directory (tasks do not inherit it)."""
    base = str(p.rundir.agents_dir)
    found = [
        proc
        for proc in psutil.process_iter(["environ", "ppid"], ad_value=None)
        if (proc.info["environ"] or {}).get("PILOT_AGENT_DIR", "").startswith(base)
    ]
    pids = {proc.pid for proc in found}
    return [proc for proc in found if proc.info["ppid"] not in pids]  # not an agent's child before its exec


def _up(p: Pilot, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "pilot", "up", *flags, "--config", str(p.config), "--rundir", str(p.rundir.path)],
        env=p.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _gated(marks: Path, gate: Path, name: str) -> psij.Job:
    """Marks its start (and its pid), waits for ``gate``, marks its end: run once, its mark reads 'start, end'."""
    script = (
        f"echo $$ > {marks / name}.pid; echo start >> {marks / name}; "
        f"while [ ! -e {gate} ]; do sleep 0.05; done; echo end >> {marks / name}"
    )
    return psij.Job(psij.JobSpec(executable="/bin/sh", arguments=["-c", script], name=name))


def _marking(marks: Path, name: str, *, size: int = 0) -> psij.Job:
    args = ["-c", f"echo run >> {marks / name}", "x" * size]
    return psij.Job(psij.JobSpec(executable="/bin/sh", arguments=args, name=name))


def _ends(job: psij.Job, state: psij.JobState = psij.JobState.COMPLETED) -> psij.JobStatus:
    status = job.wait(timeout=60)
    assert status is not None and status.state is state, (job.native_id, status)
    return status


def _damage(p: Pilot, kind: str, tmp_path: Path) -> None:
    journal = p.rundir.path / JOURNAL_FILE
    wal = Path(f"{journal}-wal")
    if kind == "truncated":
        os.truncate(journal, 0)
    elif kind == "missing":
        for path in (journal, wal, Path(f"{journal}-shm")):
            path.unlink(missing_ok=True)
    elif kind == "wal-garbage":
        data = bytearray(wal.read_bytes())
        frame = 24 + struct.unpack(">I", data[8:12])[0]
        frames = (len(data) - 32) // frame
        assert frames >= 4, f"only {frames} frames in the WAL"
        at = 32 + (frames // 2) * frame + 24 + 100  # inside the page of a frame in the middle
        data[at : at + 64] = os.urandom(64)
        wal.write_bytes(bytes(data))
    elif kind == "corrupt-page":
        page = _page_only_in_the_file(journal, tmp_path)
        with open(journal, "r+b") as f:
            f.seek((page - 1) * 4096)
            f.write(os.urandom(4096))
    else:
        raise ValueError(kind)


def _page_only_in_the_file(journal: Path, tmp_path: Path) -> int:
    """A b-tree page of the journal in use whose only copy is in journal.db (none in the WAL, which SQLite
    would read instead)."""
    wal = Path(f"{journal}-wal")
    data = wal.read_bytes() if wal.exists() else b""
    in_wal: set[int] = set()
    if len(data) >= 32:
        frame = 24 + struct.unpack(">I", data[8:12])[0]
        for i in range((len(data) - 32) // frame):
            in_wal.add(struct.unpack(">I", data[32 + i * frame : 36 + i * frame])[0])
    copy = tmp_path / "copy.db"
    shutil.copyfile(journal, copy)
    if data:
        shutil.copyfile(wal, f"{copy}-wal")
    db = sqlite3.connect(copy)
    used = {row[0] for row in db.execute("SELECT pageno FROM dbstat WHERE name != 'sqlite_schema'")}
    db.close()
    candidates = sorted(used - in_wal - {1})
    assert candidates, ("no page of the journal is only in its file", used, in_wal)
    return candidates[-1]


def _refused(p: Pilot, *problem: str) -> str:
    proc = _up(p)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    text = proc.stderr
    for words in ("pilot.json", "agent process(es) still running", "--restore", "--fresh", *problem):
        assert words in text, (words, text)
    assert p.rundir.read_info() is None, "nothing started"
    return text


def _new_snapshot(ex: psij.JobExecutor, since: float | None) -> float:
    def taken() -> float | None:
        t = ex.pilot_status()["pilot"]["journal"]["snapshot"]
        return t if t is not None and t != since else None

    snapshot: float = wait_for(taken, 30, "a new journal snapshot")
    return snapshot


@pytest.mark.parametrize(("kind", "problem"), [("truncated", "is empty (0 bytes)"), ("wal-garbage", "does not verify")])
def test_damaged_journal_is_refused_and_restored_from_its_snapshot(
    start_pilot: Callable[..., Pilot], tmp_path: Path, kind: str, problem: str
) -> None:
    p = start_pilot(CONFIG.format(snapshot=10, checkpoint=4))
    marks = tmp_path / "marks"
    marks.mkdir()
    ex = p.executor()
    agents_active(ex, 1)
    agents = _agents(p)
    done = _marking(marks, "done")
    ex.submit(done)
    _ends(done)
    gates = {name: tmp_path / f"gate-{name}" for name in ("running", "ends", "queued")}
    running = _gated(marks, gates["running"], "running")  # runs across the snapshot and the kill
    ends = _gated(marks, gates["ends"], "ends")  # running at the snapshot, ends before the kill
    queued = _gated(marks, gates["queued"], "queued")  # queued at the snapshot, starts before the kill
    for job in (running, ends, queued):
        ex.submit(job)
    for job in (running, ends):
        job.wait(timeout=30, target_states=[psij.JobState.ACTIVE])
    snapshot = _new_snapshot(ex, ex.pilot_status()["pilot"]["journal"]["snapshot"])
    gates["ends"].touch()
    _ends(ends)
    queued.wait(timeout=30, target_states=[psij.JobState.ACTIVE])
    after = _marking(marks, "after")  # accepted after the snapshot, never started: the snapshot cannot know it
    ex.submit(after)
    time.sleep(1.5)  # a few heartbeats: the agent is told its events are journaled, and forgets them
    assert ex.pilot_status()["pilot"]["journal"]["snapshot"] == snapshot, "no snapshot since (test timing)"
    ids = {name: str(job.native_id) for name, job in (("done", done), ("running", running), ("ends", ends))}
    ids["queued"] = str(queued.native_id)
    queued_pid = read_pid(marks / "queued.pid")
    ex.close()
    p.kill9()
    _damage(p, kind, tmp_path)

    _refused(p, problem)
    assert all(a.is_running() for a in agents) and queued_pid.is_running(), "a refusal stops nothing"
    proc = _up(p, "--restore")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    kept = list((p.rundir.path / "earlier").iterdir())
    assert len(kept) == 1 and (kept[0] / f"{JOURNAL_FILE}-wal").exists(), kept

    ex2 = p.executor()
    listed = set(list_when_back(ex2))
    assert set(ids.values()) <= listed and str(after.native_id) not in listed, (ids, listed)
    assert sorted(a.pid for a in _agents(p)) == sorted(a.pid for a in agents), "the same agents, re-adopted"
    follow = {}
    for name, native_id in ids.items():
        follow[name] = psij.Job()
        ex2.attach(follow[name], native_id)
    _ends(follow["done"])
    gates["running"].touch()
    _ends(follow["running"])
    assert (marks / "running").read_text() == "start\nend\n"
    # It ended after the snapshot: known from the agent if it still held the event, else its outcome is
    # unknown -- never run again.
    status = follow["ends"].wait(timeout=60)
    assert status is not None and (
        status.state is psij.JobState.COMPLETED
        or (status.state is psij.JobState.FAILED and "outcome is unknown" in (status.message or ""))
    ), status
    assert (marks / "ends").read_text() == "start\nend\n"
    # Queued in the snapshot but started since: it ends FAILED and its process is killed, never run twice.
    status = _ends(follow["queued"], psij.JobState.FAILED)
    assert "after the journal snapshot" in (status.message or ""), status
    wait_for(lambda: gone(queued_pid), 20, "the process of the job started after the snapshot to be killed")
    gates["queued"].touch()
    assert (marks / "queued").read_text() == "start\n"
    # New jobs get ids the lost journal never gave.
    new = _marking(marks, "new")
    ex2.submit(new)
    _ends(new)
    assert int(str(new.native_id)) >= 1_000_000, new.native_id
    assert not (marks / "after").exists()
    assert "restored from the journal snapshot" in p.cli("status").stdout


@pytest.mark.parametrize(("kind", "problem"), [("missing", "is missing"), ("corrupt-page", "integrity check")])
def test_damaged_journal_is_refused_and_fresh_stops_the_earlier_life(
    start_pilot: Callable[..., Pilot], tmp_path: Path, kind: str, problem: str
) -> None:
    p = start_pilot(CONFIG.format(snapshot=1, checkpoint=0.0625))
    marks = tmp_path / "marks"
    marks.mkdir()
    ex = p.executor()
    agents_active(ex, 1)
    agents = _agents(p)
    gate = tmp_path / "gate"
    running = _gated(marks, gate, "running")
    ex.submit(running)
    running.wait(timeout=30, target_states=[psij.JobState.ACTIVE])
    task = read_pid(marks / "running.pid")
    jobs = [_marking(marks, f"job-{i}", size=2000) for i in range(80)]  # the journal outgrows its WAL
    ex.submit_all(jobs)
    for job in jobs:
        _ends(job)
    _new_snapshot(ex, None)
    ex.close()
    p.kill9()
    _damage(p, kind, tmp_path)

    _refused(p, problem)
    assert all(a.is_running() for a in agents) and task.is_running(), "a refusal stops nothing"
    proc = _up(p, "--fresh")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    for proc_ in (*agents, task):
        wait_for(lambda proc_=proc_: gone(proc_), 20, f"process {proc_.pid} of the earlier pilot to be stopped")
    kept = list((p.rundir.path / "earlier").iterdir())
    assert len(kept) == 1, kept
    names = {f.name for f in kept[0].iterdir()}
    assert "journal.snapshot.db" in names and (kind == "missing" or JOURNAL_FILE in names), names

    ex2 = p.executor()
    agents_active(ex2, 1)
    assert list_when_back(ex2) == [], "a fresh start knows no job of the earlier one"
    new = _marking(marks, "new")
    ex2.submit(new)
    _ends(new)
    assert new.native_id == "1"
    gate.touch()
    assert (marks / "running").read_text() == "start\n"


def test_restore_refuses_a_whole_journal_and_a_clean_stop_starts_afresh(start_pilot: Callable[..., Pilot]) -> None:
    p = start_pilot(CONFIG.format(snapshot=1, checkpoint=4))
    ex = p.executor()
    agents_active(ex, 1)
    job = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(job)
    _ends(job)
    _new_snapshot(ex, None)
    ex.close()
    p.kill9()
    proc = _up(p, "--restore")
    assert proc.returncode == 1 and "is whole" in proc.stderr, proc.stderr
    p.up_again()  # resumes from it
    ex2 = p.executor()
    assert list_when_back(ex2) == [str(job.native_id)]
    ex2.close()
    p.cli("down")
    left = sorted(f.name for f in p.rundir.path.iterdir())
    assert not [n for n in left if n.startswith("journal")], left
    again = _up(p)  # a clean stop left nothing to refuse over
    assert again.returncode == 0, again.stderr
    ex3 = p.executor()
    assert list_when_back(ex3) == []

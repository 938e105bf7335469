"""How ``pilot up`` opens the journal: never a silent fresh start over an earlier life.

A clean stop ('pilot down') leaves nothing of a pilot in its run directory but logs: no ``pilot.json``,
no journal, no snapshot. So when ``pilot up`` finds ``pilot.json`` (its daemon was killed), a journal
snapshot, a WAL, or agents of this run directory still running, there was an earlier life whose jobs the
journal must account for. If the journal is then missing, empty or damaged (:mod:`pilot.journal_check`,
SQLite's ``quick_check``, a record that does not load), starting afresh would forget every job while the
old agents and tasks ran on: :func:`open_journal` refuses and says what it found and what to do. A
damaged journal is refused also without such traces. Two explicit ways on:

- ``--fresh``: the agents of the earlier life (found by their ``PILOT_AGENT_DIR`` in this run directory)
  and their tasks (by ``PILOT_ALLOCATION``) are killed, batch allocations the old journal or its snapshot
  name are given back (by the daemon, through their LRM), the old files are kept in ``earlier/<time>/``,
  and a new journal begins.
- ``--restore``: the last snapshot becomes the journal (the damaged one is kept in ``earlier/<time>/``),
  and the daemon resumes from it: the agents register again with their running processes and the
  events they were not told are journaled (:meth:`pilot.core.agents.Agents._readopt`). What the snapshot
  cannot know is settled by :class:`Restoration` so that nothing runs twice: a process the snapshot has
  outstanding that the agent neither runs nor reports ran and was acknowledged after it -- its job ends
  FAILED, never sent again; a job the snapshot has queued whose process an agent runs or reports started
  after it -- it ends FAILED and the process is killed. Job ids go on from the next million, so no id
  the lost journal gave out is given again. The restore's record stays in the journal (meta
  ``restored``): a daemon resumed later settles each agent's first REGISTER by it again, which changes
  nothing that was settled (those processes have their results in the journal by then).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import psutil
import structlog

from pilot.allocations import Site
from pilot.core.phase import Phase
from pilot.core.reactor import Core
from pilot.journal_check import wal_damage
from pilot.journal_guard import RESERVE_FILE, SNAPSHOT_FILE
from pilot.lrm.base import Allocation
from pilot.model.job_state import JobState
from pilot.rundir import RunDir
from pilot.store import JOURNAL_FILE, JournalDamaged, JournalError, Store
from pilot.store_load import Recovered
from pilot.wire.messages import Register, TaskEvent

log = structlog.get_logger("pilot.journal")

Start = Literal["resume", "fresh", "restore"]
EARLIER_DIR: Final = "earlier"
#: Job ids after a restore start at the next multiple of this.
RESTORED_IDS: Final = 1_000_000


@dataclass(slots=True)
class EarlierLife:
    """What a run directory shows of a daemon that did not stop cleanly."""

    info: dict[str, Any] | None = None  # pilot.json as that daemon left it
    agents: list[psutil.Process] = field(default_factory=list)  # its agents still running
    allocation_ids: set[str] = field(default_factory=set)  # their PILOT_ALLOCATION
    snapshot: float | None = None  # when its journal snapshot was written
    wal: bool = False

    @property
    def found(self) -> bool:
        return self.info is not None or bool(self.agents) or self.snapshot is not None or self.wal

    def traces(self) -> str:
        out = []
        if self.info is not None:
            started = _when(self.info["started"]) if isinstance(self.info.get("started"), int | float) else "?"
            out.append(f"pilot.json of daemon pid {self.info.get('pid', '?')} started {started}, no longer running")
        if self.agents:
            pids = ", ".join(str(p.pid) for p in self.agents[:8]) + (", ..." if len(self.agents) > 8 else "")
            out.append(f"{len(self.agents)} of its agent process(es) still running (pid {pids})")
        if self.snapshot is not None:
            out.append(f"a journal snapshot ({SNAPSHOT_FILE}) of {_when(self.snapshot)}")
        if self.wal:
            out.append(f"a journal WAL ({JOURNAL_FILE}-wal)")
        return "; ".join(out)


def examine(rundir: RunDir) -> EarlierLife:
    """The traces of an earlier life in ``rundir`` (blocking: lists this user's processes)."""
    life = EarlierLife(info=rundir.last_info(), wal=Path(f"{rundir.path / JOURNAL_FILE}-wal").exists())
    try:
        life.snapshot = os.stat(rundir.path / SNAPSHOT_FILE).st_mtime
    except OSError:
        pass
    base = str(rundir.agents_dir)
    me = os.getuid()
    for proc in psutil.process_iter(["uids", "environ"], ad_value=None):
        uids, env = proc.info["uids"], proc.info["environ"]
        if uids is None or uids.real != me or not env or proc.pid == os.getpid():
            continue
        workdir = env.get("PILOT_AGENT_DIR", "")
        if workdir == base or workdir.startswith(base + os.sep):
            life.agents.append(proc)
            if env.get("PILOT_ALLOCATION"):
                life.allocation_ids.add(env["PILOT_ALLOCATION"])
    return life


@dataclass(slots=True)
class Opened:
    store: Store
    recovered: Recovered
    #: --fresh: the earlier life's allocations in batch systems, for the daemon to give back (site, allocation).
    release: list[tuple[str, Allocation]] = field(default_factory=list)
    #: --restore: the record :class:`Restoration` starts from (journaled as meta ``restored``).
    restored: dict[str, Any] | None = None
    #: What was done to get here (logged).
    note: str = ""


def open_journal(rundir: RunDir, *, start: Start, checkpoint_bytes: int) -> Opened:
    """The journal of ``rundir``, opened and loaded as ``start`` says (see the module's docstring);
    :class:`JournalError` when it must not be used, with what was found and what to do. Blocking."""
    path = rundir.path / JOURNAL_FILE
    size = os.stat(path).st_size if path.exists() else None
    problem: str | None = None
    store: Store | None = None
    recovered = Recovered()
    if not size:
        damage = wal_damage(path)
        problem = f"is damaged: {damage}" if damage else ("is missing" if size is None else "is empty (0 bytes)")
    else:
        try:
            store, recovered = _open(path, checkpoint_bytes=checkpoint_bytes)
        except JournalDamaged as exc:
            problem = f"is damaged: {exc.damage}"
    if start == "restore":
        if store is not None:
            store.close()
            raise JournalError(
                f"the pilot journal {path} is whole: 'pilot up' resumes from it with nothing lost; --restore "
                "would go back to its last snapshot"
            )
        return _restore(rundir, problem or "", checkpoint_bytes=checkpoint_bytes)
    if start == "fresh":
        return _fresh(rundir, store, recovered, checkpoint_bytes=checkpoint_bytes)
    if store is not None:
        return Opened(store, recovered)
    problem = problem or ""
    life = examine(rundir)
    if not problem.startswith("is damaged") and not life.found:
        return Opened(*_open(path, checkpoint_bytes=checkpoint_bytes))  # a first start, or one after a clean stop
    raise JournalError(_refusal(rundir, path, problem, life))


def _open(path: Path, *, checkpoint_bytes: int) -> tuple[Store, Recovered]:
    store = Store.open(path, auto_checkpoint=False, checkpoint_bytes=checkpoint_bytes)
    try:
        store.check()
        return store, store.load(ended=False)  # the ended jobs stay in the journal: counted
    except BaseException:
        store.close()
        raise


def _refusal(rundir: RunDir, path: Path, problem: str, life: EarlierLife) -> str:
    if life.found:
        head = (
            f"the run directory {rundir.path} shows an earlier pilot that did not stop cleanly ({life.traces()}), "
            f"but its journal {path} {problem}. Starting afresh would forget every job of that run"
            + (" and leave its agents and tasks running" if life.agents else "")
        )
    else:
        head = f"the pilot journal {path} {problem}"
    restore = (
        f"'pilot up --restore' rebuilds the jobs from the journal snapshot of {_when(life.snapshot)} and from what "
        "the agents still hold (a job whose fate after the snapshot is unknown ends FAILED rather than run twice)"
        if life.snapshot is not None
        else f"'pilot up --restore' is not possible: there is no journal snapshot ({SNAPSHOT_FILE})"
    )
    fresh = (
        "'pilot up --fresh' starts anew: it stops the agents and tasks left running and keeps the old journal "
        f"files in {rundir.path / EARLIER_DIR}/"
    )
    return f"{head}. {restore}; {fresh}."


def _set_aside(rundir: RunDir, names: tuple[str, ...]) -> Path | None:
    """Move these files of the run directory into ``earlier/<UTC time>/``; that directory (None: none there)."""
    present = [rundir.path / n for n in names if (rundir.path / n).exists()]
    if not present:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kept = rundir.path / EARLIER_DIR / stamp
    n = 1
    while kept.exists():
        n += 1
        kept = rundir.path / EARLIER_DIR / f"{stamp}-{n}"
    kept.mkdir(parents=True, mode=0o700)
    for p in present:
        os.replace(p, kept / p.name)
    return kept


_JOURNAL_FILES: Final = (JOURNAL_FILE, f"{JOURNAL_FILE}-wal", f"{JOURNAL_FILE}-shm")


def _restore(rundir: RunDir, problem: str, *, checkpoint_bytes: int) -> Opened:
    snapshot = rundir.path / SNAPSHOT_FILE
    try:
        taken = os.stat(snapshot).st_mtime
    except FileNotFoundError:
        raise JournalError(
            f"nothing to restore the pilot journal from: {rundir.path} has no journal snapshot ({SNAPSHOT_FILE}); "
            "'pilot up --fresh' starts anew"
        ) from None
    try:
        _open(snapshot, checkpoint_bytes=checkpoint_bytes)[0].close()  # whole, before anything is moved
    except JournalError as exc:
        raise JournalError(f"the journal snapshot {snapshot} cannot be used either: {exc}") from None
    kept = _set_aside(rundir, _JOURNAL_FILES)
    path = rundir.path / JOURNAL_FILE
    shutil.copyfile(snapshot, path)
    os.chmod(path, 0o600)
    store, recovered = _open(path, checkpoint_bytes=checkpoint_bytes)
    record = Restoration.record_for(recovered, snapshot=taken)
    recovered.next_seq = int(record["next_seq"])
    recovered.meta[Restoration.META] = record
    where = f"; the journal that {problem} is kept in {kept}" if kept is not None else ""
    return Opened(store, recovered, restored=record, note=f"restored from the snapshot of {_when(taken)}{where}")


def _fresh(rundir: RunDir, store: Store | None, recovered: Recovered, *, checkpoint_bytes: int) -> Opened:
    """Stop what the earlier life left running, keep its files aside, and open a new journal."""
    allocations = recovered.allocations
    if store is not None:
        store.close()
    elif (rundir.path / SNAPSHOT_FILE).exists():
        try:
            old, loaded = _open(rundir.path / SNAPSHOT_FILE, checkpoint_bytes=checkpoint_bytes)
            old.close()
            allocations = loaded.allocations
        except (JournalError, OSError):
            allocations = []
    life = examine(rundir)
    ids = life.allocation_ids | {a.native_id for _, _, a in allocations if a.lrm == "local"}
    killed = _kill(life.agents, ids)
    release = [(site, a) for _, site, a in allocations if a.lrm != "local" and not a.state.final]
    kept = _set_aside(rundir, (*_JOURNAL_FILES, SNAPSHOT_FILE))
    (rundir.path / RESERVE_FILE).unlink(missing_ok=True)
    store, fresh = _open(rundir.path / JOURNAL_FILE, checkpoint_bytes=checkpoint_bytes)
    note = f"started afresh: {killed} process(es) of the earlier life killed"
    if kept is not None:
        note += f"; its journal files are kept in {kept}"
    return Opened(store, fresh, release=release, note=note)


async def give_back(release: list[tuple[str, Allocation]], *, sites: list[Site]) -> None:
    """--fresh: the earlier life's allocations in batch systems, cancelled through their site's LRM."""
    by_name = {s.name: s for s in sites}
    for site_name, allocation in release:
        source = by_name.get(site_name)
        try:
            if source is None or source.lrm.kind != allocation.lrm:
                raise ValueError(f"this configuration has no {allocation.lrm} site {site_name!r}")
            await source.lrm.cancel(allocation)
            log.warning("allocation of the earlier life given back", native_id=allocation.native_id, site=site_name)
        except Exception as exc:  # say so and go on: the fresh start must not fail for it
            log.error(
                "cannot give back an allocation of the earlier life", native_id=allocation.native_id, error=str(exc)
            )


def _kill(agents: list[psutil.Process], allocation_ids: set[str]) -> int:
    """SIGKILL the agents (their process groups) and every task of these allocations (this user's
    processes whose PILOT_ALLOCATION is one of them: tasks run in sessions of their own)."""
    killed = 0
    for proc in agents:
        killed += _kill_one(proc)
    if allocation_ids:
        me = os.getuid()
        for proc in psutil.process_iter(["uids", "environ"], ad_value=None):
            uids, env = proc.info["uids"], proc.info["environ"]
            if uids is not None and uids.real == me and env and env.get("PILOT_ALLOCATION") in allocation_ids:
                killed += _kill_one(proc)
    return killed


def _kill_one(proc: psutil.Process) -> int:
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, psutil.Error):
        return 0
    return 1


def _when(t: float | None) -> str:
    return "?" if t is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


class Restoration:
    """What a journal restored from a snapshot cannot know, settled as each agent registers again (see
    the module's docstring)."""

    META: Final = "restored"

    def __init__(self, record: dict[str, Any]) -> None:
        self.snapshot = float(record.get("snapshot", 0.0))
        self.next_seq = int(record.get("next_seq", 1))
        self.uncertain: dict[str, set[tuple[str, int]]] = {}
        self._settled: set[str] = set()  # nodes whose agent registered since this daemon started
        for node, job_id, slot in record.get("uncertain", []):
            self.uncertain.setdefault(str(node), set()).add((str(job_id), int(slot)))

    @classmethod
    def record_for(cls, recovered: Recovered, *, snapshot: float) -> dict[str, Any]:
        """The record of a restore from a snapshot of time ``snapshot`` that loaded as ``recovered``."""
        uncertain = [
            [plan.node, plan.order.job_id, slot]
            for job in recovered.jobs
            if not job.final
            for slot, plan in job.run.processes.items()
        ]
        next_seq = (recovered.next_seq // RESTORED_IDS + 1) * RESTORED_IDS
        return {"snapshot": snapshot, "next_seq": next_seq, "uncertain": uncertain}

    def amend(self, core: Core, name: str, msg: Register) -> Register:
        """The REGISTER of ``name``'s agent, the first since the restore, with a 'failed' event added for
        each process the snapshot has outstanding there that the agent neither runs nor reports; jobs the
        snapshot has queued that the agent runs or reports end FAILED (the core then kills what runs)."""
        if name in self._settled:
            return msg
        self._settled.add(name)
        keys = self.uncertain.pop(name, set())
        when = _when(self.snapshot)
        seen = set(msg.running) | {(ev.job_id, ev.slot) for ev in msg.events}
        for job_id, _ in sorted(seen - keys):
            job = core.book.jobs.get(job_id.partition("~")[0])
            if job is not None and job.phase in (Phase.QUEUED, Phase.BLOCKED):
                core.book.end(
                    job,
                    JobState.FAILED,
                    message=f"it started on {name} after the journal snapshot of {when} the pilot was restored "
                    "from, which cannot follow it: its process is killed (not run twice)",
                )
        message = (
            f"its outcome is unknown: it ran on {name} after the journal snapshot of {when} the pilot was restored "
            "from, and its agent no longer holds it (not run twice)"
        )
        lost = tuple(
            TaskEvent(job_id, slot, "failed", core.clock.wall, {"message": message})
            for job_id, slot in sorted(keys - seen)
        )
        log.info(
            "restored journal: agent back",
            node=name,
            outcome_unknown=len(lost),
            running=len(set(msg.running) & keys),
            replayed_events=len(msg.events),
        )
        return dataclasses.replace(msg, events=msg.events + lost) if lost else msg

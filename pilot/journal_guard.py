"""The journal's guard: a journal that cannot be written does not stop the pilot, and a snapshot of it
is kept for the day it is damaged.

When a commit fails (a full file system, a quota, an I/O error), the daemon goes on:

- The first time, it frees its *reserve* -- a file of ``pilot.journal_checkpoint_mib`` MiB (at most 64)
  kept next to the journal for this moment, as much as the WAL grows between two checkpoints -- and
  writes again. The commit then usually goes through, so what was accepted in that burst is journaled
  before anyone is told. From then on new jobs are refused with a transient error that names the cause
  and the path, while the jobs accepted go on: placed, run, followed and journaled into the room the
  reserve left.
- When a write fails even so, the changes stay in memory: the core goes on adding to the same journal
  batch, and nothing that batch holds leaves the daemon -- process orders, withdrawals, job statuses and
  every reply that says something was done (a job accepted, a cancel taken) are held with it, and a kill
  of a process whose order is held waits to go right after that order; the agents' events are not
  acknowledged (each agent keeps them, and a daemon killed now gets them again with their REGISTER),
  no new job is placed. What changes nothing is answered at once: the pilot's status and views, an
  attach, a refusal (the daemon sends those apart). Nothing new is accepted or placed, so what is held
  is bounded by the work the pilot holds (a few rows per job and process, at most ``pilot.max_queued``
  jobs). The write is tried again every second.
- Once the batch is written, what was held goes out; once the file system has room for the reserve
  again, the reserve is made again and new jobs are taken.

'pilot status' shows the condition throughout (log lines may not reach a full disk). Log calls never
fail on a full disk either (:mod:`pilot.logs`).

The snapshot (``journal.snapshot.db``, SQLite's online backup of the journal) is taken every
``pilot.journal_snapshot_seconds`` when something was committed since the last one; ``pilot up
--restore`` rebuilds from it (:mod:`pilot.earlier_life`). Like a checkpoint it runs in a worker thread
while the daemon leaves the store alone (it reads its agents and holds its replies meanwhile).
"""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Final

import anyio
import structlog

from pilot.core.outbox import Outbox
from pilot.store import JournalError, Store
from pilot.store_batch import Batch
from pilot.wire.messages import Body, HeartbeatReply, Registered

log = structlog.get_logger("pilot.journal")

RESERVE_FILE: Final = "journal.reserve"
#: The reserve is as large as the WAL may grow between two checkpoints, up to this.
RESERVE_MAX: Final = 64 << 20
SNAPSHOT_FILE: Final = "journal.snapshot.db"
#: Seconds between two tries of a write that failed, and between two tries to make the reserve again.
RETRY: Final = 1.0


class JournalGuard:
    """Owns the journal's writes for the daemon's I/O task (see the module's docstring)."""

    def __init__(self, store: Store, *, reserve_bytes: int, snapshot_seconds: float) -> None:
        self.store = store
        self.reserve = store.path.with_name(RESERVE_FILE)
        self.snapshot_path = store.path.with_name(SNAPSHOT_FILE)
        self._reserve_bytes = reserve_bytes
        self._reserved = False
        #: Why the journal cannot take new work (the error that began it), or None.
        self.trouble: str | None = None
        self.since: float | None = None  # wall clock, when it began
        #: The last write failed: the core's journal batch holds changes not written yet.
        self.held = False
        self._held_rows = 0
        self._retry_at = 0.0
        self._probe_at = 0.0
        self._out: Outbox | None = None  # what may not leave before the held changes are written
        #: The pilot is stopping: its journal is discarded at the end, so nothing waits for it any more.
        self.stopping = False
        self._snapshot_seconds = snapshot_seconds
        self._snapshot_at = 0.0
        self._snapshot_commits = -1
        #: When the last snapshot was written (wall clock), by this daemon or an earlier one.
        self.snapshot_time: float | None = _mtime(self.snapshot_path)

    # -- writing ----------------------------------------------------------------------------------------

    @property
    def refusal(self) -> str | None:
        """What a client that submits is told while new jobs are refused."""
        if self.trouble is None:
            return None
        return (
            f"the pilot takes no new jobs for now: {self.trouble}; the jobs it accepted go on "
            "('pilot status' says when it takes new ones again)"
        )

    def write(self, tx: Batch, *, mono: float, wall: float) -> bool:
        """Commit ``tx``; False when it could not be written: the caller keeps adding to it and offers it
        again (at most every :data:`RETRY` seconds it is actually tried), sending nothing it holds."""
        if self.held and mono < self._retry_at:
            self._held_rows = tx.rows
            return False
        try:
            try:
                self.store.commit(tx)
            except JournalError as exc:
                if not self._reserved:
                    raise
                self._begin(str(exc), wall)
                self._free_reserve()
                log.error("journal cannot be written: its reserve is freed and new jobs are refused", error=str(exc))
                self.store.commit(tx)
        except JournalError as exc:
            self._begin(str(exc), wall)
            self._retry_at = mono + RETRY
            self._held_rows = tx.rows
            if not self.held:
                self.held = True
                log.error(
                    "journal cannot be written: changes held in memory, orders and statuses held with them",
                    error=str(exc),
                    changes=self._held_rows,
                )
            return False
        if self.held:
            self.held = False
            log.warning("journal written again: the changes held in memory are in it", changes=tx.rows)
        return True

    def _begin(self, error: str, wall: float) -> None:
        if self.trouble is None:
            self.trouble, self.since = error, wall

    def _free_reserve(self) -> None:
        self._reserved = False
        try:
            os.unlink(self.reserve)
        except OSError:
            pass

    def make_reserve(self) -> bool:
        """Allocate the reserve file (blocking: run it in a worker thread); False when there is no room."""
        try:
            fd = os.open(self.reserve, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self._reserve_bytes)
            finally:
                os.close(fd)
        except OSError as exc:
            try:
                os.unlink(self.reserve)
            except OSError:
                pass
            if self.trouble is None:
                self.trouble = f"no room on the journal's file system for its reserve {self.reserve} ({exc.strerror})"
                self.since = time.time()
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    self.trouble += ": check the file system, its space and permissions"
            return False
        self._reserved = True
        return True

    async def recover(self, *, mono: float) -> None:
        """While new jobs are refused and nothing is held in memory: try to make the reserve again (in a
        worker thread); once it is made, new jobs are taken again."""
        if self.trouble is None or self.held or mono < self._probe_at:
            return
        self._probe_at = mono + RETRY
        if await anyio.to_thread.run_sync(self.make_reserve):
            log.warning(
                "journal has room again: its reserve is back and new jobs are taken",
                was=self.trouble,
                seconds=round(time.time() - (self.since or time.time()), 1),
            )
            self.trouble = self.since = None

    def outgoing(self, out: Outbox, *, written: bool) -> Outbox:
        """What of a flush's ``out`` may leave now. While the journal holds changes it could not write,
        what says they were made waits with them: orders, withdrawals, statuses (the newest per job) and
        the replies (the daemon sends its answers that change nothing apart). Kills, the batch systems'
        calls and the agents' messages go, the latter acknowledging nothing -- but a kill of a process
        whose order is held waits too, to go right after it. Once written, all that waited goes first."""
        held = self._out
        if written or self.stopping:
            if held is None:
                return out
            self._out = None
            _join(held, out)
            held.to_agents, held.effects = out.to_agents, out.effects
            return held
        to_agents = [(node, _acknowledging_nothing(msg)) for node, msg in out.to_agents]
        if held is None:
            held = self._out = Outbox()
        kills = _kills_of_held(held, out)
        _join(held, out)
        return Outbox(kills=kills, to_agents=to_agents, effects=out.effects)

    # -- snapshots -----------------------------------------------------------------------------------------

    def snapshot_due(self, *, mono: float) -> bool:
        """A snapshot is to be taken now (then it is not due again until :meth:`snapshot` has run)."""
        due = (
            self.trouble is None
            and mono >= self._snapshot_at
            and self.store.commits != self._snapshot_commits
            and self._snapshot_seconds > 0
        )
        if due:
            self._snapshot_at = math.inf
        return due

    def snapshot(self) -> None:
        """Write the snapshot (blocking: a worker thread, while nothing else uses the store)."""
        commits = self.store.commits
        t0 = time.monotonic()
        try:
            self.store.snapshot(self.snapshot_path)
        except JournalError as exc:
            log.warning("journal snapshot not written", error=str(exc))
        else:
            self._snapshot_commits = commits
            self.snapshot_time = time.time()
            log.debug("journal snapshot written", seconds=round(time.monotonic() - t0, 4))
        self._snapshot_at = time.monotonic() + self._snapshot_seconds

    # -- status and the end --------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "writable": self.trouble is None,
            "error": self.trouble,
            "since": self.since,
            "held": self._held_rows if self.held else 0,
            "snapshot": self.snapshot_time,
        }

    def discard(self) -> None:
        """A clean stop: the reserve and the snapshot go with the journal."""
        for path in (self.reserve, self.snapshot_path, self.snapshot_path.with_name(SNAPSHOT_FILE + ".tmp")):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _join(held: Outbox, out: Outbox) -> None:
    """Add ``out``'s orders, withdrawals, statuses, replies and kills to those ``held``, after them."""
    for node, orders in out.orders.items():
        held.orders[node].extend(orders)
    for node, keys in out.withdraws.items():
        held.withdraws[node].extend(keys)
    for ident, statuses in out.statuses.items():
        held.statuses[ident].update(statuses)
    held.replies.extend(out.replies)
    for node, by_reason in out.kills.items():
        for reason, refs in by_reason.items():
            held.kills[node][reason].extend(refs)


def _kills_of_held(held: Outbox, out: Outbox) -> defaultdict[str, defaultdict[str, list[list[Any]]]]:
    """Takes out of ``out.kills`` those of processes whose orders are held (in ``held`` or in ``out``): an
    agent that got such a kill before the order would start the process after it. Returns the others."""
    if not out.kills:
        return out.kills
    go: defaultdict[str, defaultdict[str, list[list[Any]]]] = defaultdict(lambda: defaultdict(list))
    wait: defaultdict[str, defaultdict[str, list[list[Any]]]] = defaultdict(lambda: defaultdict(list))
    for node, by_reason in out.kills.items():
        orders = {(o["job_id"], o["slot"]) for o in (*held.orders.get(node, ()), *out.orders.get(node, ()))}
        for reason, refs in by_reason.items():
            for ref in refs:
                (wait if (ref[0], ref[1]) in orders else go)[node][reason].append(ref)
    out.kills = wait
    return go


def _acknowledging_nothing(msg: Body) -> Body:
    if isinstance(msg, HeartbeatReply | Registered) and msg.acked:
        return dataclasses.replace(msg, acked=0)
    return msg


def _mtime(path: Path) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None

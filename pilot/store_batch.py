"""The changes of one flush, as the journal writes them: gathered without SQL while the core works, then
written by :meth:`pilot.store.Store.commit` in one transaction, one ``executemany`` per kind of change."""

from __future__ import annotations

import itertools
import operator
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgpack

from pilot.jobs import JobRecord, ProcessResult
from pilot.launchers.base import PlannedProcess
from pilot.lrm.base import Allocation
from pilot.model.job_description import JobDescription
from pilot.model.job_state import JobState
from pilot.model.node import NodeConfigured
from pilot.scheduler.placement import RankPlacement

_packer = msgpack.Packer(use_bin_type=True)


def pack(obj: Any) -> bytes:
    return _packer.pack(obj)  # type: ignore[no-any-return]


def blob(obj: Any) -> bytearray:
    """``obj`` packed for a BLOB column of a batch's rows. A bytearray, not bytes: the sqlite3 module
    binds int, float, str and bytearray values as they are, and looks any other (bytes and None
    included) up in its adapter registry first, which costs ~250 ns per value (3.5x binding it)."""
    return bytearray(_packer.pack(obj))


def unpack(blob: bytes) -> Any:
    return msgpack.unpackb(blob, raw=False, strict_map_key=False, use_list=True)


def _orders(processes: Mapping[int, PlannedProcess]) -> bytearray:
    """A job's outstanding processes for its row: [slot, node, order (msgpack, as sent), holds] each."""
    entries = [[slot, p.node, p.packed or pack(p.order.to_wire()), p.holds] for slot, p in processes.items()]
    return bytearray(pack_orders(entries))


def pack_orders(orders: list[list[Any]]) -> bytes:
    """[slot, node, order bytes, holds] entries as the jobs table's ``orders`` column holds them."""
    return pack(orders)


def _pack_ranks(ranks: Sequence[RankPlacement]) -> bytearray:
    return blob([[r.node, r.cores, r.gpus, r.memory, r.behind] for r in ranks])


#: A new job's row in ``Batch._accepted`` (the INSERT's columns): id, seq, description, submitted, then
#: from here the fields ``job_update`` rewrites (state ... placements), then the placement (ranks), its
#: outstanding orders, then the client's submit id (always a row's last three).
_CHANGING: Final = 4
#: Of those fields, the ones a job has none of until it runs or ends (exit code, message, Delivered,
#: started, ended, cancel reason), and the others. A row whose ``_UNSET`` fields are all None is kept
#: without them (:data:`_INSERT_NEW`, :data:`_UPDATE_PLAIN`): each None a statement binds costs as much
#: as a bytes value (see :func:`blob`); the SQL writes NULL itself.
_UNSET: Final = operator.itemgetter(2, 3, 4, 6, 7, 8)
_SET: Final = operator.itemgetter(0, 1, 5, 9, 10, 11)
_NONE: Final = (None,) * 6
_COLUMNS: Final = (
    "state, state_time, exit_code, message, metadata, phase, started, ended, cancel_reason, closing, attempt, "
    "placements"
)
_INSERT: Final = (
    f"INSERT INTO jobs (id, seq, description, submitted, {_COLUMNS}, ranks, orders, submit_id)"
    f" VALUES ({', '.join(['?'] * 19)})"
)
#: A job none of whose ``_UNSET`` fields is set: a 13-value row.
_INSERT_NEW: Final = (
    "INSERT INTO jobs (id, seq, description, submitted, state, state_time, phase, closing, attempt, placements,"
    f" ranks, orders, submit_id) VALUES ({', '.join(['?'] * 13)})"
)
_NEW_ROW: Final = 13
_UPDATE: Final = (
    "UPDATE jobs SET state = ?, state_time = ?, exit_code = ?, message = ?, metadata = ?, phase = ?, "
    "started = ?, ended = ?, cancel_reason = ?, closing = ?, attempt = ?, placements = ?, orders = ?, "
    "ranks = coalesce(?, ranks) WHERE id = ?"
)
#: A job none of whose ``_UNSET`` fields is set (placed, or queued again): a 9-value row.
_UPDATE_NEW: Final = (
    "UPDATE jobs SET state = ?, state_time = ?, exit_code = NULL, message = NULL, metadata = NULL, phase = ?, "
    "started = NULL, ended = NULL, cancel_reason = NULL, closing = ?, attempt = ?, placements = ?, orders = ?, "
    "ranks = coalesce(?, ranks) WHERE id = ?"
)
_NEW_UPDATE_ROW: Final = 9
#: A job with no message, no cancel reason and no new placement (one that ran and ended plainly, or
#: started): a 12-value row.
_UPDATE_PLAIN: Final = (
    "UPDATE jobs SET state = ?, state_time = ?, exit_code = ?, message = NULL, metadata = ?, phase = ?, "
    "started = ?, ended = ?, cancel_reason = NULL, closing = ?, attempt = ?, placements = ?, orders = ? WHERE id = ?"
)
_PLAIN_ROW: Final = 12
#: ... one with no process outstanding (it ended so, say: no orders bound): an 11-value row.
_UPDATE_ENDED: Final = _UPDATE_PLAIN.replace("orders = ?", "orders = NULL")
_ENDED_ROW: Final = 11
#: Each UPDATE by the length of its rows (ranks are the second last value of all but the plain ones).
_UPDATES: Final = {
    _NEW_UPDATE_ROW: _UPDATE_NEW,
    _ENDED_ROW: _UPDATE_ENDED,
    _PLAIN_ROW: _UPDATE_PLAIN,
    15: _UPDATE,  # every field
}


class Batch:
    """The changes of one flush, written in one transaction when the ``with`` block ends.

    Calls only append to lists (no SQL) so a batch that raises leaves nothing behind, and a big
    batch is written with one ``executemany`` per kind of change."""

    __slots__ = (
        "_accepted",
        "_accepted_at",
        "_alloc",
        "_envs",
        "_forgot",
        "_meta",
        "_nodes",
        "_packed_orders",
        "_requeued",
        "_results",
        "_updates",
    )

    def __init__(self) -> None:
        #: New jobs' full rows: a job placed (or ended) in the batch that accepted it is written by one
        #: INSERT, not an INSERT and an UPDATE.
        self._accepted: list[tuple[Any, ...]] = []
        self._accepted_at: dict[str, int] = {}  # job id -> its row in _accepted
        self._results: list[tuple[Any, ...]] = []
        self._envs: list[tuple[Any, ...]] = []
        self._alloc: dict[int, tuple[Any, ...]] = {}
        self._requeued: list[tuple[str]] = []
        #: Requeued job -> how long _updates, _envs and _results were when it was (_prune).
        self._forgot: dict[str, tuple[int, int, int]] = {}
        self._updates: list[tuple[Any, ...]] = []
        self._nodes: list[tuple[str, bytes]] = []
        self._meta: list[tuple[str, bytes]] = []
        #: Each dispatched order's wire form as packed for the journal, by the id of that wire form (kept
        #: with it, so the id cannot be another's): the LAUNCH frame reuses the bytes (:meth:`packed_order`).
        self._packed_orders: dict[int, tuple[Mapping[str, Any], bytes]] = {}

    def job_accepted(
        self,
        job_id: str,
        seq: int,
        description: JobDescription | Mapping[str, Any],
        submitted: float,
        *,
        state: JobState = JobState.QUEUED,
        submit_id: str | None = None,
    ) -> None:
        """A job the daemon accepted. ``description`` may be the validated wire map the client sent,
        which saves re-encoding it (``JobDescription.from_wire`` accepted it, so it loads back).
        ``submit_id``: the client's own id for the job (:meth:`Store.jobs_by_submit_id` finds it)."""
        raw = description.to_wire() if isinstance(description, JobDescription) else description
        self._accepted_at[job_id] = len(self._accepted)
        fields = (state._value_, submitted, "queued", 0, 0, 0)  # job_update's _SET fields (it has no _UNSET one)
        self._accepted.append((job_id, seq, blob(raw), submitted, *fields, None, None, submit_id))

    def job_update(self, job: JobRecord, *, placed: bool = False) -> None:
        """The job's row as it is now: state (and, once final, exit code, message and Delivered), phase,
        timing, cancel reason, attempt, placements; its placement too when ``placed`` (it changed). One statement per
        changed job per flush, whatever changed."""
        meta = blob(job.metadata) if job.metadata and job.state.final else None  # (a dict: packed as it is)
        run = job.run
        ranks = _pack_ranks(run.ranks) if placed else None
        # Its processes' orders while it has any, for a restarted daemon (an ended job's are of no use).
        processes = run.processes
        orders = _orders(processes) if processes and not job.state.final else None
        fields = (
            job.state._value_,  # (Enum's .value is a Python-level descriptor: this is its plain attribute)
            job.state_time,
            job.exit_code,
            job.message,
            meta,
            job.phase.journaled,
            run.started,
            run.ended,
            job.cancel_reason,
            int(job.closing),
            run.number,
            job.placements,
        )
        at = self._accepted_at.get(job.id)
        if at is not None:
            row = self._accepted[at]
            if not placed:
                ranks = row[-3]
            changing = _SET(fields) if _UNSET(fields) == _NONE else fields
            self._accepted[at] = (*row[:_CHANGING], *changing, ranks, orders, row[-1])
        elif _UNSET(fields) == _NONE:
            self._updates.append((*_SET(fields), orders, ranks, job.id))
        elif ranks is None and fields[3] is None and fields[8] is None:  # no message, cancel reason, placement
            if orders is None:
                self._updates.append((*fields[:3], *fields[4:8], *fields[9:], job.id))
            else:
                self._updates.append((*fields[:3], *fields[4:8], *fields[9:], orders, job.id))
        else:
            self._updates.append((*fields, orders, ranks, job.id))

    def job_requeued(self, job_id: str) -> None:
        """The job goes back to the queue for another attempt: its placement, processes and results so
        far are forgotten (changes for it earlier in this batch included), the new attempt's are kept."""
        at = self._accepted_at.get(job_id)
        if at is not None:
            row = self._accepted[at]
            self._accepted[at] = (*row[:-3], None, *row[-2:])
        # What the batch holds of it so far is dropped when it is written (_prune): a look at the whole
        # batch per requeued job would cost O(batch) each, and a flush may requeue thousands.
        self._forgot[job_id] = (len(self._updates), len(self._envs), len(self._results))
        self._requeued.append((job_id,))

    def _prune(self) -> None:
        """Forget what requeued jobs' earlier attempts wrote into this batch (:meth:`job_requeued`): their
        rows from before the requeue lose their placement; their environments, processes and results
        go (its packed orders may stay: unused)."""
        forgot = self._forgot
        self._updates = [
            (*t[:-2], None, t[-1])
            if (m := forgot.get(t[-1])) is not None and i < m[0] and len(t) not in (_PLAIN_ROW, _ENDED_ROW)
            else t
            for i, t in enumerate(self._updates)
        ]
        self._envs = [t for i, t in enumerate(self._envs) if (m := forgot.get(t[-1])) is None or i >= m[1]]
        self._results = [t for i, t in enumerate(self._results) if (m := forgot.get(t[0])) is None or i >= m[2]]
        forgot.clear()

    def node_registered(self, node: NodeConfigured) -> None:
        """A node's agent registered: a restarted daemon expects it back."""
        self._nodes.append((node.name, pack(node.to_wire())))

    def meta(self, key: str, value: Any) -> None:
        """A daemon-wide value (msgpack-able) kept across restarts."""
        self._meta.append((key, pack(value)))

    def process_dispatched(
        self, job_id: str, plan: PlannedProcess, *, order_wire: Mapping[str, Any] | None = None
    ) -> None:
        """A process order sent (or about to be sent) to an agent; outstanding until its result.
        ``order_wire``: the order's wire form when the caller has it already (it is what is sent)."""
        wire = plan.order.to_wire() if order_wire is None else order_wire
        packed = pack(wire)
        self._packed_orders[id(wire)] = (wire, packed)
        plan.packed = packed  # (journaled with its job's row: job_update)

    def packed_order(self, wire: Mapping[str, Any]) -> bytes | None:
        """The msgpack bytes of an order this batch journals, when ``wire`` is that very order's wire form
        (what the daemon sends is what the journal keeps, packed once); None otherwise."""
        hit = self._packed_orders.get(id(wire))
        return hit[1] if hit is not None and hit[0] is wire else None

    def process_result(self, job_id: str, slot: int, result: ProcessResult) -> None:
        """How one process ended (or why it never started)."""
        data = blob(result.data) if result.data else None
        self._results.append(
            (
                job_id,
                slot,
                result.node,
                result.role,
                result.exit_code,
                result.signal,
                result.message,
                result.reason,
                data,
            )
        )

    def pre_launch_environment(self, job_id: str, environment: Mapping[str, str] | None, unset: Sequence[str]) -> None:
        """What the job's pre_launch script set and unset: the rank phase needs it, also after a restart."""
        env = None if environment is None else blob(dict(environment))
        self._envs.append((env, blob(list(unset)), job_id))

    def allocation(self, a: Allocation, *, key: str = "a1", site: str = "main") -> None:
        """An allocation as it is now: a restarted daemon re-attaches to it instead of asking again."""
        self._alloc[int(key[1:])] = (
            int(key[1:]),
            a.lrm,
            a.native_id,
            a.state.value,
            a.nodes,
            a.submitted,
            a.started,
            a.walltime,
            pack([n.to_wire() for n in a.expected_nodes]),
            pack(list(a.hosts)),
            a.message,
            pack(dict(a.detail)),
            site,
        )

    def write(self, db: sqlite3.Connection) -> None:
        if self._forgot:
            self._prune()
        if self._requeued:  # first: the new attempt's records below must survive
            db.executemany("DELETE FROM results WHERE job_id = ?", self._requeued)
            db.executemany(
                "UPDATE jobs SET ranks = NULL, environment = NULL, unset = NULL WHERE id = ?", self._requeued
            )
        if self._accepted:
            # The next sequence number is max(seq) + 1 when loading (job rows are never deleted); an
            # older journal's meta 'seq' row is still read.
            new = [row for row in self._accepted if len(row) == _NEW_ROW]  # (each job once: any order)
            if new:
                db.executemany(_INSERT_NEW, new)
            if len(new) < len(self._accepted):
                db.executemany(_INSERT, [row for row in self._accepted if len(row) != _NEW_ROW])
        if self._envs:
            db.executemany("UPDATE jobs SET environment = ?, unset = ? WHERE id = ?", self._envs)
        if self._results:
            db.executemany("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", self._results)
        # One statement per shape of rows. A job updated twice in the batch (kept over several flushes)
        # ends as its last row says: then the rows keep the order they came in, each run of one shape
        # in a statement.
        updates = self._updates
        if len(updates) == 1:  # (a lone job's turn: no shapes to sort out)
            db.executemany(_UPDATES[len(updates[0])], updates)
        elif updates:
            if len({row[-1] for row in updates}) == len(updates):  # each job once: in any order
                updates = sorted(updates, key=len)
            for size, rows in itertools.groupby(updates, len):
                db.executemany(_UPDATES[size], rows)
        if self._alloc:
            db.executemany(
                "INSERT OR REPLACE INTO allocation VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", self._alloc.values()
            )
        if self._nodes:
            db.executemany("INSERT OR REPLACE INTO nodes VALUES (?, ?)", self._nodes)
        if self._meta:
            db.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                self._meta,
            )

    @property
    def rows(self) -> int:
        """How many rows the batch writes (what a daemon whose journal cannot be written holds in memory)."""
        return (
            len(self._accepted)
            + len(self._results)
            + len(self._envs)
            + len(self._alloc)
            + len(self._requeued)
            + len(self._updates)
            + len(self._nodes)
            + len(self._meta)
        )

    @property
    def empty(self) -> bool:
        return not (
            self._accepted
            or self._results
            or self._envs
            or self._alloc
            or self._requeued
            or self._updates
            or self._nodes
            or self._meta
        )

"""The journal read back into job records, for a daemon that resumes (or a tool that inspects it).

A daemon needs its unfinished jobs in full; the ended ones it needs only counted, and their ids where a
client's lease names them: the journal answers for everything else about them (status, description,
'pilot show'), row by row. A journal of a long campaign holds millions of ended jobs: building each one's
record only to drop it made a restart take minutes and gigabytes. :func:`read` with ``ended=False``
leaves them in SQLite."""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

from pilot.core.leases import META as LEASES_META
from pilot.core.phase import Phase
from pilot.frontends import JOURNAL_EXTRAS
from pilot.job_ids import CANCELING_META, Ranges, canceling_runs, journal_ranges
from pilot.job_ids import META as IDS_META
from pilot.jobs import JobRecord, ProcessResult
from pilot.launchers.base import PlannedProcess
from pilot.lrm.base import Allocation, AllocationState
from pilot.model.job_description import JobDescription
from pilot.model.job_state import FINAL_NAMES, JobState
from pilot.model.node import NodeConfigured
from pilot.model.process_order import ProcessOrder
from pilot.scheduler.placement import RankPlacement
from pilot.store_batch import unpack

#: The final states as the journal writes them, and SQL that picks the rows in them (or the others).
_FINAL: Final = FINAL_NAMES
_IN_FINAL: Final = f"state IN ({', '.join('?' * len(_FINAL))})"
_NOT_FINAL: Final = f"state NOT IN ({', '.join('?' * len(_FINAL))})"


@dataclass(slots=True)
class Recovered:
    """Everything :meth:`Store.load` found: enough to rebuild the daemon's job table and allocation.

    ``jobs`` are in submission order with their last state, placement, outstanding ``processes``
    (dispatched, no result yet), ``results``, pre_launch environment and ``held`` ranks rebuilt
    (``subscribers`` is empty: clients re-attach); the ended ones too unless loaded with ``ended=False``,
    when ``ended`` counts them by state instead and ``leased_ended`` holds those of their ids that lie
    in a lease the journal keeps."""

    jobs: list[JobRecord] = field(default_factory=list)
    #: (key, site, allocation) in the order they were requested.
    allocations: list[tuple[str, str, Allocation]] = field(default_factory=list)
    next_seq: int = 1
    #: Nodes whose agents had registered (by name).
    nodes: list[NodeConfigured] = field(default_factory=list)
    #: Ended jobs left out of ``jobs``, by state.
    ended: Counter[JobState] = field(default_factory=Counter)
    #: Ids of ended jobs left out of ``jobs`` that lie in a lease of ``meta``'s (the lease's id was used).
    leased_ended: list[str] = field(default_factory=list)
    #: Every job id the journal holds (ended ones too), as runs (:mod:`pilot.job_ids`).
    id_ranges: Ranges = field(default_factory=list)

    @property
    def allocation(self) -> Allocation | None:
        """The first allocation (a pilot with one)."""
        return self.allocations[0][2] if self.allocations else None

    #: ``Batch.meta`` values (e.g. the endpoint the agents connect to).
    meta: dict[str, Any] = field(default_factory=dict)


def read(db: sqlite3.Connection, *, ended: bool) -> Recovered:
    """What the journal ``db`` holds; ``ended``: the ended jobs' records too. Raises sqlite3.Error, or
    ValueError (and the like) for a record that cannot be read."""
    out = Recovered()
    jobs, orders = _jobs(db, ended=ended)
    own = "" if ended else f" WHERE job_id IN (SELECT CAST(id AS TEXT) FROM jobs WHERE {_NOT_FINAL})"
    params = () if ended else _FINAL
    for jid, slot, node, role, code, sig, msg, reason, data in db.execute("SELECT * FROM results" + own, params):
        if jid in jobs:
            jobs[jid].run.add_result(
                slot,
                ProcessResult(
                    node,
                    role,
                    exit_code=code,
                    signal=sig,
                    message=msg,
                    reason=reason,
                    data=unpack(data) if data else {},
                ),
            )
    for jid, packed in orders.items():
        owner = jobs[jid]
        if owner.final:
            continue  # (a row from before its end was written: nothing of it runs on)
        for slot, node, order, holds in unpack(packed):
            if slot in owner.run.results:
                continue  # done: only outstanding processes are rebuilt
            plan = PlannedProcess(node, ProcessOrder.from_wire(unpack(order)), list(holds))
            plan.packed = bytes(order)
            owner.run.add_process(slot, plan)
    for job in jobs.values():
        job.run.taken = _taken(job)
    out.jobs = list(jobs.values())
    bad = db.execute("SELECT id, seq FROM jobs WHERE typeof(seq) != 'integer' LIMIT 1").fetchone()
    if bad is not None:  # the next job's id comes from it: a damaged one must not be used
        raise ValueError(f"job {bad[0]}: sequence number {bad[1]!r} is not an integer")
    max_seq = db.execute("SELECT coalesce(max(seq), 0) FROM jobs").fetchone()[0]
    row = db.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()
    out.next_seq = max(max_seq, int(row[0]) if row else 0) + 1
    out.allocations = _allocations(db)
    out.nodes = [NodeConfigured.from_wire(unpack(c)) for _, c in db.execute("SELECT name, config FROM nodes")]
    for key, value in db.execute("SELECT key, value FROM meta WHERE key != 'seq'"):
        out.meta[key] = unpack(value)
    if not ended:
        for state, n in db.execute(f"SELECT state, count(*) FROM jobs WHERE {_IN_FINAL} GROUP BY state", _FINAL):
            out.ended[JobState(state)] = n
        out.leased_ended = _leased_ended(db, out.meta.get(LEASES_META))
    total = len(out.jobs) + sum(out.ended.values())
    out.id_ranges = journal_ranges(db, kept=out.meta.get(IDS_META), total=total)
    canceling_runs(out.meta.get(CANCELING_META))  # (damaged: raises here, as the journal is read)
    return out


def _jobs(db: sqlite3.Connection, *, ended: bool) -> tuple[dict[str, JobRecord], dict[str, bytes]]:
    """The jobs, and the packed outstanding orders of those that have them."""
    jobs: dict[str, JobRecord] = {}
    orders: dict[str, bytes] = {}
    rows = db.execute(
        "SELECT id, description, submitted, state, state_time, exit_code, message, metadata, phase,"
        " started, ended, cancel_reason, closing, attempt, placements, ranks, environment, unset, orders FROM jobs"
        + ("" if ended else f" WHERE {_NOT_FINAL}")
        + " ORDER BY seq",
        () if ended else _FINAL,
    )
    for row in rows:
        (
            jid,
            desc,
            submitted,
            state,
            st,
            code,
            msg,
            meta,
            phase,
            started,
            stopped,
            cr,
            closing,
            attempt,
            placements,
            ranks,
            env,
            un,
            packed,
        ) = row
        jid = str(jid)
        try:
            raw = unpack(desc)
            extra = {k: raw.pop(k) for k in JOURNAL_EXTRAS if isinstance(raw, dict) and k in raw}
            description = JobDescription.from_wire(raw)
        except Exception as exc:
            raise ValueError(f"job {jid}: {exc}") from None
        job = JobRecord(id=jid, description=description, submitted=submitted, state=JobState(state))
        job.journaled = extra or None
        job.state_time = st
        job.exit_code = code
        job.message = msg
        job.metadata = unpack(meta) if meta is not None else {}
        job.phase = Phase.from_journal(phase)
        run = job.run
        run.started = started
        run.ended = stopped
        job.cancel_reason = cr
        job.closing = bool(closing)
        run.number = int(attempt)
        # -1: a journal of an earlier version, where a job's processes carried ``<id>~<attempt>``.
        job.placements = int(placements) if placements >= 0 else run.number + 1
        if ranks is not None:
            run.ranks = [RankPlacement(n, list(c), list(g), int(m), bool(b)) for n, c, g, m, b in unpack(ranks)]
        run.environment = unpack(env) if env is not None else None
        run.unset = unpack(un) if un is not None else []
        jobs[jid] = job
        if packed is not None:
            orders[jid] = packed
    return jobs, orders


def _leased_ended(db: sqlite3.Connection, leases: Any) -> list[str]:
    """The ended jobs' ids within the leases ``leases`` names (as :meth:`Leases.journal_value` wrote
    them); a malformed value is left to :meth:`Leases.restore` to refuse."""
    if not isinstance(leases, list):
        return []
    found: list[str] = []
    for item in leases:
        if isinstance(item, list) and len(item) == 2 and all(type(x) is int for x in item):
            rows = db.execute(f"SELECT id FROM jobs WHERE id BETWEEN ? AND ? AND {_IN_FINAL}", (*item, *_FINAL))
            found += [str(r[0]) for r in rows]
    return found


def _allocations(db: sqlite3.Connection) -> list[tuple[str, str, Allocation]]:
    out: list[tuple[str, str, Allocation]] = []
    arows: list[tuple[Any, ...]] = db.execute("SELECT * FROM allocation ORDER BY id").fetchall()
    for (
        num,
        lrm,
        native_id,
        state,
        nodes,
        submitted,
        started,
        walltime,
        expected,
        hosts,
        message,
        detail,
        site,
    ) in arows:
        a = Allocation(
            native_id=native_id,
            lrm=lrm,
            state=AllocationState(state),
            nodes=nodes,
            expected_nodes=[NodeConfigured.from_wire(n) for n in unpack(expected)],
            message=message,
            submitted=submitted,
            started=started,
            walltime=walltime,
            hosts=list(unpack(hosts)),
            detail=dict(unpack(detail)) if detail is not None else {},
        )
        out.append((f"a{int(num)}", str(site), a))
    return out


def _taken(job: JobRecord) -> list[bool]:
    """Which ranks still hold their slots: none once the job is done; all while it stages in or pre_launch runs (the
    daemon takes them at start and frees them at the end); else those an outstanding process holds."""
    run = job.run
    n = len(run.ranks)
    if job.final or job.phase in (Phase.DONE, Phase.QUEUED):
        return [False] * n
    if job.phase is Phase.PRE_LAUNCH or job.phase is Phase.STAGE_IN:
        return [True] * n
    held = [False] * n
    for plan in run.processes.values():
        for i in plan.holds:
            if 0 <= i < n:
                held[i] = True
    return held

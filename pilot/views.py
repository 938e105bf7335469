"""Read-only views of the core for 'pilot status', 'jobs', 'explain', 'show' and 'nodes': they look, never change.

Jobs that left memory (ended, or from an earlier daemon) are answered from the journal.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any

from pilot import job_ids
from pilot.allocations import allocation_of_node
from pilot.core.jobs import History
from pilot.core.lifecycle import RECLAIM_AFTER
from pilot.core.outcome import task_entries
from pilot.core.phase import Phase
from pilot.core.reactor import Core
from pilot.formats import write_job, write_nodes
from pilot.frontends import DOCUMENTS, JOURNAL_EXTRAS, rebuild
from pilot.jobs import JobRecord
from pilot.model.job_description import DescriptionError, JobDescription, run_of
from pilot.model.job_state import FINAL_NAMES, FINAL_STATES, JobState
from pilot.model.sss import JobStatus, NodeObject, TaskStatus, job_with_status, node_object
from pilot.model.sss.psij import to_sss
from pilot.scheduler.dag import Verdict
from pilot.scheduler.distribution import why_not
from pilot.security import redact
from pilot.wire.messages import Explain, Jobs, ListJobs, Nodes, Show


def answer(core: Core, msg: Explain | Show | ListJobs | Jobs | Nodes) -> dict[str, Any]:
    """The answer to a client's read-only request."""
    match msg:
        case Explain(ids=ids):
            return {"results": [explain(core, i) for i in ids]}
        case Show(ids=ids):
            return {"results": [show(core, i) for i in ids]}
        case ListJobs(ranges=True):
            return {"ranges": core.book.ids.ranges()}
        case ListJobs():  # (a client from before ranges: one string per job)
            return {"ids": job_ids.expand(core.book.ids.ranges())}
        case Jobs(states=states, name=name, run=run, since=since, limit=limit, delivered=delivered, latest=latest):
            return jobs(
                core,
                states=states,
                name=name,
                run=run,
                since=since,
                limit=limit,
                delivered=delivered,
                latest=latest,
            )
    return {"xml": nodes_xml(core)}


def jobs(
    core: Core,
    *,
    states: Sequence[str] = (),
    name: str | None = None,
    run: str | None = None,
    since: float | None = None,
    limit: int | None = None,
    delivered: bool = False,
    latest: bool = False,
) -> dict[str, Any]:
    """'pilot jobs': one summary row per job that matches every filter given (state, a glob on the
    name, the run, submitted at or after ``since``), in submission order: the jobs in memory, and those
    only the journal holds. With ``limit``, the last ``limit`` rows: the journal is read newest first
    and only until it has given that many (this runs in the daemon's I/O loop); ``left_out`` says how
    many earlier ones match (None: some, not counted). With ``delivered``, each row has its Delivered
    (empty until the job has ended). With ``latest`` (and ``limit``, of ended jobs only): the last
    ``limit`` jobs to have ended, in the order they ended (:func:`_latest`)."""
    if latest:
        assert limit is not None, "the wire refuses 'latest' without 'limit'"
        return _latest(core, states=states, name=name, run=run, since=since, limit=limit, delivered=delivered)
    wanted = set(states)

    def matches(state: str, submitted: float, job_name: str | None, job_run: str | None) -> bool:
        return (
            (not wanted or state in wanted)
            and (since is None or submitted >= since)
            and (name is None or fnmatch.fnmatchcase(job_name or "", name))
            and (run is None or job_run == run)
        )

    live = core.book.jobs
    # The jobs in memory that match (a million queued ones, in a deep queue), and of those the last
    # ``limit`` by id, before any row is built: rows only for what is shown.
    if wanted or since is not None or name is not None or run is not None:
        keys: Collection[str] = [
            k
            for k, j in live.items()
            if matches(j.state._value_, j.submitted, j.description.name, run_of(j.description.custom_attributes))
        ]
    else:
        keys = live.keys()
    matched = len(keys)
    if limit is not None and matched > limit:
        keys = [str(i) for i in sorted(map(int, keys))[-limit:]]  # (accept order is nearly id order: fast)
    chosen = [
        _live_row(j) | ({"delivered": j.metadata if j.final else {}} if delivered else {})
        for j in map(live.__getitem__, keys)
    ]
    history = core.book.history
    more = False
    # Every unfinished job is in memory: the journal is read for ended ones only (not past the deep
    # queue's rows, each of which it would have to read to skip).
    ended = [s for s in FINAL_NAMES if not wanted or s in wanted]
    stored = 0  # the journal's rows taken
    if history is not None and ended:
        for raw in history.job_rows(states=ended, since=since, newest_first=limit is not None):
            if raw[0] in live:
                continue  # memory knows it better
            row = _stored_row(*raw) | ({"delivered": raw[6] or {}} if delivered else {})
            if not matches(row["state"], row["submitted"], row["name"], row["run"]):
                continue
            if limit is not None and stored == limit:
                more = True  # one beyond what can be shown: earlier ones exist
                break
            chosen.append(row)
            stored += 1
    chosen.sort(key=lambda r: _id_order(r["id"]))
    total = matched + stored  # (the live ones cut above count too)
    if limit is None or total <= limit:
        return {"jobs": chosen, "left_out": None if more else 0}
    return {"jobs": chosen[len(chosen) - limit :], "left_out": None if more else total - limit}


def _latest(
    core: Core,
    *,
    states: Sequence[str],
    name: str | None,
    run: str | None,
    since: float | None,
    limit: int,
    delivered: bool,
) -> dict[str, Any]:
    """The last ``limit`` jobs to have ended in one of ``states`` (final ones; none given: all), that
    match the other filters, in the order they ended ('pilot top': the rate and the latest failures).
    Without other filters, memory holds them (``JobBook.latest_ended``), however deep the queue; else,
    or when memory cannot tell (they ended before this daemon started), the journal is read by end,
    newest first."""
    book = core.book
    finals = [JobState(s) for s in states] if states else list(FINAL_STATES)
    wanted = {s.value for s in finals}
    ended = book.latest_ended(finals, limit) if name is None and run is None and since is None else None
    if ended is not None:
        shown = [_live_row(j) | ({"delivered": j.metadata} if delivered else {}) for j in ended]
        return {"jobs": shown, "left_out": sum(book.counts[s] for s in finals) - len(shown)}

    def matches(row: dict[str, Any]) -> bool:
        return (
            row["state"] in wanted
            and (since is None or row["submitted"] >= since)
            and (name is None or fnmatch.fnmatchcase(row["name"] or "", name))
            and (run is None or row["run"] == run)
        )

    # Ended since the last flush: the journal's rows of them may not say so yet.
    fresh = [j for j in book.unflushed_ends() if j.id in book.jobs]
    rows: list[dict[str, Any]] = [
        r for r in (_live_row(j) | ({"delivered": j.metadata} if delivered else {}) for j in fresh) if matches(r)
    ]
    seen = {j.id for j in fresh}
    more = False
    history = book.history
    if history is not None:
        taken = 0
        for raw in history.job_rows(states=sorted(wanted), since=since, newest_first=True, by_end=True):
            if raw[0] in seen:
                continue
            row = _stored_row(*raw) | ({"delivered": raw[6] or {}} if delivered else {})
            if not matches(row):
                continue
            if taken == limit:
                more = True
                break
            rows.append(row)
            taken += 1
    rows.sort(key=lambda r: r["time"])
    cut = max(0, len(rows) - limit)
    return {"jobs": rows[cut:], "left_out": None if more else cut}


def history_rows(rows: Iterable[tuple[Any, ...]]) -> Iterator[dict[str, Any]]:
    """The journal's job rows (``Store.job_rows``) as 'pilot jobs' rows with their Delivered: what
    the accounting record (:mod:`pilot.history`) keeps when the pilot stops."""
    for raw in rows:
        yield _stored_row(*raw) | {"delivered": raw[6], "files": _files(raw[1])}


#: What of a job's description the history keeps for 'pilot logs' after the pilot is gone: where its
#: output went (not the rest: its environment may hold secrets).
_FILE_KEYS = ("stdout_path", "stderr_path", "directory", "submit_directory")


def _files(desc: dict[str, Any]) -> dict[str, str]:
    return {k: v for k in _FILE_KEYS if isinstance(v := desc.get(k), str) and v}


def _live_row(job: JobRecord) -> dict[str, Any]:
    d, ranks = job.description, job.run.ranks
    return {
        "id": job.id,
        "name": d.name,
        "run": run_of(d.custom_attributes),
        "state": job.state.value,
        "time": job.state_time,
        "exit_code": job.exit_code,
        "message": job.message,
        "submitted": job.submitted,
        "started": job.run.started,
        "ended": job.run.ended if job.final else None,
        "nodes": sorted({r.node for r in ranks}),
        "cores": sum(len(r.cores) for r in ranks),
        "gpus": sum(len(r.gpus) for r in ranks),
        "memory": d.resources.memory_per_process * d.resources.process_count,
        "command": [d.executable, *d.arguments],
    }


def _stored_row(
    job_id: str,
    desc: dict[str, Any],
    state: str,
    t: float,
    code: int | None,
    message: str | None,
    meta: dict[str, Any],
    submitted: float,
    started: float | None,
    ended: float | None,
) -> dict[str, Any]:
    name, args = desc.get("name"), desc.get("arguments")
    nodes = meta.get("nodes")
    return {
        "id": job_id,
        "name": name if isinstance(name, str) else None,
        "run": run_of(desc.get("custom_attributes")),
        "state": state,
        "time": t,
        "exit_code": code,
        "message": message,
        "submitted": submitted,
        "started": started,
        "ended": ended,
        "nodes": [str(n) for n in nodes] if isinstance(nodes, list) else [],
        "cores": int(meta.get("processors") or 0),
        "gpus": int(meta.get("gpus") or 0),
        "memory": _asked_memory(desc.get("resources")),
        "command": [str(desc.get("executable", "")), *(str(a) for a in args)]
        if isinstance(args, list)
        else [str(desc.get("executable", ""))],
    }


def _asked_memory(resources: Any) -> int:
    """The memory a journaled description asked for, in bytes (0: none), as 'pilot report' compares it
    with the max RSS used. The client sends only what differs from the defaults (one process); the
    process count follows ResourceSpecV1's rules."""
    if not isinstance(resources, dict):
        return 0

    def whole(key: str) -> int | None:
        value = resources.get(key)
        return value if type(value) is int and value >= 0 else None

    per, nodes, ppn = whole("memory_per_process"), whole("node_count"), whole("processes_per_node")
    count = whole("process_count") or (nodes * ppn if nodes and ppn else nodes or ppn or 1)
    return per * count if per else 0


def explain(core: Core, job_id: str) -> dict[str, Any]:
    """Why a job is still QUEUED (what it waits for, or which requirement no node meets), or how it
    ended: for 'pilot explain' and the client's explain()."""
    book, nodes = core.book, core.nodes
    job = book.jobs.get(job_id)
    if job is None:
        found = book.history.job_status(job_id) if book.history is not None else None
        if found is None:
            return {"error": f"no job {job_id!r} in this pilot"}
        _, state, _, code, message, _ = found[0]
        return {"id": job_id, "state": state, "reasons": [_ended_reason(state, code, message)]}
    state = job.state.value
    if job.final:
        return {"id": job_id, "state": state, "reasons": [_ended_reason(state, job.exit_code, job.message)]}
    if job.phase not in (Phase.QUEUED, Phase.BLOCKED):
        return {"id": job_id, "state": state, "reasons": [_placed_reason(core, job)]}
    reasons: list[str] = []
    if job.user_hold:
        reasons.append(f"it is held (SSS <Hold>): 'pilot release {job_id}' lets it run")
    if book.early(job):
        assert job.request.not_before is not None
        reasons.append(
            "it does not start before its start time (JRDL jobStartTime) "
            + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(job.request.not_before))
            + f", in {job.request.not_before - core.clock.wall:.0f} s"
        )
    if job.request.start_within is not None:
        by = job.submitted + job.request.start_within
        reasons.append(
            "it ends FAILED if not started by "
            + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(by))
            + f" (JRDL jobStartBefore), in {by - core.clock.wall:.0f} s"
        )
    if job.phase is Phase.BLOCKED:
        verdict, waits = book.graph.verdict(job.id)
        reasons += waits if verdict is Verdict.WAIT else []
        if reasons:
            return {"id": job_id, "state": state, "reasons": reasons}
    coming = core.allocations.coming()
    if not nodes.cluster.nodes:
        return {
            "id": job_id,
            "state": state,
            "reasons": ["no node has registered yet (the allocation is starting)", *coming],
        }
    never = nodes.never_fits(job.request)
    if never:
        return {"id": job_id, "state": state, "reasons": ["it can never run here: " + r for r in never]}
    reasons += waits_for(core, job)
    reasons += _queue_order(core, job)
    return {"id": job_id, "state": state, "reasons": reasons + coming}


def _queue_order(core: Core, job: JobRecord) -> list[str]:
    """Who is ahead of a queued job: higher priorities, the same request queued before it, and a job the
    queue holds for (``pilot.reserve_after``)."""
    priority = job.request.priority
    queued = [j for j in core.book.jobs.values() if j.phase is Phase.QUEUED and j is not job]
    higher = sum(1 for j in queued if j.request.priority > priority)
    ahead = sum(
        1
        for j in queued
        if j.request.priority == priority and j.category == job.category and _id_order(j.id) < _id_order(job.id)
    )
    reasons = []
    if higher:
        reasons.append(f"{higher} job(s) of higher priority are queued ahead of it (its priority: {priority})")
    if ahead:
        reasons.append(f"{ahead} job(s) with the same request were queued before it")
    reserved = core.scheduler.reserved
    wait = core.config.pilot.reserve_after
    if reserved is job:
        reasons.append(
            f"the queue holds for it: it has waited over {wait:g} s (pilot.reserve_after) without room, so no job "
            "queued behind it starts until it has"
        )
    elif reserved is not None and reserved.phase is Phase.QUEUED:
        reasons.append(
            f"waits behind job {reserved.id}, which has waited over {wait:g} s (pilot.reserve_after) without room: "
            "the queue holds for it"
        )
    return reasons


def waits_for(core: Core, job: JobRecord) -> list[str]:
    """What a queued job that can run here waits for now."""
    nodes = core.nodes
    resolved, slots = job.request.resolved, job.request.slots
    if job.request.targets is not None:
        return [f"co-allocated, all parts start together: {r}" for r in nodes.co_waits(job.request)]
    if resolved is not None:
        now = why_not(resolved, nodes.matcher, nodes.resources)
        return [f"waits for resources: {r}" for r in now] or ["it fits now: the next scheduling pass starts it"]
    assert slots is not None
    return [
        f"waits for resources: needs {slots.process_count} process(es) of {slots.cpu_cores_per_process} core(s)"
        + (f" and {slots.gpu_cores_per_process} GPU(s)" if slots.gpu_cores_per_process else "")
        + f"; {nodes.free_cores()} core(s) are free now"
    ]


def _placed_reason(core: Core, job: JobRecord) -> str:
    """A placed job: running, or sent to its node behind a busy core (pilot.backlog) and not started
    yet, or being asked back from there (WITHDRAW) to be placed again."""
    nodes = ", ".join(sorted({r.node for r in job.run.ranks}))
    since = core.book.behind.get(job.id)
    if since is None:
        return f"it is running ({job.phase.journaled}) on {nodes}"
    cores = ", ".join(str(c) for r in job.run.ranks for c in r.cores)
    waited = f"{core.clock.mono - since:.2f} s"
    if job.phase is Phase.WITHDRAWING:
        return (
            f"it waited {waited} on {nodes} for core(s) {cores}, still busy with an earlier task, and is being "
            "taken back from that node's agent to be placed again on a core that is free now"
        )
    return (
        f"it is on {nodes} and starts there as soon as core(s) {cores} are free: placed behind a running "
        f"task (pilot.backlog) {waited} ago; after {RECLAIM_AFTER:g} s it is taken back to a free core, if "
        "one comes first"
    )


def show(core: Core, job_id: str) -> dict[str, Any]:
    """The job as SSS Job XML with its State, times, Delivered and (once placed) its Task elements, and as
    a 'pilot jobs' row with its Delivered and its description (None when it came as a document), which
    'pilot resubmit' sends again."""
    job = core.book.jobs.get(job_id)
    if job is not None:
        source = job.request.shown or to_sss(job.description)
        status: list[Any] = job.status()
        started, ended, held = job.run.started, job.run.ended, job.user_hold
        tasks = _task_status(job)
        submitted: float | None = job.submitted
        row = _live_row(job)
        # A job written as a document (request.shown) is resubmitted as that document, not from here.
        row["description"] = None if job.request.shown is not None else job.description.to_wire()
    else:
        history: History | None = core.book.history
        found = history.job_record(job_id) if history is not None else None
        if found is None:
            return {"error": f"no job {job_id!r} in this pilot"}
        raw, status, submitted, started, ended = found
        row = _stored_row(
            job_id, raw, status[1], status[2], status[3], status[4], status[5] or {}, submitted, started, ended
        )
        try:
            plain = {k: v for k, v in raw.items() if k not in JOURNAL_EXTRAS}
            row["description"] = None if any(k in raw for k in DOCUMENTS) else plain
            description = JobDescription.from_wire(plain)
            source = rebuild(description, raw, cluster=core.nodes.cluster).shown or to_sss(description)
        except DescriptionError as exc:
            return {"error": f"job {job_id}: its journaled description cannot be read: {exc}"}
        held = False
        tasks = [TaskStatus.from_entry(entry) for entry in (status[5] or {}).get("tasks", [])]
    st = JobStatus(
        id=job_id,
        state=JobState(status[1]),
        held=held,
        exit_code=status[3],
        message=status[4],
        submit_time=submitted,
        start_time=started,
        end_time=ended,
        delivered=status[5] or {},
        tasks=tasks,
    )
    row |= {"delivered": status[5] or {}, "held": held, "tasks": [[t.group, t.task, t.node] for t in tasks]}
    return {"id": job_id, "xml": write_job(job_with_status(source, st)), "job": row}


def _task_status(job: JobRecord) -> list[TaskStatus]:
    placement = job.run.placement
    if placement is not None:
        return [TaskStatus.from_entry(entry) for entry in task_entries(job)]
    return [TaskStatus(0, i, r.node, r.cores, r.gpus) for i, r in enumerate(job.run.ranks)]


def nodes_xml(core: Core) -> str:
    """The nodes as SSS Node XML: Configured, Available, Utilized."""
    nodes = core.nodes
    out: list[NodeObject] = []
    for name, agent in nodes.agents.items():
        slots = nodes.slots.get(name)
        m = nodes.cluster.nodes.get(name)
        ledger = nodes.resources.ledgers.get(name)
        held = core.allocations.of_node(name)
        out.append(
            node_object(
                agent.node,
                state=_node_state(
                    agent.state, confirmed=agent.confirmed, busy=slots is not None and bool(slots.holders)
                ),
                description=f"node of allocation {allocation_of_node(name)}"
                + (f" (site {held.site.name!r}, {held.site.lrm.kind})" if held is not None else "")
                + f" on host {agent.node.hostname}; its agent is {agent.state}",
                free_processors=len(slots.free_cores) if slots is not None else None,
                free_gpus=len(slots.free_gpus) if slots is not None else None,
                free_memory=slots.free_memory if slots is not None else None,
                utilized=agent.utilized or None,
                resources={
                    k.removeprefix("Resource:"): (cap, ledger.free.get(k, 0.0)) for k, cap in ledger.capacity.items()
                }
                if ledger is not None
                else None,
                attributes={k: v for k, v in m.values.effective(nodes.cluster.registry).items()}
                if m is not None
                else None,
                features=sorted(m.features) if m is not None else None,
            )
        )
    return write_nodes(out)


def _node_state(agent: str, *, confirmed: bool, busy: bool) -> str:
    """The SSS Node State (the spec's: Offline, Configured, Unknown, Idle, Busy) of an agent's node."""
    if agent == "active":
        if not confirmed:
            return "Unknown"  # recovered from the journal; its agent has not registered again yet
        return "Busy" if busy else "Idle"
    if agent in ("lost", "gone", "stopped"):
        return "Offline"
    return "Unknown"


def status(core: Core, *, pilot: dict[str, Any]) -> dict[str, Any]:
    """'pilot status': the pilot (``pilot``: what the shell knows of itself), its allocations, nodes and
    jobs by state. Anything that looks like a secret is masked."""
    held = core.allocations.held
    agents = core.nodes.agents
    allocations = [
        h.to_status(registered=sum(1 for n in h.nodes if n in agents and agents[n].state == "active"))
        for h in held.values()
    ]
    # Orders sent to an agent that wait there behind a busy core (pilot.backlog) are not running yet.
    waiting: dict[str, int] = {}
    for job_id in core.book.behind:
        job = core.book.jobs.get(job_id)
        for r in job.run.ranks if job is not None else ():
            waiting[r.node] = waiting.get(r.node, 0) + 1
    nodes = []
    for name, slots in core.nodes.slots.items():
        agent = agents[name]
        outstanding = len(agent.processes)
        nodes.append(
            {
                "name": name,
                "allocation": allocation_of_node(name),
                "hostname": slots.hostname,
                "agent": agent.state if agent.confirmed else "reconnecting",  # recovered, not back yet
                "cores": len(slots.cores),
                "free_cores": len(slots.free_cores),
                "gpus": len(slots.gpus),
                "free_gpus": len(slots.free_gpus),
                "memory": slots.memory,
                "free_memory": slots.free_memory,
                "processes": outstanding,
                "running": max(0, outstanding - waiting.get(name, 0)),
                "waiting": min(outstanding, waiting.get(name, 0)),
                "load": agent.load,
                "os": agent.node.os,
                "architecture": agent.node.architecture,
                "features": agent.node.features,
            }
        )
    for h in held.values():
        for n in h.allocation.expected_nodes if h.alive else ():
            if n.name not in core.nodes.slots:
                nodes.append(
                    {
                        "name": n.name,
                        "allocation": h.name,
                        "hostname": n.hostname,
                        "agent": "starting",
                        "cores": len(n.processors),
                        "free_cores": 0,
                        "gpus": len(n.gpus),
                        "free_gpus": 0,
                        "memory": n.memory,
                        "free_memory": 0,
                        "processes": 0,
                        "running": 0,
                        "waiting": 0,
                        "load": [],
                        "os": n.os,
                        "architecture": n.architecture,
                        "features": n.features,
                    }
                )
    st: dict[str, Any] = {
        "pilot": pilot,
        # The first still alive (else the last): what a single-allocation pilot has always shown.
        "allocation": next(
            (st for st, h in zip(allocations, held.values(), strict=True) if h.alive),
            allocations[-1] if allocations else None,
        ),
        "allocations": allocations,
        "autoscale": core.allocations.autoscale_status(),
        "nodes": nodes,
        "jobs": {s.value: n for s, n in core.book.counts.items() if n},
        "queued": len(core.book.queue) + len(core.book.behind),
        "warnings": _unmatched_patterns(core),
    }
    masked: dict[str, Any] = redact(st)  # nothing that looks like a secret leaves in a status
    return masked


def _unmatched_patterns(core: Core) -> list[str]:
    """[nodes.PATTERN] tables that match none of the nodes registered: what they set applies nowhere
    (for a batch site, node names are known only now; 'pilot up' judged a local one already)."""
    names = [n.partition("@")[0] for n in core.nodes.slots]
    if not names:
        return []
    return [
        f"[nodes.{pattern!r}] of the config matches none of the {len(names)} node(s) registered: "
        "what it sets applies nowhere"
        for pattern, _ in core.config.nodes
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names)
    ]


def _id_order(job_id: str) -> tuple[int, str]:
    return (int(job_id), "") if job_id.isdigit() else (0, job_id)


def _ended_reason(state: str, code: int | None, message: str | None) -> str:
    text = f"it ended {state}"
    if code is not None:
        text += f" with exit code {code}"
    return text + (f": {message}" if message else "")

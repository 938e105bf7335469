"""The core: pure state driven by events, writing what must happen into its outbox.

The daemon's shell feeds it (client requests, agents' messages, ticks, allocations that end), sets
its clock before each step, and after each burst calls :meth:`Core.step` (schedule, reclaim, journal
batch sealed), commits the journal, then sends what the outbox holds. Nothing in here touches a
socket, a file or the system clock, so every path of a job's life can be driven by a test in
milliseconds (``tests/core/``).
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any, Protocol

import structlog

from pilot.allocations import AllocationBook, PilotAllocation, Site, allocation_of_node
from pilot.config import Config
from pilot.core.admission import ABANDONED, Admission
from pilot.core.agents import Agents
from pilot.core.clock import Clock
from pilot.core.jobs import History, JobBook
from pilot.core.leases import META as LEASES_META
from pilot.core.lifecycle import Lifecycle
from pilot.core.nodes import NodeBook
from pilot.core.outbox import CancelAllocation, Outbox
from pilot.core.phase import Phase
from pilot.core.planning import Planner
from pilot.core.schedule import Scheduler
from pilot.core.state import CoreState
from pilot.frontends import rebuild
from pilot.job_ids import CANCELING_META, JobIds, Ranges, canceling_runs
from pilot.jobs import JobRecord, ProcessResult
from pilot.launchers.base import Launcher
from pilot.model.job_description import DescriptionError, run_of
from pilot.model.job_state import JobState
from pilot.model.node import NodeConfigured
from pilot.scheduler.cluster import Cluster
from pilot.scheduler.dag import edges_from_wire
from pilot.scheduler.distribution import resumed_placement
from pilot.wire.messages import AgentMessage, Stop

log = structlog.get_logger("pilot.core")


_STATES = [s.value for s in JobState]
#: Jobs a mass cancel ends per step: the turn that sends their statuses and journal rows stays short
#: (ending one costs the daemon ~40 us in all).
CANCELS_PER_STEP = 4096


class Journaled(Protocol):
    """What a journal read back holds for :meth:`Core.resume` (:class:`pilot.store_load.Recovered`)."""

    jobs: list[JobRecord]
    nodes: list[NodeConfigured]
    next_seq: int
    meta: dict[str, Any]
    ended: Counter[JobState]
    leased_ended: list[str]
    id_ranges: Ranges


class Core:
    def __init__(
        self,
        *,
        config: Config,
        allocations: AllocationBook,
        cluster: Cluster,
        launchers: dict[str, Launcher],
        history: History | None = None,
        clock: Clock | None = None,
        agent_logs: str = "the agents' log directory",
    ) -> None:
        self.config = config
        self.agent_logs = agent_logs  # where a missing agent's log is, for the message that says so
        self.clock = clock or Clock()
        self.outbox = Outbox()
        self.allocations = allocations
        self.book = JobBook(clock=self.clock, outbox=self.outbox, history=history)
        self.nodes = NodeBook(config=config, cluster=cluster, allocations=allocations, clock=self.clock)
        state = CoreState(config, self.clock, self.outbox, self.book, self.nodes, allocations)
        planner = Planner(launchers=launchers, nodes=self.nodes, clock=self.clock)
        self.lifecycle = Lifecycle(state, planner=planner)
        self.scheduler = Scheduler(state, lifecycle=self.lifecycle)
        self.agents = Agents(state, lifecycle=self.lifecycle)
        self.admission = Admission(state)

    # -- events from clients ------------------------------------------------------------------------

    def on_submit(
        self,
        ident: bytes,
        jobs: list[Any],
        submit_ids: list[str | None] | None,
        *,
        again: bool = True,
        max_queued: int | None = None,
    ) -> list[dict[str, Any]]:
        return self.admission.submit(ident, jobs, submit_ids, again=again, max_queued=max_queued)

    def on_cancel(self, job_id: str, *, reason: str = "canceled") -> dict[str, Any]:
        job = self.book.jobs.get(job_id)
        if job is None:
            history = self.book.history
            if history is not None and history.job_status(job_id) is not None:
                return {"id": job_id}  # it has ended already: nothing to cancel
            return {"error": f"no job {job_id!r} in this pilot"}
        self.lifecycle.cancel(job, reason=reason)
        return {"id": job_id}

    def on_cancel_where(self, states: tuple[str, ...], run: str | None) -> dict[str, Any]:
        """Cancel every unfinished job in one of ``states`` (any, if none) and of the run ``run`` (any, if
        None): every unfinished job is in memory. The answer names them as runs of ids, by the state each
        was in (a deep queue's million jobs in a few runs, not a million ids)."""
        unknown = [s for s in states if s not in _STATES]
        if unknown:
            return {"error": f"unknown state {unknown[0]!r}; use one of {', '.join(_STATES)}"}
        wanted = set(states)
        picked = [
            job
            for job in self.book.jobs.values()
            if not job.final
            and job.cancel_reason is None
            and (not wanted or job.state._value_ in wanted)
            and (run is None or run_of(job.description.custom_attributes) == run)
        ]
        was: dict[str, JobIds] = {}
        book = self.book
        for job in picked:
            ids = was.get(job.state._value_)
            if ids is None:
                ids = was[job.state._value_] = JobIds()
            ids.add(int(job.id))
            if job.phase is Phase.QUEUED or job.phase is Phase.BLOCKED:  # not placed: it never will be
                book.cancel_later(job, reason="canceled")
            else:
                self.lifecycle.cancel(job, reason="canceled")
        return {"canceled": {state: ids.ranges() for state, ids in was.items()}}

    def on_abandon(self, submit_ids: list[str]) -> list[dict[str, Any]]:
        """Submit ids whose client gave up waiting for their answer, from the client or from the run
        directory's list (``RunDir.abandoned_file``): never accepted from now on, and a job already
        accepted under one is canceled. One result per submit id: the jobs it had made, if any."""
        made = self.admission.abandon(submit_ids)
        for job_ids in made.values():
            for job_id in job_ids:
                job = self.book.jobs.get(job_id)
                if job is not None and not job.final:
                    log.info("job withdrawn by its client", job=job_id)
                    self.lifecycle.cancel(job, reason=ABANDONED)
        return [{"submit_id": s, "ids": made[s]} if s in made else {"submit_id": s} for s in submit_ids]

    def on_lease(self, count: int, give_back: tuple[tuple[int, int], ...] = ()) -> dict[str, Any]:
        """Job ids for a client to give its jobs (``pilot/core/leases.py``), after taking back those it
        will never use; journaled at this step's commit, before the reply leaves."""
        for first, last in sorted(give_back, reverse=True):  # the later range first: the counter may come back
            self.book.give_back(first, last)
        if count == 0:
            return {"given_back": True}
        first, last = self.book.lease(count)
        return {"first": first, "last": last}

    def on_attach(self, ident: bytes, job_id: str) -> dict[str, Any]:
        return self.admission.attach(ident, job_id)

    def on_release(self, job_id: str) -> dict[str, Any]:
        """Lift a <Hold> (SSS; any language with one)."""
        job = self.book.jobs.get(job_id)
        if job is None or job.final:
            return {"error": f"job {job_id!r} is not waiting in this pilot"}
        if not job.user_hold:
            return {"id": job_id, "released": False}
        job.user_hold = False
        self.book.unblock(job)
        return {"id": job_id, "released": True}

    # -- events from agents and the batch system ----------------------------------------------------

    def on_agent(self, name: str, msg: AgentMessage) -> None:
        self.agents.on_message(name, msg)

    def on_paused(self, *, since: float, until: float) -> None:
        """The daemon itself did not run from ``since`` to ``until`` (monotonic, measured by the shell: the
        process stopped, swapped out or starved of CPU). Agents' messages wait in the socket meanwhile:
        no agent is declared lost, nor missing, for silence inside such a pause."""
        self.clock.paused(since, until)
        seconds = round(until - since, 1)
        if seconds >= self.config.pilot.heartbeat_interval:
            log.warning("the daemon did not run; agents are not blamed for it", seconds=seconds)
        else:
            log.info("the daemon did not run", seconds=seconds)

    def on_tick(self) -> None:
        """Heartbeats, agents that never came, jobs' start times, allocations whose walltime margin is reached."""
        self.agents.check_heartbeats()
        self._check_agents_started()
        self.book.check_times()
        margin = self.config.pilot.walltime_margin
        for held in list(self.allocations.held.values()):
            end = held.end()
            if end is not None and held.alive and not held.closing and self.clock.wall >= end - margin:
                self._close(held)

    def on_allocation_ended(self, held: PilotAllocation) -> None:
        """The batch system ended an allocation under us (scancel, walltime, node failure) or it never
        started: every job on it ends FAILED with the batch system's own account, at once, not at
        heartbeat timeout. Queued jobs fail too when no allocation is left and none can come."""
        held.over = True
        self.nodes.invalidate()
        allocation = held.allocation
        message = f"the allocation ({allocation.lrm} job {allocation.native_id}) ended: {allocation.message}"
        if held.released:
            log.info("allocation released", allocation=held.name, native_id=allocation.native_id)
        else:
            log.error(
                "allocation ended",
                allocation=held.name,
                native_id=allocation.native_id,
                state=allocation.state.value,
                message=allocation.message,
            )
            if not held.ready:
                self.on_failed_to_start(message)
        for name in sorted(held.nodes):
            agent = self.nodes.agents.get(name)
            if agent is not None:
                self.agents.gone(agent, message)
        self.fail_stranded(message)

    def on_failed_to_start(self, what: str) -> None:
        self.outbox.journal.meta(self.allocations.META, self.allocations.failed_to_start(what))

    def on_release_allocation(self, held: PilotAllocation) -> None:
        """An idle allocation goes back to the batch system: nothing new is placed there, its agents
        are told to stop, then it is cancelled."""
        held.released = True
        self.nodes.invalidate()
        log.info(
            "auto-allocation: releasing an idle allocation", allocation=held.name, native=held.allocation.native_id
        )
        self.stop_agents("allocation released: idle", only=held.nodes)
        self.cancel_allocation(held)

    def cancel_allocation(self, held: PilotAllocation) -> None:
        if held.cancelling or held.allocation.state.final:
            return
        held.cancelling = True
        self.outbox.effects.append(CancelAllocation(held.name))

    def fail_stranded(self, message: str) -> None:
        """Queued jobs fail when no allocation is left and none can come: never a hang."""
        if self.allocations.may_run_later(None, now=self.clock.wall):
            return
        reason = self.allocations.stopped or message
        for job in list(self.book.jobs.values()):
            if job.phase in (Phase.QUEUED, Phase.BLOCKED):
                self.book.end(job, JobState.FAILED, message=reason)

    def _check_agents_started(self) -> None:
        """Agents that have not registered ``agent_start_timeout`` after their allocation started are
        reported (status and log); when none came at all, the allocation is given up and released."""
        timeout = self.config.pilot.agent_start_timeout
        for held in self.allocations.held.values():
            a = held.allocation
            if a.started is None or held.missing_agents or not held.alive or self.allocations.stopping:
                continue
            registered = len(held.nodes)
            if registered >= a.nodes or self.clock.wall - a.started < timeout:
                continue
            if self.clock.awake(self.clock.mono - (self.clock.wall - a.started)) < timeout:
                continue  # the daemon's own pauses are not the agents' time
            held.missing_agents = (
                f"{a.nodes - registered} of {a.nodes} agents did not register within {timeout:g} s "
                f"(pilot.agent_start_timeout); their logs are in {self.agent_logs}"
            )
            log.error("agents missing", allocation=held.name, message=held.missing_agents)
            if registered == 0:
                a.message = held.missing_agents
                self.on_allocation_ended(held)
                self.cancel_allocation(held)  # nothing of it is usable: do not keep paying for it

    def _close(self, held: PilotAllocation) -> None:
        """An allocation's walltime margin is reached: stop every task running on it now, so each ends
        with a clear message instead of being killed by the batch system with the allocation."""
        held.closing = True
        self.nodes.invalidate()
        log.warning(
            "allocation walltime nearly over; stopping running tasks",
            allocation=held.name,
            end=held.end(),
            margin=self.config.pilot.walltime_margin,
        )
        for job in self.book.jobs.values():
            if not job.final and job.run.processes and any(p.node in held.nodes for p in job.run.processes.values()):
                self.lifecycle.close(job)

    # -- the step and shutdown ----------------------------------------------------------------------

    def step(self) -> None:
        """After a burst of events: a scheduling pass, reclaim from behind busy cores, and the journal's
        batch sealed (the shell commits it before anything in the outbox leaves)."""
        if self.book.canceling:
            self.book.end_canceled(CANCELS_PER_STEP)
        self.scheduler.run()
        if self.book.behind:
            self.lifecycle.reclaim()
        self.book.seal()

    def could_run(self, source: Site) -> bool:
        """A new allocation of ``source`` could run one of the oldest queued jobs (its launcher's batch
        system, its duration within the site's walltime): auto-allocation asks before it grows."""
        queue = self.book.queue
        heads = [j for k, _ in queue.heads() if (j := queue.peek(k)) is not None][:16]
        return any(source.could_take(job.description.duration, job.request.needs_lrm) for job in heads)

    def cancel_all(self, reason: str) -> None:
        self.allocations.stopping = True
        self.book.end_canceled(len(self.book.canceling))  # (the pilot stops: no turn to spread them over)
        for job in list(self.book.jobs.values()):
            if not job.final:
                self.lifecycle.cancel(job, reason=reason)

    def stop_agents(self, reason: str, *, only: set[str] | None = None) -> None:
        for name, agent in self.nodes.agents.items():
            if agent.state == "active" and (only is None or name in only):
                self.outbox.to_agent(name, Stop(reason))

    def give_up(self) -> None:
        """The end of a shutdown: agents that did not stop are lost, and every job left ends."""
        for agent in list(self.nodes.agents.values()):
            if agent.state == "active":
                self.agents.gone(agent, f"agent on {agent.name} did not stop in time")
        for job in self.book.jobs.values():
            if not job.final:
                self.lifecycle.finish(job)

    def settled(self) -> bool:
        """Every job final, or no agent left to end them."""
        return all(j.final for j in self.book.jobs.values()) or self.agents_stopped()

    def agents_stopped(self) -> bool:
        return all(a.state != "active" for a in self.nodes.agents.values())

    # -- resume ---------------------------------------------------------------------------------------

    def resume(self, journal: Journaled) -> None:
        """Rebuild from the journal of a daemon that died: jobs, queue, nodes and their held slots. The
        agents keep running and register again (with their unacknowledged events). The journal's ended
        jobs come counted (``journal.ended``), with those of their ids that lie in a lease
        (``journal.leased_ended``)."""
        jobs, nodes, ended = journal.jobs, journal.nodes, journal.ended
        leases = journal.meta.get(LEASES_META)
        for node in nodes:
            agent = self.agents.register(node)
            agent.confirmed = False
            self.nodes.slots[node.name].usable = False  # until its agent is back
            known = self.allocations.held.get(allocation_of_node(node.name))
            if known is None or known.over:
                self.agents.gone(agent, f"node {node.name}'s allocation ended before the restart")
        last_leased = self.book.leases.restore(leases, itertools.chain((job.id for job in jobs), journal.leased_ended))
        self.book.seq = max(journal.next_seq - 1, last_leased)
        book = self.book
        book.counts.update(ended)
        book.ids = JobIds(journal.id_ranges)
        canceling = JobIds(canceling_runs(journal.meta.get(CANCELING_META)))
        for job in jobs:
            if job.final:
                book.counts[job.state] += 1
                continue  # the journal answers for it
            error = self._rebuild_journaled(job)
            book.restore(job)
            if error is not None and job.phase in (Phase.QUEUED, Phase.BLOCKED):
                book.end(job, JobState.FAILED, message=f"not rebuilt after a restart: {error}")
            elif job.phase in (Phase.QUEUED, Phase.BLOCKED) and int(job.id) in canceling:
                book.cancel_later(job, reason="canceled")  # canceled before the restart, not ended yet
            if job.phase in (Phase.QUEUED, Phase.BLOCKED, Phase.DONE):
                continue
            self.nodes.retake(job)
            run = job.run
            for slot, plan in list(run.processes.items()):
                owner = self.nodes.agents.get(plan.node)
                if owner is not None:
                    owner.processes.add((plan.order.job_id, slot))
                else:
                    message = f"node {plan.node} is not known to the restarted daemon"
                    self.lifecycle.process_done(job, slot, ProcessResult(plan.node, plan.order.role, message=message))
            if job.final:
                continue
            if not run.processes:
                self.lifecycle.finish(job)
            elif (
                job.phase is Phase.RANKS
                and run.started is None
                and any(p.order.after_cores for p in run.processes.values())
            ):
                # A journal of an earlier version kept a job behind a core as "ranks": not started, it waits.
                job.phase = Phase.BEHIND
                book.behind[job.id] = self.clock.mono
        for blocked in list(book.blocked.values()):
            book.unblock(blocked)

    def _rebuild_journaled(self, job: JobRecord) -> str | None:
        """A resumed job's request (compiled again from the document the journal kept), dependency
        edges and Hold; why not, if it cannot be."""
        extra, job.journaled = job.journaled, None
        if not (extra or job.description.custom_attributes or self.nodes.cluster.registry.binds_every_job):
            return None  # a plain PSI/J job: its request is its description's ('pilot.*' may ask for nodes)
        extra = extra or {}
        book = self.book
        try:
            job.request = rebuild(job.description, extra, cluster=self.nodes.cluster)
            resolved = job.request.resolved
            if job.run.ranks and resolved is not None:
                job.run.placement = resumed_placement(resolved, job.run.ranks)
            if extra.get("edges"):
                edges = edges_from_wire(extra["edges"])
                book.graph.restore(job.id, job.description.name, edges, where=f"job {job.id}")
                job.edges = extra["edges"]
                for e in edges:
                    for target in e.targets:
                        if target not in book.graph.outcomes and (outcome := book.ended(target)) is not None:
                            book.graph.outcomes[target] = outcome
            job.user_hold = bool(extra.get("hold"))
        except (DescriptionError, ValueError, IndexError) as exc:
            log.error("journaled job cannot be rebuilt", job=job.id, error=str(exc))
            return str(exc)
        return None

"""A placed job's life: its orders go out, its processes' events come back, and it ends, is requeued
(restartable, node lost) or is taken back unstarted from behind a busy core (withdrawn).

Every phase change goes through :meth:`JobBook.move`; every state change through :meth:`JobBook.set_state`.
"""

from __future__ import annotations

from typing import Any

import structlog

from pilot.core.nodes import AgentRecord
from pilot.core.outcome import delivered, outcome
from pilot.core.phase import Phase
from pilot.core.planning import Planner
from pilot.core.state import CoreState, Part
from pilot.jobs import Attempt, JobRecord, ProcessResult
from pilot.launchers import PlannedProcess
from pilot.model.job_state import JobState
from pilot.model.process_order import CLEANUP, POST, PRE, STAGE_IN, STAGE_OUT, STAGING_ROLES, staging_slot
from pilot.model.staging import Step, steps_cleanup, steps_in, steps_out
from pilot.scheduler.passes import Placed
from pilot.wire.messages import TaskEvent

log = structlog.get_logger("pilot.core")

#: A job waiting at an agent behind a busy core this long, while a core it could use is free, is taken
#: back (WITHDRAW) and placed again: no head-of-line blocking behind a task that turned out long.
RECLAIM_AFTER = 0.05


class Lifecycle(Part):
    def __init__(self, state: CoreState, *, planner: Planner) -> None:
        super().__init__(state)
        self.planner = planner

    # -- out ------------------------------------------------------------------------------------------

    def start(self, job: JobRecord, placed: Placed) -> None:
        """A job was placed: its stage-in order goes out, or its pre_launch order, or its ranks' orders."""
        run = job.run
        ranks, run.placement = placed
        run.ranks = ranks
        job.placements += 1
        run.taken = [True] * len(ranks)
        self.book.changed(job, placed=True)
        staging = job.request.staging
        if staging.stage_in:
            self.book.move(job, Phase.STAGE_IN)
            if job.state is JobState.QUEUED:  # (a restartable job run again stays ACTIVE)
                self.book.set_state(job, JobState.STAGE_IN, self.clock.wall)
            self._stage_in(job)
            return
        self._launch(job, staged=False)

    def _stage_in(self, job: JobRecord) -> bool:
        """Send the stage-in orders still to do, one per node of the job (every node that runs its
        processes gets its files before any of them starts); False when all are done.

        A MOVE takes its source away, so it can happen once: on a job of several nodes, the other nodes
        copy first, then the first node moves (two rounds, told apart by the results in hand, which
        the journal keeps)."""
        steps = steps_in(job.request.staging)
        nodes = job_nodes(job)
        results = job.run.results
        if staging_slot(STAGE_IN, 0) in results:
            return False
        if len(nodes) > 1 and any(s.action == "move" for s in steps):
            if staging_slot(STAGE_IN, 1) not in results:
                copies = [Step(s.source, s.target, "copy" if s.action == "move" else s.action) for s in steps]
                for i, node in enumerate(nodes[1:], start=1):
                    self._stage(job, node, staging_slot(STAGE_IN, i), "stage_in", copies)
                return True
            nodes = nodes[:1]
        for i, node in enumerate(nodes):
            self._stage(job, node, staging_slot(STAGE_IN, i), "stage_in", steps)
        return True

    def _launch(self, job: JobRecord, *, staged: bool) -> None:
        """Its pre_launch order goes out, or its ranks' orders. ``staged``: its files were staged in, so
        ranks behind a busy core wait for it at their agent, never taken back (nor staged again)."""
        d = job.description
        ranks = job.run.ranks
        plans = self.planner.ranks(job, environment=None)
        if d.pre_launch or self.planner.shares_output(job, plans):
            self.book.move(job, Phase.PRE_LAUNCH)
            order = self.planner.hook(job, slot=PRE, role="pre", script=d.pre_launch, truncate=True)
            order.cores = ranks[0].cores
            self.dispatch(job, PlannedProcess(ranks[0].node, order, []))
            return
        behind = ranks[0].behind
        self.book.move(job, Phase.BEHIND if behind and not staged else Phase.RANKS)
        for p in plans:
            p.order.after_cores = behind
            self.dispatch(job, p)

    def _start_ranks(self, job: JobRecord) -> None:
        self.book.move(job, Phase.RANKS)
        run = job.run
        for p in self.planner.ranks(job, environment=run.environment):
            p.order.truncate_output = False
            p.order.pre_unset = list(run.unset)
            p.order.walltime = self.planner.walltime_left(job)
            self.dispatch(job, p)

    def _stage(self, job: JobRecord, node: str, slot: int, role: str, steps: list[Step]) -> None:
        self.dispatch(job, self.planner.staging(job, node=node, slot=slot, role=role, steps=steps))

    def dispatch(self, job: JobRecord, plan: PlannedProcess) -> None:
        agent = self.nodes.agents.get(plan.node)
        job.run.add_process(plan.order.slot, plan)
        if agent is None or agent.state != "active":
            self.process_done(
                job, plan.order.slot, ProcessResult(plan.node, plan.order.role, message=f"node {plan.node} is gone")
            )
            return
        agent.processes.add((plan.order.job_id, plan.order.slot))
        self.book.changed(job)  # (its row journals its outstanding orders)
        if plan.order.role not in STAGING_ROLES and job.description.streams_output(
            default=self.config.pilot.stream_output
        ):
            plan.order.stream = True
        order = plan.order.to_wire()
        self.outbox.orders[plan.node].append(order)
        self.outbox.journal.process_dispatched(job.id, plan, order_wire=order)

    def kill_outstanding(self, job: JobRecord, *, reason: str) -> None:
        for slot, plan in job.run.processes.items():
            self.outbox.kills[plan.node][reason].append([plan.order.job_id, slot])

    def cancel(self, job: JobRecord, *, reason: str) -> None:
        if job.final or job.cancel_reason is not None:
            return
        job.cancel_reason = reason
        self.book.changed(job)
        if job.phase in (Phase.QUEUED, Phase.BLOCKED):
            self.book.end(job, JobState.CANCELED, message=reason)
        else:
            self.kill_outstanding(job, reason="canceled")

    def close(self, job: JobRecord) -> None:
        """Its allocation's walltime margin is reached: its processes are stopped now."""
        job.closing = True
        self.book.changed(job)
        self.kill_outstanding(job, reason="walltime")

    def reclaim(self) -> None:
        """Ask back jobs that have waited behind a busy core for ``RECLAIM_AFTER`` while a core they
        could use is free (the task ahead of them turned out long, or the stream's tail is uneven): one
        per free core, oldest first. An agent that already started one ignores the request. Called
        every flush while jobs wait behind cores: it looks at the nodes only once the oldest of them has
        waited that long (in a stream of short tasks that is rare), and then at as many nodes with a
        free core as the jobs it asks back need, not at every node."""
        behind = self.book.behind
        now = self.clock.mono
        if not behind or now - next(iter(behind.values())) < RECLAIM_AFTER or self.nodes.none_free():
            return
        spare = self.nodes.with_free_cores()
        free: dict[str, int] = {}  # the nodes with a free core looked at so far -> how many
        room = 0  # their free cores not yet given to a job asked back
        asked: list[tuple[JobRecord, int, PlannedProcess]] = []
        for job_id, since in behind.items():
            if now - since < RECLAIM_AFTER:
                break  # oldest first: the rest waited less
            job = self.book.jobs.get(job_id)
            if job is None or job.phase is not Phase.BEHIND or len(job.run.processes) != 1:
                continue
            (slot, plan) = next(iter(job.run.processes.items()))
            held = self.allocations.of_node(plan.node)
            if held is None:
                continue
            need = len(plan.order.cores)
            fit = any(n in held.nodes and c >= need for n, c in free.items())
            # Look at more nodes until one fits with room left, or none is left to look at: the same
            # answer a look at every node would give.
            while room <= 0 or not fit:
                more = next(spare, None)
                if more is None:
                    break
                name, count = more
                free[name] = count
                room += count
                fit = fit or (name in held.nodes and count >= need)
            if room <= 0:
                break
            if not fit:
                continue  # no core it could use is free in its own allocation
            asked.append((job, slot, plan))
            room -= need
        for job, slot, plan in asked:  # (moving a job changes ``behind``: not while iterating it)
            self.book.move(job, Phase.WITHDRAWING)
            self.outbox.withdraws[plan.node].append([plan.order.job_id, slot])

    def yield_to(self, priority: int, *, among: list[str]) -> None:
        """Ask back the orders waiting behind busy cores at agents (``among``: those sent before a job of
        ``priority`` was sent behind them or left waiting) whose priority is below it: they queue again,
        behind it, and keep their turn in their own priority. An agent that already started one ignores
        the request."""
        for job_id in among:
            job = self.book.jobs.get(job_id)
            if job is None or job.phase is not Phase.BEHIND or job.request.priority >= priority:
                continue
            if len(job.run.processes) != 1:
                continue
            (slot, plan) = next(iter(job.run.processes.items()))
            self.book.move(job, Phase.WITHDRAWING)
            self.outbox.withdraws[plan.node].append([plan.order.job_id, slot])

    # -- in -------------------------------------------------------------------------------------------

    def on_process_event(self, agent: AgentRecord, ev: TaskEvent) -> None:
        """One task event from an agent (decoded and checked by the wire)."""
        job_id, slot, kind, t, data = ev
        job = self.book.jobs.get(job_id if "~" not in job_id else job_id.partition("~")[0])
        plan = job.run.processes.get(slot) if job is not None else None
        if job is None or plan is None or plan.node != agent.name or plan.order.job_id != job_id:
            # A replay of an event already handled (after a restart or a re-register), or a process
            # this daemon gave up (node declared lost): nothing to do.
            log.debug("event for a process this node does not hold", node=agent.name, job=job_id, slot=slot, kind=kind)
            return
        run = job.run
        if kind == "started":
            pid = data.get("pid")
            if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
                plan.pid = pid
            if job.phase in (Phase.BEHIND, Phase.WITHDRAWING):
                self.book.move(job, Phase.RANKS)
            if run.started is None:
                run.started = t
                self.book.changed(job)
            if job.state is JobState.QUEUED or job.state is JobState.STAGE_IN:
                self.book.set_state(job, JobState.ACTIVE, t)
        elif kind == "failed":
            self.process_done(job, slot, ProcessResult(agent.name, plan.order.role, message=str(data.get("message"))))
        elif kind == "withdrawn":
            # Sent at our request, and authoritative: the order is gone from the agent (also when the
            # request came from before a daemon restart, replayed with the agent's REGISTER). Only an
            # order placed behind a busy core and not known to have started can be given back.
            if plan.order.after_cores and job.phase in (Phase.BEHIND, Phase.WITHDRAWING):
                self._withdrawn(job, slot)
            else:
                log.warning("agent gave back an order it could not have held unstarted", node=agent.name, job=job_id)
        elif kind == "exited":
            started = data.get("started")
            # (Its start came in the same batch as its exit. Exact types, as msgpack gives them: a bool is
            # neither, and ``isinstance(x, int | float)`` builds the union anew on every event.)
            if run.started is None and (type(started) is float or type(started) is int):
                run.started = float(started)
            if plan.order.role not in STAGING_ROLES:  # Delivered counts the processes' time only
                run.ended = max(run.ended or 0.0, t)
            code, sig, reason = data.get("exit_code"), data.get("signal"), data.get("reason")
            result = ProcessResult(
                agent.name,
                plan.order.role,
                code if type(code) is int else _opt_int(code),  # (an exact int, as msgpack gives, at once)
                sig if type(sig) is int or sig is None else _opt_int(sig),
                None,
                reason if reason is None or isinstance(reason, str) else None,
                data,
            )
            if data.get("spawned") is False:
                result.message = result.reason or "not started"
            if plan.order.role == "pre":
                env = data.get("environment")
                if isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
                    run.environment = env
                unset = data.get("unset")
                if isinstance(unset, list) and all(isinstance(k, str) for k in unset):
                    run.unset = unset
                self.outbox.journal.pre_launch_environment(job.id, run.environment, run.unset)
            self.process_done(job, slot, result)

    def process_done(self, job: JobRecord, slot: int, result: ProcessResult) -> None:
        run = job.run
        plan = run.pop_process(slot) if slot in run.processes else None
        if plan is None:
            return
        agent = self.nodes.agents.get(plan.node)
        if agent is not None:
            agent.processes.discard((plan.order.job_id, slot))
        self.book.result(job, slot, result)
        for i in plan.holds:
            self.nodes.release_rank(job, i)
        if not result.ok and job.cancel_reason is None and result.role != "post":
            self.kill_outstanding(job, reason=f"another process of job {job.id} failed")
        if run.processes:
            return
        go_on = job.cancel_reason is None and all(r.ok for r in run.results.values())
        phase = job.phase
        if phase is Phase.STAGE_IN and go_on:
            if not self._stage_in(job):
                self._launch(job, staged=True)
        elif phase is Phase.PRE_LAUNCH and go_on:
            self._start_ranks(job)
        elif phase is Phase.RANKS and go_on and job.description.post_launch:
            self.book.move(job, Phase.POST_LAUNCH)
            order = self.planner.hook(job, slot=POST, role="post", script=job.description.post_launch, truncate=False)
            self.dispatch(job, PlannedProcess(run.ranks[0].node, order, []))
        elif self._retries(job):
            self._requeue(job)
        elif phase is Phase.STAGE_OUT:
            self._clean_up(job)
        elif job.request.staging and phase is not Phase.STAGE_IN and phase is not Phase.CLEANUP:
            self._stage_out(job)  # (after a failed or canceled stage-in nothing of the job ran: no stage-out)
        else:
            self.finish(job)

    def _outcome(self, job: JobRecord) -> str:
        return outcome(job, walltime_margin=self.config.pilot.walltime_margin)[0].value

    def _stage_out(self, job: JobRecord) -> None:
        """Its processes are done: the stage-outs its outcome selects, then the cleanup (or the end).

        Stage-out runs on the job's first node only (where rank 0 and post_launch ran): a target is one
        path, so each file goes out once -- a job directory on a shared filesystem holds one copy that
        every node sees (staged out from each node, a MOVE would fail on all but one and a COPY would
        race the others to the same target)."""
        staging = job.request.staging
        outgoing = staging.outgoing(self._outcome(job)) if staging.stage_out else []
        if not outgoing:
            self._clean_up(job)
            return
        self.book.move(job, Phase.STAGE_OUT)
        self.book.set_state(job, JobState.STAGE_OUT, self.clock.wall)
        self._stage(job, job_nodes(job)[0], STAGE_OUT, "stage_out", steps_out(outgoing))

    def _clean_up(self, job: JobRecord) -> None:
        """The cleanup, when its flags select the outcome (a failed stage-out counts: the job failed), on
        every node of the job: each may hold its own copy of the paths (a node-local directory)."""
        staging = job.request.staging
        if not staging.cleans_up(self._outcome(job)):
            self.finish(job)
            return
        self.book.move(job, Phase.CLEANUP)
        self.book.set_state(job, JobState.CLEANUP, self.clock.wall)
        steps = steps_cleanup(staging)
        for i, node in enumerate(job_nodes(job)):
            self._stage(job, node, staging_slot(CLEANUP, i), "cleanup", steps)

    def finish(self, job: JobRecord) -> None:
        """The job's last process is done (or will never report): its final state, from its results."""
        self.nodes.release_all(job)
        staged_out = job.phase is Phase.STAGE_OUT or job.phase is Phase.CLEANUP
        self.book.move(job, Phase.DONE)
        state, exit_code, message = outcome(job, walltime_margin=self.config.pilot.walltime_margin)
        self.book.set_state(
            job,
            state,
            self.clock.wall if staged_out else job.run.ended or self.clock.wall,
            exit_code=exit_code,
            message=message,
            metadata=delivered(job, exit_code),
        )

    def _retries(self, job: JobRecord) -> bool:
        """A restartable job that lost a node (and was not canceled) runs again, up to its retry limit."""
        d = job.description
        return (
            d.restartable
            and job.run.number < d.retries
            and job.cancel_reason is None
            and not job.closing
            and not self.allocations.stopping
            and self.allocations.may_run_later(None, now=self.clock.wall)
            and any(r.reason == "lost" for r in job.run.results.values())
        )

    def _requeue(self, job: JobRecord) -> None:
        """Back to the queue for another attempt, placed afresh (the lost node is not usable). Its
        state stays ACTIVE: PSI/J has no way back to QUEUED, and for the user the job is still running."""
        lost = next(r for r in job.run.results.values() if r.reason == "lost")
        number = job.run.number + 1
        self._unplace(job, number=number)
        log.warning("job restarted after losing its node", job=job.id, attempt=number, node=lost.node)
        self.book.move(job, Phase.QUEUED)

    def _withdrawn(self, job: JobRecord, slot: int) -> None:
        """Its agent gave the order back unstarted: the job is placed afresh, ahead of the queue. Not an
        attempt (nothing ran); its state stays QUEUED."""
        plan = job.run.pop_process(slot)
        agent = self.nodes.agents.get(plan.node)
        if agent is not None:
            agent.processes.discard((plan.order.job_id, slot))
        self._unplace(job, number=job.run.number)
        if job.cancel_reason is not None:  # canceled meanwhile: it never ran
            self.book.end(job, JobState.CANCELED, message=job.cancel_reason)
            return
        self.book.move(job, Phase.QUEUED, front=True)

    def _unplace(self, job: JobRecord, *, number: int) -> None:
        """Give back what the attempt holds and start a new one (in the journal too): the job is to be
        placed afresh."""
        self.nodes.release_all(job)
        job.run = Attempt(number=number)
        self.book.forget_attempt(job)


def job_nodes(job: JobRecord) -> list[str]:
    """The nodes its ranks run on, the first rank's first: where its files are staged."""
    return list(dict.fromkeys(r.node for r in job.run.ranks))


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

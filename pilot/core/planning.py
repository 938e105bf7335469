"""From a placed job to process orders: each launcher plans its processes from the job's placement;
the pre_launch and post_launch scripts get an order of their own."""

from __future__ import annotations

from collections import defaultdict

from pilot.core.clock import Clock
from pilot.core.nodes import NodeBook
from pilot.jobs import JobRecord
from pilot.launchers import PlannedProcess, job_directory
from pilot.launchers.base import Launcher
from pilot.model.process_order import ProcessOrder
from pilot.model.staging import Step


class Planner:
    def __init__(self, *, launchers: dict[str, Launcher], nodes: NodeBook, clock: Clock) -> None:
        self.launchers = launchers
        self.nodes = nodes
        self.clock = clock

    def ranks(self, job: JobRecord, *, environment: dict[str, str] | None) -> list[PlannedProcess]:
        """The rank phase's processes, each task group's by its launcher, from the job's placement.
        ``environment``: what the pre_launch script set, if one ran."""
        run = job.run
        hosts = self.nodes.hostnames(job)
        placement = run.placement
        if placement is None:  # alike processes on slots: one group holding every rank
            plans = self._group(job, 0, None, None, hosts=hosts, environment=environment)
        else:
            members: dict[int, list[int]] = defaultdict(list)
            for i, t in enumerate(placement.tasks):
                members[t.group].append(i)
            tasks = [t.task for t in placement.tasks]
            plans = []
            for group, indices in sorted(members.items()):
                plans += self._group(job, group, indices, tasks, hosts=hosts, environment=environment)
        if len(plans) > 1:
            for p in plans:  # several processes share the job's files: truncated once, before any started
                p.order.truncate_output = False
        if job.placements > 1:  # the processes' job id is the placement's: tell them the job's
            for p in plans:
                p.order.rank_environment["PILOT_JOB_ID"] = job.id
        return plans

    def _group(
        self,
        job: JobRecord,
        group: int,
        indices: list[int] | None,
        tasks: list[int] | None,
        *,
        hosts: list[str],
        environment: dict[str, str] | None,
    ) -> list[PlannedProcess]:
        """One task group's processes. ``indices``: the job's ranks it holds (None: all of them), and
        ``tasks``: the task each rank of the job runs."""
        g = job.request.groups[group]
        ranks = list(job.run.ranks)
        if indices is not None:
            ranks = [ranks[i] for i in indices]
            hosts = [hosts[i] for i in indices]
        launches = None
        if g.labelled and tasks is not None and indices is not None:
            launches = [g.task(tasks[i]) for i in indices]
        plans = self.launchers[g.launcher].plan(
            job_id=job.proc_id,
            description=g.template.description,
            ranks=ranks,
            hosts=hosts,
            environment=environment,
            launches=launches if g.launcher == "multiple" else None,
        )
        if indices is not None:  # the group's rank numbers are the job's
            for p in plans:
                order = p.order
                if order.slot >= 0:
                    order.slot = indices[order.slot]
                    if "PILOT_RANK" in order.rank_environment:
                        order.rank_environment["PILOT_RANK"] = str(order.slot)
                p.holds = [indices[h] for h in p.holds]
        if g.labelled:
            for p in plans:
                env = p.order.rank_environment
                env["PILOT_TASK_GROUP"] = str(group)
                if launches is not None and tasks is not None and p.order.slot >= 0:
                    env["PILOT_TASK_ID"] = str(tasks[p.order.slot])
        return plans

    def shares_output(self, job: JobRecord, plans: list[PlannedProcess]) -> bool:
        """Several processes write one stdout/stderr file: it is truncated once, before any of them starts
        (unless the request appends: earlier output stays)."""
        d = job.description
        if len(plans) <= 1 or not (d.stdout_path or d.stderr_path):
            return False
        return job.request.groups[0].template.truncate

    def walltime_left(self, job: JobRecord) -> float | None:
        """JobAttributes.duration bounds the whole job (pre_launch, ranks, post_launch), not each process."""
        duration = job.description.duration
        if duration is None or job.run.started is None:
            return duration
        return max(0.001, duration - (self.clock.wall - job.run.started))

    def hook(self, job: JobRecord, *, slot: int, role: str, script: str | None, truncate: bool) -> ProcessOrder:
        """The order that runs a pre_launch or post_launch script (sourced by /bin/sh)."""
        d = job.description
        run = job.run
        return ProcessOrder(
            job_id=job.proc_id,
            slot=slot,
            role=role,
            executable="/bin/sh",
            environment=d.environment,
            pre_environment=run.environment or {},
            pre_unset=list(run.unset),
            inherit_environment=d.inherit_environment,
            directory=job_directory(d),
            stdout_path=d.stdout_path,
            stderr_path=d.stderr_path,
            truncate_output=truncate,
            walltime=self.walltime_left(job),
            rank_environment={"PILOT_JOB_ID": job.id, "PILOT_SIZE": str(len(run.ranks))},
            nodefile_hosts=self.nodes.hostnames(job),
            script=script,
        )

    def staging(self, job: JobRecord, *, node: str, slot: int, role: str, steps: list[Step]) -> PlannedProcess:
        """The order that has the agent of ``node`` stage the job's files there (no process, no slots)."""
        order = ProcessOrder(
            job_id=job.proc_id,
            slot=slot,
            role=role,
            executable="",
            directory=job_directory(job.description),
            truncate_output=False,
            rank_environment={"PILOT_JOB_ID": job.id},
            staging=[s.to_wire() for s in steps],
        )
        return PlannedProcess(node, order, [])

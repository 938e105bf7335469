"""From a placed job to process orders: each launcher plans its processes from the job's placement;
the pre_launch and post_launch scripts get an order of their own."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from pilot.core.clock import Clock
from pilot.core.nodes import NodeBook
from pilot.jobs import JobRecord
from pilot.launchers import PlannedProcess, job_directory
from pilot.launchers.base import Launcher, rank_order
from pilot.model.process_order import ProcessOrder
from pilot.sss_jobs import SssJob


class Planner:
    def __init__(self, *, launchers: dict[str, Launcher], nodes: NodeBook, clock: Clock) -> None:
        self.launchers = launchers
        self.nodes = nodes
        self.clock = clock

    def ranks(self, job: JobRecord, *, environment: dict[str, str] | None) -> list[PlannedProcess]:
        """The rank phase's processes. ``environment``: what the pre_launch script set, if one ran."""
        if job.sss is not None:
            plans = self._sss_ranks(job, job.sss, environment=environment)
        else:
            plans = self.launchers[job.description.launcher].plan(
                job_id=job.proc_id,
                description=job.description,
                ranks=job.run.ranks,
                hosts=self.nodes.hostnames(job),
                environment=environment,
            )
        if job.run.number:
            for p in plans:
                p.order.rank_environment["PILOT_JOB_ID"] = job.id
        return plans

    def _sss_ranks(self, job: JobRecord, sss: SssJob, *, environment: dict[str, str] | None) -> list[PlannedProcess]:
        """Each task group by its launcher: one process per task (each running its own Task element's
        executable, streams and limits), or one parallel launch; slots are the job's rank indices."""
        assert sss.placement is not None
        tasks = sss.placement.tasks
        hosts = self.nodes.hostnames(job)
        members: dict[int, list[int]] = defaultdict(list)
        for i, t in enumerate(tasks):
            members[t.group].append(i)
        plans: list[PlannedProcess] = []
        for group, indices in sorted(members.items()):
            g = sss.groups[group]
            group_hosts = [hosts[i] for i in indices]
            if g.launcher != "multiple":
                d = dataclasses.replace(
                    g.template.description,
                    launcher=g.launcher,
                    resources=dataclasses.replace(
                        sss.request.variants[sss.placement.variant][group].slot_request, process_count=len(indices)
                    ),
                )
                for p in self.launchers[g.launcher].plan(
                    job_id=job.proc_id,
                    description=d,
                    ranks=[job.run.ranks[i] for i in indices],
                    hosts=group_hosts,
                    environment=environment,
                ):
                    p.order.slot = indices[p.order.slot] if p.order.slot >= 0 else p.order.slot
                    p.holds = [indices[h] for h in p.holds]
                    p.order.rank_environment["PILOT_TASK_GROUP"] = str(group)
                    plans.append(p)
                continue
            for i in indices:
                t = tasks[i]
                launch = g.task(t.task)
                order = rank_order(
                    job_id=job.proc_id,
                    slot=i,
                    description=launch.description,
                    cores=t.cores,
                    gpus=t.gpus,
                    hosts=group_hosts,
                    environment=environment,
                    truncate=launch.truncate and len(tasks) == 1,
                )
                order.rank_environment["PILOT_TASK_GROUP"] = str(group)
                order.rank_environment["PILOT_TASK_ID"] = str(t.task)
                order.rlimits = [[r.resource, r.soft, r.hard] for r in launch.rlimits]
                plans.append(PlannedProcess(t.node, order, [i]))
        return plans

    def shares_output(self, job: JobRecord, plans: list[PlannedProcess]) -> bool:
        """Several processes write one stdout/stderr file: it is truncated once, before any of them starts."""
        d = job.description
        if len(plans) <= 1 or not (d.stdout_path or d.stderr_path):
            return False
        return job.sss is None or job.sss.groups[0].template.truncate  # redirectList="Append": earlier output stays

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

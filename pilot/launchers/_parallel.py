"""What the parallel launchers (``mpirun``, ``srun``) share: one launching process starts every rank.

The launching process runs on the job's first node and holds all the job's slots until it exits, which
is what PSI/J asks of a parallel launcher (pre_launch sourced once before it, post_launch once after all
ranks). The agent pins it to the job's cores and GPUs on that node, so ranks it forks there inherit them.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from pilot.launchers.base import Launcher, PlannedProcess, TaskLaunch, job_directory
from pilot.model.job_description import JobDescription
from pilot.model.process_order import ProcessOrder
from pilot.scheduler.placement import RankPlacement


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """The ranks a job has on one node, in the order the launcher numbers them."""

    node: str
    host: str
    ranks: list[RankPlacement]


def group_by_node(ranks: list[RankPlacement], hosts: list[str]) -> list[NodeGroup]:
    """Ranks grouped per node, nodes in order of first appearance, each node's ranks by lowest core, so
    that rank numbers run node by node (block layout) and local rank k has the k-th lowest cores."""
    order: dict[str, NodeGroup] = {}
    for rank, host in zip(ranks, hosts, strict=True):
        group = order.get(rank.node)
        if group is None:
            group = order[rank.node] = NodeGroup(rank.node, host, [])
        group.ranks.append(rank)
    for group in order.values():
        group.ranks.sort(key=lambda r: (min(r.cores) if r.cores else -1, r.cores))
    return list(order.values())


def launching_process(
    *,
    job_id: str,
    description: JobDescription,
    ranks: list[RankPlacement],
    hosts: list[str],
    environment: dict[str, str] | None,
    executable: str,
    arguments: list[str],
) -> list[PlannedProcess]:
    """The one process that starts every rank, on the first node, holding all the job's slots."""
    d = description
    first = ranks[0].node
    order = ProcessOrder(
        job_id=job_id,
        slot=0,
        role="rank",
        executable=executable,
        arguments=arguments,
        environment=d.environment,
        pre_environment=environment or {},
        inherit_environment=d.inherit_environment,
        directory=job_directory(d),
        stdin_path=d.stdin_path,
        stdout_path=d.stdout_path,
        stderr_path=d.stderr_path,
        truncate_output=True,
        cores=sorted(c for r in ranks if r.node == first for c in r.cores),
        gpus=sorted(g for r in ranks if r.node == first for g in r.gpus),
        walltime=d.duration,
        # No PILOT_RANK: the ranks get theirs from the parallel launcher (SLURM_PROCID, OMPI_COMM_WORLD_RANK).
        rank_environment={"PILOT_JOB_ID": job_id, "PILOT_SIZE": str(len(ranks))},
        nodefile_hosts=list(hosts),
    )
    return [PlannedProcess(first, order, list(range(len(ranks))))]


class ParallelLauncher(Launcher):
    """A launcher whose one launching process (``command`` with :meth:`arguments`) starts every rank."""

    command: str

    def plan(
        self,
        *,
        job_id: str,
        description: JobDescription,
        ranks: list[RankPlacement],
        hosts: list[str],
        environment: dict[str, str] | None,
        launches: Sequence[TaskLaunch] | None = None,
    ) -> list[PlannedProcess]:
        return launching_process(
            job_id=job_id,
            description=description,
            ranks=ranks,
            hosts=hosts,
            environment=environment,
            executable=self.command,
            arguments=self.arguments(description, ranks, hosts, environment),
        )

    @abstractmethod
    def arguments(
        self,
        description: JobDescription,
        ranks: list[RankPlacement],
        hosts: list[str],
        environment: dict[str, str] | None,
    ) -> list[str]:
        """The launching command's arguments, ending with the job's own command line."""

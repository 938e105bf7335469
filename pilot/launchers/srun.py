"""``srun``: one ``srun`` on the job's first node starts every rank as one Slurm step of the pilot's job.

The step is laid out exactly as the pilot placed the ranks: ``--distribution=arbitrary`` with the node of
each rank in ``--nodelist``, and ``--cpu-bind`` naming each local rank's cores. ``--overlap`` and
``--whole`` let the step use cpus the agents' step (and other tasks' steps) also hold: the pilot, not
Slurm, decides who owns which core. ``--jobid=${SLURM_JOB_ID}`` (expanded by the agent from the
environment it runs in) keeps srun inside the pilot's allocation even for a job that does not inherit
the environment, instead of queueing a new job.

When local rank k does not have the same cores on every node (Slurm's map is one list for all nodes),
or ranks hold GPUs, each rank is started through a tiny ``sh`` that pins it (``taskset``) and exports its
GPUs before ``exec``: the placement stays exact, at the price of one shell per rank.
"""

from __future__ import annotations

from typing import ClassVar

from pilot.launchers._parallel import NodeGroup, ParallelLauncher, group_by_node
from pilot.model.job_description import JobDescription
from pilot.scheduler.placement import RankPlacement

#: The variables that expose GPUs to a process (NVIDIA, AMD, Intel), as the agent sets them.
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")


class SrunLauncher(ParallelLauncher):
    needs_lrm: ClassVar[str | None] = "slurm"
    name: ClassVar[str] = "srun"

    def __init__(self, *, command: str = "srun", extra_args: tuple[str, ...] = ()) -> None:
        self.command = command
        self.extra_args = extra_args

    def arguments(
        self,
        description: JobDescription,
        ranks: list[RankPlacement],
        hosts: list[str],
        environment: dict[str, str] | None = None,
    ) -> list[str]:
        groups = group_by_node(ranks, hosts)
        layout = [g.node for g in groups for _ in g.ranks]
        cpus = max(1, len(ranks[0].cores))
        args = [
            "--jobid=${SLURM_JOB_ID}",
            "--overlap",
            "--whole",
            f"--nodes={len(groups)}",
            f"--ntasks={len(ranks)}",
            f"--cpus-per-task={cpus}",
            "--distribution=arbitrary",
            f"--nodelist={','.join(layout)}",
        ]
        bind = cpu_bind(groups)
        wrap = bind is None or any(r.gpus for r in ranks)
        args.append(f"--cpu-bind={bind or 'none'}")
        args += self.extra_args
        program = [description.executable, *description.arguments]
        if wrap:
            program = ["/bin/sh", "-c", rank_wrapper(groups, pin=bind is None), "pilot-rank", *program]
        return [*args, *program]


def cpu_bind(groups: list[NodeGroup]) -> str | None:
    """``map_cpu:``/``mask_cpu:`` for Slurm, or None when local rank k's cores differ between nodes."""
    table: dict[int, list[int]] = {}
    for g in groups:
        for k, rank in enumerate(g.ranks):
            cores = sorted(rank.cores)
            if table.setdefault(k, cores) != cores:
                return None
    if not table or not all(table.values()):
        return None
    per_local = [table[k] for k in sorted(table)]
    if all(len(c) == 1 for c in per_local):
        return "map_cpu:" + ",".join(str(c[0]) for c in per_local)
    return "mask_cpu:" + ",".join(hex(sum(1 << c for c in cores)) for cores in per_local)


def rank_wrapper(groups: list[NodeGroup], *, pin: bool) -> str:
    """The ``sh -c`` text that gives rank ``$SLURM_PROCID`` its own cores and GPUs, then execs the program."""
    cases = []
    procid = 0
    for g in groups:
        for rank in g.ranks:
            setup = []
            if pin and rank.cores:
                setup.append(f"c={','.join(map(str, sorted(rank.cores)))}")
            if rank.gpus:
                ids = ",".join(map(str, sorted(rank.gpus)))
                setup.append(" ".join(f"{v}={ids}" for v in GPU_VARIABLES) + " && export " + " ".join(GPU_VARIABLES))
            cases.append(f"{procid}) {'; '.join(setup) or ':'};;")
            procid += 1
    body = "c=; case $SLURM_PROCID in " + " ".join(cases) + " esac; "
    if pin:
        body += 'if [ -n "$c" ]; then exec taskset -c "$c" "$@"; fi; '
    return body + 'exec "$@"'

"""``mpirun``: one ``mpirun`` on the job's first node starts every rank on the nodes the pilot chose.

The host list comes from the placement, with each node's rank count as its slot count (``node1:2,node2:2``),
so that exactly the placed number of ranks lands on each node, filled node by node. Two flavours:

- ``openmpi``: ``mpirun -n N --host h1:n1,h2:n2 --map-by slot --bind-to none -x VAR...``. Open MPI's own
  binding is off because it would bind to cores the pilot gave to other tasks; ranks on the first node
  inherit the launching process's pinning to the job's cores there. Open MPI does not forward the
  environment over ssh, so every job variable is named with ``-x``. Inside Slurm, Open MPI starts its
  daemons with srun by itself.
- ``mpich`` (Hydra; Intel MPI and MVAPICH accept the same): ``mpiexec -n N -hosts h1:n1,h2:n2``; Hydra
  forwards the whole environment by default.

Hosts are the names agents report as their hostname, which is what mpirun resolves and, in a Slurm job,
what Open MPI matches against the allocation.
"""

from __future__ import annotations

from typing import ClassVar, Final

from pilot.launchers._parallel import ParallelLauncher, group_by_node
from pilot.model.job_description import JobDescription
from pilot.scheduler.placement import RankPlacement

FLAVORS: Final = ("openmpi", "mpich")

#: Variables that belong to the batch system or the MPI runtime of the launching node: never forwarded.
_LOCAL_PREFIXES: Final = ("SLURM_", "OMPI_", "PMIX_", "PMI_", "PBS_", "LSB_", "LSF_", "FLUX_", "SGE_", "BASH_FUNC_")
_LOCAL_NAMES: Final = frozenset({"_", "PWD", "OLDPWD", "SHLVL", "HOSTNAME", "PE_HOSTFILE", "JOB_ID"})


class MpirunLauncher(ParallelLauncher):
    name: ClassVar[str] = "mpirun"

    def __init__(
        self, *, flavor: str = "openmpi", command: str | None = None, extra_args: tuple[str, ...] = ()
    ) -> None:
        if flavor not in FLAVORS:
            raise ValueError(f"mpirun flavor {flavor!r}; allowed: {', '.join(FLAVORS)}")
        self.flavor = flavor
        self.command = command or ("mpirun" if flavor == "openmpi" else "mpiexec")
        self.extra_args = extra_args

    def arguments(
        self,
        description: JobDescription,
        ranks: list[RankPlacement],
        hosts: list[str],
        environment: dict[str, str] | None,
    ) -> list[str]:
        counts: dict[str, int] = {}
        for group in group_by_node(ranks, hosts):
            # Two pilot nodes can share a hostname (virtual nodes of the local LRM): their slots add up.
            counts[group.host] = counts.get(group.host, 0) + len(group.ranks)
        host_list = ",".join(f"{h}:{n}" for h, n in counts.items())
        program = [description.executable, *description.arguments]
        if self.flavor == "mpich":
            return ["-n", str(len(ranks)), "-hosts", host_list, *self.extra_args, *program]
        args = ["-n", str(len(ranks)), "--host", host_list, "--map-by", "slot", "--bind-to", "none"]
        # Inside a batch allocation Open MPI counts slots as the batch system launched the agents (one
        # task per node) and refuses a second rank on a node; the pilot has placed and counted the ranks
        # on cores it owns, so that count must not limit them.
        args.append("--oversubscribe")
        for name in forwarded(description, environment):
            args += ["-x", name]
        return [*args, *self.extra_args, *program]


def forwarded(description: JobDescription, environment: dict[str, str] | None) -> list[str]:
    """The variables Open MPI must carry to remote ranks: the job's own, the pilot's, and (after a
    pre_launch) whatever that script set, minus what belongs to the launching node."""
    names = set(description.environment) | {"PILOT_JOB_ID", "PILOT_SIZE", "PSIJ_NODEFILE"}
    if environment is not None:
        names |= {k for k in environment if not k.startswith(_LOCAL_PREFIXES) and k not in _LOCAL_NAMES}
    return sorted(names)

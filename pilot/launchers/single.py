"""``single``: one process, holding every slot of the job on the first node it was given."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pilot.launchers.base import Launcher, PlannedProcess, TaskLaunch, rank_order
from pilot.model.job_description import JobDescription
from pilot.scheduler.placement import RankPlacement


class SingleLauncher(Launcher):
    name: ClassVar[str] = "single"

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
        first = ranks[0].node
        if len(ranks) == 1:  # the common case: one rank's slots, without two generators to walk them
            cores, gpus = sorted(ranks[0].cores), sorted(ranks[0].gpus)
        else:
            cores = sorted(c for r in ranks if r.node == first for c in r.cores)
            gpus = sorted(g for r in ranks if r.node == first for g in r.gpus)
        order = rank_order(
            job_id=job_id,
            slot=0,
            description=description,
            cores=cores,
            gpus=gpus,
            hosts=hosts,
            environment=environment,
            truncate=True,
        )
        return [PlannedProcess(first, order, list(range(len(ranks))))]

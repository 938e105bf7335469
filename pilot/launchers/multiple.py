"""``multiple``: one process per rank, each on its own slots, all writing to the same output files
(or, when the ranks are tasks with launches of their own, each running and writing what its task says)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pilot.launchers.base import Launcher, PlannedProcess, TaskLaunch, rank_order
from pilot.model.job_description import JobDescription
from pilot.scheduler.placement import RankPlacement


class MultipleLauncher(Launcher):
    name: ClassVar[str] = "multiple"

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
        # One rank truncates its own output; several share the files, which the prepare phase
        # truncated once before any rank started.
        alone = len(ranks) == 1
        if launches is None:
            return [
                PlannedProcess(
                    rank.node,
                    rank_order(
                        job_id=job_id,
                        slot=i,
                        description=description,
                        cores=rank.cores,
                        gpus=rank.gpus,
                        hosts=hosts,
                        environment=environment,
                        truncate=alone,
                    ),
                    [i],
                )
                for i, rank in enumerate(ranks)
            ]
        plans = []
        for i, (rank, launch) in enumerate(zip(ranks, launches, strict=True)):
            order = rank_order(
                job_id=job_id,
                slot=i,
                description=launch.description,
                cores=rank.cores,
                gpus=rank.gpus,
                hosts=hosts,
                environment=environment,
                truncate=alone and launch.truncate,
            )
            order.rlimits = [[r.resource, r.soft, r.hard] for r in launch.rlimits]
            plans.append(PlannedProcess(rank.node, order, [i]))
        return plans

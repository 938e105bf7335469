"""``multiple``: one process per rank, each on its own slots, all writing to the same output files."""

from __future__ import annotations

from typing import ClassVar

from pilot.launchers.base import Launcher, PlannedProcess, rank_order
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
    ) -> list[PlannedProcess]:
        # One rank truncates its own output; several share the files, which the prepare phase
        # truncated once before any rank started.
        truncate = len(ranks) == 1
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
                    truncate=truncate,
                ),
                [i],
            )
            for i, rank in enumerate(ranks)
        ]

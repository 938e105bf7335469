"""pre_launch hands the ranks what it changed, applied over each node's own environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import client as psij
from agent.environment import build, changes


def test_changes_are_what_the_script_set_and_unset() -> None:
    before = {"A": "1", "B": "2", "PWD": "/x", "SHLVL": "1"}
    after = {"A": "1", "B": "3", "C": "4", "PWD": "/y", "SHLVL": "2", "_": "/bin/env"}
    assert changes(before, {k: v for k, v in after.items()}) == ({"B": "3", "C": "4"}, [])
    assert changes({"A": "1", "GONE": "x"}, {"A": "1"}) == ({}, ["GONE"])
    env = build(
        inherit=True,
        base={"NODE": "n2", "GONE": "x"},
        job={"J": "${NODE}"},
        extra={"PILOT_RANK": "1"},
        pre={"C": "4", "PILOT_RANK": "0"},
        pre_unset=["GONE"],
    )
    assert env == {"NODE": "n2", "J": "n2", "C": "4", "PILOT_RANK": "1"}


def test_pre_launch_exports_and_unsets_reach_ranks_on_every_node(start_pilot: Any, tmp_path: Path) -> None:
    pilot = start_pilot('[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 2\n')
    ex = pilot.executor()
    pre = tmp_path / "pre.sh"
    pre.write_text("export FROM_PRE=hello\nunset DROP_ME\n")
    out = tmp_path / "out"
    job = psij.Job(
        psij.JobSpec(
            executable="/bin/sh",
            arguments=["-c", 'echo "$PILOT_RANK ${FROM_PRE:-none} ${DROP_ME:-unset}" > "$0.$PILOT_RANK"', str(out)],
            environment={"DROP_ME": "still-here"},
            pre_launch=pre,
            launcher="multiple",
            resources=psij.ResourceSpecV1(node_count=2, processes_per_node=1),
        )
    )
    ex.submit(job)
    status = job.wait(timeout=60)
    assert status is not None and status.state is psij.JobState.COMPLETED, status
    assert sorted((status.metadata or {})["nodes"]) == ["local-0", "local-1"]
    lines = sorted(Path(f"{out}.{r}").read_text().strip() for r in (0, 1))
    assert lines == ["0 hello unset", "1 hello unset"]

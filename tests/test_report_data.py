"""What 'pilot report' draws, worked out from job rows (pure: in process)."""

from __future__ import annotations

from typing import Any

import pytest

from pilot import report_data as rd

pytestmark = pytest.mark.timeout(30)


def row(i: int, submitted: float, started: float | None, ended: float | None, **more: Any) -> dict[str, Any]:
    return {
        "id": str(i),
        "state": "COMPLETED",
        "submitted": submitted,
        "started": started,
        "ended": ended,
        "nodes": ["n1"],
        "cores": 1,
    } | more


def test_busy_cores_per_node_and_queue_depth() -> None:
    jobs = rd.jobs(
        [
            row(1, 0, 1, 5, cores=2),
            row(2, 0, 2, 4, nodes=["n1", "n2"], cores=4),  # shared out: 2 cores on each node
            row(3, 0, 6, None),  # still running at 'now'
            row(4, 3, None, None),  # still waiting at 'now'
        ]
    )
    busy = rd.busy_cores(jobs, now=10)
    assert busy["n1"] == ([1, 2, 4, 5, 6, 10], [2, 4, 2, 0, 1, 0])
    assert busy["n2"] == ([2, 4], [2, 0])
    assert rd.queue_depth(jobs, now=10) == ([0, 1, 2, 3, 6, 10], [3, 2, 1, 2, 1, 0])


def test_ends_per_second_and_summary() -> None:
    jobs = rd.jobs(
        [row(i, 0, 0, 1.5 + i % 2, delivered={"user_cpu_time": 0.5, "wall_duration": 1.0}) for i in range(6)]
    )
    starts, rates = rd.ends_per_second(jobs, bins=60)
    assert starts == [0, 1.25] and rates == [0, 4.8]  # spans of a second at least, the last end in the last
    assert rd.ends_per_second(jobs, bins=1) == ([0], [6 / 2.5])
    s = rd.summary(jobs)
    assert s["jobs"] == 6 and s["states"] == {"COMPLETED": 6} and s["span_seconds"] == 2.5
    assert jobs[0].cores_used == 0.5 and s["core_hours_used"] == pytest.approx(3 / 3600)


def test_rows_that_make_no_sense_are_left_out_of_what_they_cannot_join() -> None:
    jobs = rd.jobs(
        [
            {"id": 1, "state": "COMPLETED", "submitted": 0},  # id not a string
            {"id": "2", "state": "FAILED"},  # no submit time
            row(3, 0, 5, 2, cores=True, memory=-1, exit_code="x", delivered=[1]),  # ends before it starts
            row(4, float("nan"), 1, 2),
        ]
    )
    assert [j.id for j in jobs] == ["3"]
    j = jobs[0]
    assert (j.ended, j.cores, j.memory, j.exit_code, j.wall) == (None, 0, 0, None, 0.0)
    assert rd.ends_per_second(jobs) == ([], [])

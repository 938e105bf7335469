"""The shortest real path: pilot up, one job through the client, COMPLETED with Delivered."""

from __future__ import annotations

import client as psij


def test_one_job_completes_with_delivered(start_pilot) -> None:  # type: ignore[no-untyped-def]
    pilot = start_pilot()
    ex = pilot.executor()
    job = psij.Job(psij.JobSpec(executable="/bin/sh", arguments=["-c", "exit 0"]))
    ex.submit(job)
    assert job.native_id is not None
    status = job.wait(timeout=30)
    assert status is not None and status.state is psij.JobState.COMPLETED, status
    assert status.exit_code == 0
    md = status.metadata or {}
    assert md["nodes"] == ["local-0"]
    assert md["processors"] == 1
    assert md["wall_duration"] > 0

"""File staging (PSI/J's stage_in, stage_out, cleanup) on real pilots: real agents, real processes."""

from __future__ import annotations

from pathlib import Path

import pytest

import client as psij
from client.staging import StageIn, StageOut


def test_a_staging_spec_the_pilot_cannot_do_is_refused_not_ignored(start_pilot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pilot = start_pilot()
    ex = pilot.executor()
    for field, value in (
        ("stage_in", {StageIn(tmp_path / "a", "a")}),
        ("stage_out", {StageOut("a", tmp_path / "b")}),
        ("cleanup", {"a"}),
    ):
        spec = psij.JobSpec(executable="/bin/true")
        setattr(spec, field, value)
        job = psij.Job(spec)
        with pytest.raises(psij.InvalidJobException, match=f"JobSpec.{field}"):
            ex.submit(job)
        assert job.status.state is psij.JobState.NEW

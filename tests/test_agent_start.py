"""Agents that cannot start or never register: said clearly, and the jobs held end FAILED, never hang."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import client as psij


def _config(python: Path | str, timeout: float = 120) -> str:
    return (
        f'[pilot]\nagent_start_timeout = {timeout}\n[allocation]\nlrm = "local"\nnodes = 2\nagent_python = "{python}"\n'
    )


def test_agents_that_die_at_start_fail_the_jobs_with_their_exit_and_log(start_pilot: Any, tmp_path: Path) -> None:
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\necho 'no such module: agent' >&2\nexit 3\n")
    broken.chmod(0o755)
    pilot = start_pilot(_config(broken))
    ex = pilot.executor()
    job = psij.Job(psij.JobSpec("/bin/true"))
    # The agents die at once: the job is accepted and then fails, or, when the daemon saw them die
    # before the submit came, refused. Either way the user gets the agents' exit and log there.
    try:
        ex.submit(job)
    except psij.SubmitException as exc:
        assert exc.transient and "last allocation has ended" in str(exc), exc
        msg = str(exc)
    else:
        status = job.wait(timeout=20)
        assert status is not None and status.state is psij.JobState.FAILED, status
        msg = status.message or ""
    assert "every agent exited" in msg and "exited with 3" in msg and "no such module: agent" in msg, msg
    st = ex.pilot_status()["allocation"]
    assert st["state"] == "failed" and "exited with 3" in st["message"]
    # Submitted now, it is refused with the same words (no need to go to 'pilot status' for them).
    with pytest.raises(psij.SubmitException) as refused:
        ex.submit(psij.Job(psij.JobSpec("/bin/true")))
    assert "exited with 3" in str(refused.value) and "no such module: agent" in str(refused.value), refused.value


def test_agents_that_never_register_are_reported_and_jobs_fail(start_pilot: Any, tmp_path: Path) -> None:
    silent = tmp_path / "silent-python"
    silent.write_text("#!/bin/sh\nexec sleep 60\n")
    silent.chmod(0o755)
    pilot = start_pilot(_config(silent, timeout=4))
    ex = pilot.executor()
    assert ex.pilot_status()["allocation"]["state"] == "starting"
    job = psij.Job(psij.JobSpec("/bin/true"))
    try:  # accepted and then failed; or refused, when the 4 s were over first (a loaded machine)
        ex.submit(job)
    except psij.SubmitException as exc:
        msg = str(exc)
    else:
        status = job.wait(timeout=20)
        assert status is not None and status.state is psij.JobState.FAILED, status
        msg = status.message or ""
    assert "2 of 2 agents did not register within 4 s" in msg, msg
    assert str(pilot.rundir.agents_dir) in msg

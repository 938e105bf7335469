"""Waiting helpers shared by the tests that drive a live pilot."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import client as psij


def wait_for(predicate: Callable[[], Any], timeout: float = 20, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy (the events polled have no push channel)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def agents_active(ex: psij.JobExecutor, n: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        st = ex.pilot_status()
        nodes = st["nodes"]
        return st if len(nodes) == n and all(x["agent"] == "active" for x in nodes) else None

    st: dict[str, Any] = wait_for(ready, what=f"{n} agents to register")
    return st


def reach(job: psij.Job, state: psij.JobState, timeout: float = 20) -> psij.JobStatus:
    """Wait until ``job`` is in ``state`` (or past it) and check it is exactly there."""
    status = job.wait(timeout=timeout, target_states=[state])
    assert status is not None and status.state is state, (job, status)
    return status


def ends(job: psij.Job, state: psij.JobState, timeout: float = 20) -> psij.JobStatus:
    status = job.wait(timeout=timeout)
    assert status is not None and status.state is state, (job, status)
    return status

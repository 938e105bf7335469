"""Waiting helpers shared by the tests that drive a live pilot."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

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


def read_pid(path: Path, timeout: float = 10.0) -> psutil.Process:
    """The process whose pid a task wrote to ``path`` (once the write is complete)."""
    wait_for(lambda: path.exists() and path.read_text().endswith("\n"), timeout, f"pid file {path}")
    return psutil.Process(int(path.read_text()))


def gone(proc: psutil.Process) -> bool:
    """The process has exited (a zombie not yet reaped by its parent counts as exited)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def list_when_back(ex: psij.JobExecutor, timeout: float = 20) -> list[str]:
    """``list()``, retried while it fails transiently: right after a daemon restart the executor's
    connection may still be reconnecting."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ex.list()
        except psij.SubmitException as exc:
            if not exc.transient or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def callbacks_settled(states: Callable[[], Sequence[psij.JobState]], what: str) -> None:
    """Until the states a status callback recorded end with a final one. ``Job.wait()`` returns once the
    state is set, before that state's callbacks run (as psij-python's ``Job._set_status`` does): a test
    reading what a callback recorded right after ``wait()`` must wait for this first."""
    wait_for(lambda: (got := states()) and got[-1].final, 10, f"the callbacks of {what} to see its final state")


def in_a_thread(call: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    """Start ``call`` in a thread; what it raises goes into ``errors`` for the caller's asserts."""

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # recorded for the caller's asserts
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t

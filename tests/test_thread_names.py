"""The pilot's threads carry their names at the OS level (pilot/thread_names.py): real processes read
through /proc, as top -H, perf and bench.threads read them."""

from __future__ import annotations

import os
import threading

import psutil
import pytest

import client as psij
from pilot.thread_names import LIMIT, name_os_thread

pytestmark = pytest.mark.timeout(120)


def _names(pid: int) -> set[str]:
    names = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names.add(f.read().strip())
        except OSError:
            continue  # (the thread ended meanwhile)
    return names


def test_a_thread_is_named_and_long_names_are_cut() -> None:
    seen: list[str] = []

    def named() -> None:
        name_os_thread()
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            seen.append(f.read().strip())
        name_os_thread("pilot-a-name-longer-than-the-kernel-keeps")
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            seen.append(f.read().strip())

    t = threading.Thread(target=named, name="pilot-test-1")
    t.start()
    t.join()
    assert seen == ["pilot-test-1", "pilot-a-name-longer-than-the-kernel-keeps"[:LIMIT]]


def test_agent_and_client_threads_are_named(start_pilot) -> None:  # type: ignore[no-untyped-def]
    pilot = start_pilot()
    ex = pilot.executor()
    job = psij.Job(psij.JobSpec(executable="/bin/true"))
    ex.submit(job)
    status = job.wait(timeout=60)
    assert status is not None and status.state is psij.JobState.COMPLETED, status
    agents = [p for p in psutil.Process(pilot.pid).children() if "agent" in " ".join(p.cmdline())]
    assert len(agents) == 1, agents
    names = _names(agents[0].pid)
    # The loop, the thread that ran the job's order (a chain or a spawner, by the machine), the trees.
    assert {"pilot-loop", "pilot-trees"} <= names, names
    assert any(n.startswith(("pilot-chain-", "pilot-spawner")) for n in names), names
    # This process is the client: its two workers (reader and deliverer, in turn).
    assert {"pilot-client-1", "pilot-client-2"} <= _names(os.getpid())

"""Priorities on a real pilot (issue 20): PSI/J ``pilot.priority`` and SSS <Priority> order the queue,
and orders already waiting behind a busy core at the agent give way to higher ones."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Pilot
from pilot_waits import agents_active, ends, wait_for

import client as psij

ONE_CORE = """
[allocation]
lrm = "local"
nodes = 1
cores_per_node = 1
"""


def gated(name: str, order: Path, gate: Path, priority: int | None = None) -> psij.Job:
    """A job that writes its name to ``order`` when it starts, then runs until ``gate`` exists."""
    custom = {} if priority is None else {"pilot.priority": priority}
    return psij.Job(
        psij.JobSpec(
            executable="/bin/sh",
            arguments=["-c", f"echo {name} >> {order}; while [ ! -e {gate} ]; do sleep 0.02; done"],
            attributes=psij.JobAttributes(custom_attributes=custom),
        )
    )


@pytest.mark.timeout(120)
def test_ten_high_priority_jobs_start_before_every_low_one_not_started(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    """100 low-priority jobs queued (one running, 16 waiting behind its core at the agent, the rest in
    the pilot's queue), then 10 high-priority ones: the high ones start next, in their order, before
    every low one that had not started; the low ones keep their own order."""
    p = start_pilot(ONE_CORE)
    ex = p.executor()
    agents_active(ex, 1)
    order, gate = tmp_path / "order", tmp_path / "gate"
    low = [gated(f"low{i}", order, gate) for i in range(100)]
    ex.submit_all(low)
    wait_for(lambda: order.exists() and order.read_text() == "low0\n", what="the first low job to start")
    high = [gated(f"high{i}", order, gate, priority=10) for i in range(10)]
    ex.submit_all(high)
    # Before the gate opens, every high job is at the agent (behind the busy core): the low ones that
    # waited there were taken back.
    wait_for(
        lambda: all(any("starts there as soon as" in r for r in ex.explain(j)) for j in high),
        what="the high jobs to be placed behind the busy core",
    )
    gate.touch()
    for job in low + high:
        ends(job, psij.JobState.COMPLETED, timeout=60)
    started = order.read_text().split()
    assert started == ["low0", *(f"high{i}" for i in range(10)), *(f"low{i}" for i in range(1, 100))]


@pytest.mark.timeout(60)
def test_sss_priority_and_a_bad_psij_priority(start_pilot: Callable[..., Pilot], tmp_path: Path) -> None:
    p = start_pilot(ONE_CORE)
    ex = p.executor()
    agents_active(ex, 1)
    order, gate = tmp_path / "order", tmp_path / "gate"
    first = gated("first", order, gate)
    ex.submit(first)
    wait_for(lambda: order.exists(), what="the first job to start")
    plain = gated("plain", order, gate)
    ex.submit(plain)
    script = tmp_path / "urgent.sh"
    script.write_text(f"#!/bin/sh\necho urgent >> {order}\n")
    script.chmod(0o755)
    (urgent,) = ex.submit_sss(f"<Job><Executable>{script}</Executable><Priority>5</Priority></Job>")
    wait_for(lambda: any("of higher priority" in r for r in ex.explain(plain)), what="explain to name the priority")
    gate.touch()
    for job in (first, plain, urgent):
        ends(job, psij.JobState.COMPLETED, timeout=30)
    assert order.read_text().split() == ["first", "urgent", "plain"]
    bad = gated("bad", order, gate, priority=None)
    bad.spec.attributes.custom_attributes = {"pilot.priority": "urgent"}
    with pytest.raises(psij.InvalidJobException, match=r"custom_attributes\['pilot.priority'\] must be a whole number"):
        ex.submit(bad)

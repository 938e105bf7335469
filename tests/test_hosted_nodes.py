"""Many virtual nodes in one agent process (null launches, ``nodes_per_agent``), end to end: they
register in batches (one REGISTER for many nodes) and send one heartbeat per process, yet each node
is still its own agent -- orders per node, and a node whose heartbeats stop is lost alone.

The node that goes silent is the only one of its agent process (50 nodes, 49 per process): SIGSTOP
freezes it, as a hung node; the 49 nodes of the other process are kept alive by their combined
heartbeat alone, over several agent timeouts. (A node left out of a combined heartbeat whose process
still runs is tested in process: tests/core/test_core_hosted.py.)"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import Pilot
from pilot_waits import agents_active, wait_for

import client as psij

pytestmark = pytest.mark.timeout(120)

NODES = 50
CONFIG = f"""
[pilot]
heartbeat_interval = 0.5
agent_timeout = 3
[allocation]
lrm = "local"
nodes = {NODES}
cores_per_node = 2
launch = "null"
null_duration = 600
nodes_per_agent = 49
"""


def hosted_nodes(p: Pilot) -> dict[int, list[str]]:
    """Each agent process's pid -> the names of the nodes it hosts (from its specs file)."""
    out = {}
    for proc in psutil.Process(p.pid).children():
        env = proc.environ()
        if "PILOT_NODE_SPECS_FILE" in env:
            out[proc.pid] = [spec["name"] for spec in json.loads(Path(env["PILOT_NODE_SPECS_FILE"]).read_text())]
    return out


def batches(p: Pilot) -> list[int]:
    """The number of nodes each batched REGISTER carried, from the daemon's log."""
    sizes = []
    for line in p.rundir.log_file.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == "nodes registered in one batch":
            sizes.append(int(entry["nodes"]))
    return sizes


def test_hosted_nodes_register_in_batches_and_a_silent_node_is_lost_alone(start_pilot: Callable[..., Pilot]) -> None:
    p = start_pilot(CONFIG)
    ex = p.executor()
    agents_active(ex, NODES)
    hosts = hosted_nodes(p)
    assert sorted(len(names) for names in hosts.values()) == [1, 49], hosts
    sizes = batches(p)
    assert sizes and max(sizes) > 1, f"no REGISTER carried several nodes: {sizes}"
    (lone_pid,) = [pid for pid, names in hosts.items() if len(names) == 1]
    (lone,) = hosts[lone_pid]

    jobs = [psij.Job(psij.JobSpec(executable="/bin/true")) for _ in range(2 * NODES)]  # every core busy
    ex.submit_all(jobs)
    for job in jobs:
        status = job.wait(timeout=60, target_states=[psij.JobState.ACTIVE])
        assert status is not None and status.state is psij.JobState.ACTIVE, (job, status)
    try:
        os.kill(lone_pid, signal.SIGSTOP)  # the node hangs: no heartbeat, no reply, its process kept

        def failed() -> list[psij.Job]:
            return [j for j in jobs if j.status.state is psij.JobState.FAILED]

        wait_for(lambda: len(failed()) == 2 or None, 30, f"the two jobs on {lone} to fail")
        for job in failed():
            assert job.status.message is not None and f"node {lone} lost" in job.status.message, job.status
        states = {n["name"]: n["agent"] for n in ex.pilot_status()["nodes"]}
        assert states[lone] == "lost"
        assert sorted({s for n, s in states.items() if n != lone}) == ["active"]
        time.sleep(3 * 3)  # three more agent timeouts: the other 49 live on their process's one heartbeat
        states = {n["name"]: n["agent"] for n in ex.pilot_status()["nodes"]}
        assert sorted(n for n, s in states.items() if s != "active") == [lone]
        assert sum(j.status.state is psij.JobState.ACTIVE for j in jobs) == 2 * NODES - 2
    finally:
        try:
            os.kill(lone_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

"""JRDL resource preferences end to end (issue 22, item 8) on a real local pilot of three virtual nodes:
placement prefers the node with the fastest processor clock while it has room and goes to the next best
when it has not; a clockSpeed minimum runs only where the clock meets it; a requirement on the nodes'
load (minFreeCPU, processorLoad) is accepted and waits for the load, and is refused only when no node
could meet it even idle. Each task records the node it ran on; the client's 'pilot show' must agree."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Pilot
from pilot_waits import wait_for

pytestmark = pytest.mark.timeout(180)

CORES = 2
#: Clocks the site config gives the nodes (a configured value may only lower what an agent reports,
#: so these stay below any real processor's): local-1 is the fastest, then local-2, then local-0.
CLOCKS = {"local-0": 100, "local-1": 300, "local-2": 200}
CONFIG = f"""
[pilot]
heartbeat_interval = 0.5

[allocation]
lrm = "local"
nodes = 3
cores_per_node = {CORES}
""" + "".join(f'\n[nodes."{n}"]\nattributes = {{ clock_mhz = {mhz} }}\n' for n, mhz in CLOCKS.items())

#: Records its node (as the agent told it) in <work>/<name>.json, then holds its core until <work>/go exists.
HOLD = f"""#!{sys.executable}
import json, os, sys, time
work, name = sys.argv[1], sys.argv[2]
with open(os.path.join(work, name + ".json"), "w") as f:
    json.dump({{"node": os.environ.get("PILOT_NODE"), "job": os.environ.get("PILOT_JOB_ID")}}, f)
deadline = time.monotonic() + 100
while not os.path.exists(os.path.join(work, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


@pytest.fixture
def pilot(start_pilot: Callable[..., Pilot]) -> Pilot:
    p = start_pilot(CONFIG, name="jrdlbest")
    wait_for(lambda: p.cli("nodes").stdout.count("clock_mhz") == 3, timeout=30, what="3 nodes' clocks")
    wait_for(lambda: p.cli("nodes").stdout.count("free_proc") == 3, timeout=30, what="3 nodes' load values")
    return p


@pytest.fixture
def work(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    (d / "hold.py").write_text(HOLD)
    (d / "hold.py").chmod(0o755)
    return d


def s(value: str) -> str:
    return f'<stringElement value="{value}"/>'


def job(work: Path, name: str, resource: str = "") -> str:
    exe = f"<executable><path>{s(str(work / 'hold.py'))}</path></executable>"
    args = (
        f"<arguments><stringArray><string>{s(str(work))}</string><string>{s(name)}</string></stringArray></arguments>"
    )
    return f"<job>{exe}{args}" + (f"<resource>{resource}</resource>" if resource else "") + "</job>"


def submit(p: Pilot, file: Path, *jobs: str) -> list[str]:
    file.write_text(textwrap.dedent("<jrdl>" + "".join(jobs) + "</jrdl>"))
    proc = p.cli("submit", str(file), check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def ran_on(work: Path, name: str) -> str:
    rec = wait_for(lambda: (work / f"{name}.json").exists() and (work / f"{name}.json").read_text(), what=name)
    node = json.loads(rec)["node"]
    assert isinstance(node, str)
    return node


def shown_nodes(p: Pilot, job_id: str) -> str:
    m = re.search(r"node\(s\):\s+([^;]+);", p.cli("show", job_id).stdout)
    assert m, p.cli("show", job_id).stdout
    return m.group(1).strip()


def state(p: Pilot, job_id: str) -> str:
    m = re.search(r"<State>(\w+)</State>", p.cli("show", job_id, "--xml").stdout)
    return m.group(1) if m else ""


def clock(mhz: int) -> str:
    return f'<processor><clockSpeed><integer value="{mhz}"/></clockSpeed></processor>'


def test_placement_prefers_the_fastest_clock_while_it_has_room(pilot: Pilot, work: Path) -> None:
    names = [f"j{i}" for i in range(5)]
    ids = submit(pilot, work / "best.jrdl", *(job(work, n) for n in names))
    nodes = [ran_on(work, n) for n in names]
    # local-1 (300 MHz) takes the first two, local-2 (200 MHz) the next two, local-0 (100 MHz) the last.
    assert nodes == ["local-1", "local-1", "local-2", "local-2", "local-0"]
    assert [shown_nodes(pilot, i) for i in ids] == nodes  # the client reports where each ran
    # A clock minimum only local-1 meets waits while local-1 is full: explain names the others' clocks.
    (fast,) = submit(pilot, work / "fast.jrdl", job(work, "fast", clock(250)))
    why = pilot.cli("explain", fast).stdout
    assert "clock_mhz>=250 does not hold: its clock_mhz is 200: local-2" in why, why
    assert "clock_mhz>=250 does not hold: its clock_mhz is 100: local-0" in why, why
    (work / "go").write_text("")
    assert ran_on(work, "fast") == "local-1"
    for i in [*ids, fast]:
        wait_for(lambda i=i: state(pilot, i) == "Completed", timeout=60, what=f"job {i} Completed")
    assert shown_nodes(pilot, fast) == "local-1"
    (work / "never.jrdl").write_text("<jrdl>" + job(work, "never", clock(400)) + "</jrdl>")
    refused = pilot.cli("submit", str(work / "never.jrdl"), check=False)
    assert refused.returncode == 2 and "can never run in this allocation" in refused.stderr, refused.stderr
    assert "clock_mhz>=400 does not hold: its clock_mhz is 300" in refused.stderr
    assert not (work / "never.json").exists()


def test_a_load_requirement_is_accepted_and_waits_for_the_load(pilot: Pilot, work: Path) -> None:
    (work / "go").write_text("")
    # Every processor free (minFreeCPU = all of them) and 100 % available: met only by a node with no load
    # at all, which a machine running a pilot almost never is. Either way it is accepted, not refused.
    busy = f'<minFreeCPU><integer value="{CORES}"/></minFreeCPU>'
    idle = '<processorLoad><last1Min><integer value="100"/></last1Min></processorLoad>'
    a, b = submit(pilot, work / "load.jrdl", job(work, "busy", busy), job(work, "idle", idle))
    for job_id, name, value in ((a, "busy", "free_proc"), (b, "idle", "np_load_short")):

        def waits_or_ran(job_id: str = job_id, name: str = name, value: str = value) -> bool:
            if (work / f"{name}.json").exists():
                return True  # the load was nil for a moment: it ran, as it should
            why = pilot.cli("explain", job_id).stdout
            return f"{value}" in why and "now (a load value: the job waits for the node's load)" in why

        wait_for(waits_or_ran, timeout=30, what=f"{name}: explain says it waits for the load")
        pilot.cli("cancel", job_id, check=False)
        wait_for(lambda j=job_id: state(pilot, j) in ("Canceled", "Completed"), timeout=30, what=f"{name} ended")
    # More free processors than any node has: refused at submit, with the whole document.
    too_many = f'<minFreeCPU><integer value="{CORES + 1}"/></minFreeCPU>'
    (work / "never.jrdl").write_text("<jrdl>" + job(work, "ok") + job(work, "never", too_many) + "</jrdl>")
    refused = pilot.cli("submit", str(work / "never.jrdl"), check=False)
    assert refused.returncode == 2, refused.stderr
    assert f"free_proc>={CORES + 1} does not hold: its free_proc is {CORES} even idle" in refused.stderr
    assert not (work / "ok.json").exists() and not (work / "never.json").exists()

"""JRDL co-allocation end to end (issue 22, item 5) on a real local pilot of two sites, each holding one
allocation of one node: subjobs naming where they run (resourceManagerContact, jobManagerType) start
together, each in its own site's allocation, and not while one of them has no room; a co-allocated job
fails as a whole; a contact naming nothing of the pilot is refused listing what it may name. Each task
records the node it ran on; the client's 'pilot show' must agree."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Pilot
from pilot_waits import wait_for

pytestmark = pytest.mark.timeout(180)

CONFIG = """
[pilot]
heartbeat_interval = 0.5

[allocation]
lrm = "local"
nodes = 1
cores_per_node = 2

[sites.second]
lrm = "local"
nodes = 1
cores_per_node = 2
pilots = 1
"""

#: Records its node in <work>/<name>.json, then waits for <work>/<wait> to exist (<name>.go when not
#: given) and exits with the code it was given (marking <work>/<name>.done).
TASK = f"""#!{sys.executable}
import json, os, sys, time
work, name, code = sys.argv[1], sys.argv[2], int(sys.argv[3])
wait = sys.argv[4] if len(sys.argv) > 4 else name + ".go"
with open(os.path.join(work, name + ".json"), "w") as f:
    json.dump({{"node": os.environ.get("PILOT_NODE"), "job": os.environ.get("PILOT_JOB_ID"),
               "cpus": len(os.sched_getaffinity(0))}}, f)
deadline = time.monotonic() + 100
while not os.path.exists(os.path.join(work, wait)) and time.monotonic() < deadline:
    time.sleep(0.05)
open(os.path.join(work, name + ".done"), "w").close()
sys.exit(code)
"""


@pytest.fixture
def pilot(start_pilot: Callable[..., Pilot]) -> Pilot:
    p = start_pilot(CONFIG, name="jrdlco")
    wait_for(lambda: p.cli("nodes").stdout.count("<Node>") == 2, timeout=30, what="2 agents registered")
    return p


@pytest.fixture
def work(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    (d / "task.py").write_text(TASK)
    (d / "task.py").chmod(0o755)
    return d


def s(value: str) -> str:
    return f'<stringElement value="{value}"/>'


def subjob(
    work: Path,
    name: str,
    *,
    contact: str | None = None,
    manager: str | None = None,
    count: int = 1,
    code: int = 0,
    wait: str | None = None,
) -> str:
    values = (str(work), name, str(code), *([wait] if wait else []))
    strings = "".join(f"<string>{s(v)}</string>" for v in values)
    parts = [
        f"<executable><path>{s(str(work / 'task.py'))}</path></executable>",
        f"<arguments><stringArray>{strings}</stringArray></arguments>",
        f'<count><integer value="{count}"/></count>',
    ]
    if contact is not None:
        parts.append(f"<resourceManagerContact><string>{s(contact)}</string></resourceManagerContact>")
    if manager is not None:
        value = f"<enumeration><enumerationValue><{manager}/></enumerationValue></enumeration>"
        parts.append(f"<jobManagerType>{value}</jobManagerType>")
    return "<subjob>" + "".join(parts) + "</subjob>"


def submit(p: Pilot, file: Path, *subjobs: str, check: bool = True) -> list[str]:
    file.write_text("<jrdl><job>" + "".join(subjobs) + "</job></jrdl>")
    proc = p.cli("submit", str(file), check=False)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc.stdout.split() if proc.returncode == 0 else [proc.stderr]


def record(work: Path, name: str) -> dict[str, object]:
    text = wait_for(lambda: (work / f"{name}.json").exists() and (work / f"{name}.json").read_text(), what=name)
    rec = json.loads(text)
    assert isinstance(rec, dict)
    return rec


def state(p: Pilot, job_id: str) -> str:
    m = re.search(r"<State>(\w+)</State>", p.cli("show", job_id, "--xml").stdout)
    return m.group(1) if m else ""


def shown_nodes(p: Pilot, job_id: str) -> list[str]:
    m = re.search(r"node\(s\):\s+([^;]+);", p.cli("show", job_id).stdout)
    assert m, p.cli("show", job_id).stdout
    return sorted(n.strip() for n in m.group(1).split(","))


def test_subjobs_start_together_each_in_its_sites_allocation(pilot: Pilot, work: Path) -> None:
    # The second site's node is taken by a job that runs only there (its whole 2 cores).
    (blocker,) = submit(pilot, work / "blocker.jrdl", subjob(work, "blocker", contact="second", count=2))
    assert record(work, "blocker")["node"] == "local-0@a2"
    (co,) = submit(
        pilot,
        work / "co.jrdl",
        subjob(work, "a", contact="main", manager="fork", count=2),
        subjob(work, "b", contact="second/a2"),
    )
    # The main site has room for "a", the second site none for "b": neither starts.
    why = wait_for(
        lambda: "it starts when every part can" in (out := pilot.cli("explain", co).stdout) and out,
        what="explain of the co-allocated job",
    )
    assert "has room now in main/a1; it starts when every part can" in why, why
    assert "in second/a2:" in why, why
    assert state(pilot, co) == "Idle" and not (work / "a.json").exists() and not (work / "b.json").exists()
    (work / "blocker.go").write_text("")
    a, b = record(work, "a"), record(work, "b")
    assert (a["node"], a["cpus"]) == ("local-0", 2) and b["node"] == "local-0@a2"
    assert a["job"] == b["job"] == co  # one job: both parts see its id
    (work / "a.go").write_text("")
    (work / "b.go").write_text("")
    wait_for(lambda: state(pilot, co) == "Completed", timeout=60, what="co-allocated job Completed")
    assert state(pilot, blocker) == "Completed"
    assert shown_nodes(pilot, co) == ["local-0", "local-0@a2"]  # the client reports both sites' nodes


def test_a_coallocated_job_fails_as_a_whole(pilot: Pilot, work: Path) -> None:
    # "fails" exits 3 once "stays" runs; "stays" would wait for stays.go, which never comes.
    stays = subjob(work, "stays", contact="main")
    fails = subjob(work, "fails", contact="second", code=3, wait="stays.json")
    (co,) = submit(pilot, work / "co.jrdl", stays, fails)
    assert record(work, "stays")["node"] == "local-0" and record(work, "fails")["node"] == "local-0@a2"
    wait_for(lambda: state(pilot, co) == "Failed", timeout=60, what="co-allocated job Failed")
    assert (work / "fails.done").exists() and not (work / "stays.done").exists()  # stopped, not finished
    shown = pilot.cli("show", co).stdout  # what the client reports: the part that failed, and both nodes
    assert f"job {co}: FAILED, exit 3" in shown and "exited with code 3 on node local-0@a2" in shown, shown
    assert shown_nodes(pilot, co) == ["local-0", "local-0@a2"]


def test_a_contact_that_names_nothing_of_the_pilot_is_refused(pilot: Pilot, work: Path) -> None:
    file = work / "far.jrdl"
    far = subjob(work, "far", contact="http://eros01.gridcenter.or.kr:8080")
    file.write_text("<jrdl><job>" + far + "</job></jrdl>")
    proc = pilot.cli("submit", str(file), check=False)
    assert proc.returncode == 2, proc.stderr
    assert "names no site or allocation of this pilot; known: main, main/a1, second, second/a2" in proc.stderr
    pbs = work / "pbs.jrdl"
    pbs.write_text("<jrdl><job>" + subjob(work, "pbs", manager="pbs") + "</job></jrdl>")
    proc = pilot.cli("submit", str(pbs), check=False)
    assert proc.returncode == 2 and "its sites: main (fork), second (fork)" in proc.stderr, proc.stderr
    assert not (work / "far.json").exists() and not (work / "pbs.json").exists()

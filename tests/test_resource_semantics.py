"""Resource requests that are enforced as asked (issue 20), on a real local pilot of three virtual nodes
whose agents heartbeat: static node facts, requestable NO / FORCED, a consumable's default, the SGE
override rules at 'pilot up', Disk/Swap/Network and typed resources, and requirements on PSI/J jobs.
Each task records the node that really started it (the agent's own name, PILOT_NODE)."""

from __future__ import annotations

import platform
import socket
import subprocess
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import PYTHON, Pilot
from pilot_waits import wait_for

import client as psij

pytestmark = pytest.mark.timeout(120)

CONFIG = """
[pilot]
heartbeat_interval = 0.3

[allocation]
lrm = "local"
nodes = 3
cores_per_node = 2

[attributes]
token = { type = "int", consumable = true, requestable = "FORCED" }
seat = { type = "int", consumable = true, requestable = "NO", default = 1 }
License = { type = "int", consumable = true }

[nodes."local-0"]
consumables = { token = 4 }

[nodes."local-1"]
consumables = { seat = 2 }

[nodes."local-2"]
features = ["big"]
"""

#: Defect 6: local-1 configured with SSS Disk/Swap/Network and a typed License (the elaborate example's).
SIZED = """
[pilot]
heartbeat_interval = 0.3

[allocation]
lrm = "local"
nodes = 2
cores_per_node = 1

[attributes]
License = { type = "int", consumable = true }

[nodes."local-1"]
features = ["Jumbo-Frame"]
consumables = { "License:ESSL2" = 1, Disk = "100G", Swap = "8G", Network = "10G" }
"""

RECORD = """#!/bin/sh
# Where this task really ran (the agent's node name); then wait for the file $2, if named.
echo "$PILOT_NODE" > "$1.$PILOT_JOB_ID.${PILOT_TASK_ID:-${PILOT_RANK:-0}}"
if [ -n "$2" ]; then while [ ! -e "$2" ]; do sleep 0.05; done; fi
"""


def started(start_pilot: Callable[..., Pilot], config: str, nodes: int) -> Pilot:
    p = start_pilot(config, name="res")

    def heartbeats_came() -> bool:  # Utilized comes with the agents' load reports
        root = ET.fromstring(p.cli("nodes", "--xml").stdout)
        return len(root.findall("Node/Utilized")) == nodes

    wait_for(heartbeats_came, timeout=30, what=f"{nodes} agents registered and reporting load")
    return p


@pytest.fixture
def pilot(start_pilot: Callable[..., Pilot]) -> Pilot:
    return started(start_pilot, CONFIG, 3)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    script = d / "record.sh"
    script.write_text(RECORD)
    script.chmod(0o755)
    return d


class SubmitRefused(Exception):
    pass


def submit(p: Pilot, work: Path, body: str, *, prefix: str = "", stop: str = "") -> str:
    """One SSS Job running record.sh with ``body`` inside its TaskGroup; its id."""
    doc = f"""
    <Job>
      <InitialWorkingDirectory>{work}</InitialWorkingDirectory>
      <Executable>{work}/record.sh</Executable>
      <Arguments>{prefix or "t"} {stop}</Arguments>
      <TaskGroup>{body}</TaskGroup>
    </Job>"""
    path = work / "job.xml"
    path.write_text(textwrap.dedent(doc))
    proc = p.cli("submit", str(path), check=False)
    if proc.returncode != 0:
        raise SubmitRefused(proc.stderr)
    [job_id] = proc.stdout.split()
    return job_id


def final(p: Pilot, job_id: str) -> str:
    state: list[str] = []

    def ended() -> bool:
        state[:] = [ET.fromstring(p.cli("show", job_id, "--xml").stdout).findtext("State") or ""]
        return state[0] in ("Completed", "Failed", "Canceled")

    wait_for(ended, timeout=60, what=f"job {job_id} final")
    return state[0]


def nodes_used(work: Path, prefix: str) -> list[str]:
    return sorted(f.read_text().strip() for f in work.glob(f"{prefix}.*"))


def node_xml(p: Pilot, name: str) -> ET.Element:
    root = ET.fromstring(p.cli("nodes", "--xml").stdout)
    return next(n for n in root.findall("Node") if n.findtext("Id") == name)


def test_static_node_facts_match_after_heartbeats(pilot: Pilot, work: Path) -> None:
    """Defect 1: Architecture, OperatingSystem and the SGE built-ins hostname, num_proc, mem_total are
    registration facts; heartbeats (load values) must not wipe them."""
    cases = {
        "arch": f"<Architecture>{platform.machine()}</Architecture>",
        "os": '<Requested><OperatingSystem op="Match">Linux*</OperatingSystem></Requested>',
        "host": '<Requested><Extension type="Attribute" name="hostname">'
        f"{socket.gethostname()}</Extension></Requested>",
        "nproc": '<Requested><Extension type="Attribute" name="num_proc" op="GE">2</Extension></Requested>',
        "mem": '<Requested><Extension type="Attribute" name="mem_total" op="GT">1M</Extension></Requested>',
    }
    ids = {name: submit(pilot, work, req, prefix=name) for name, req in cases.items()}
    for name, job_id in ids.items():
        assert final(pilot, job_id) == "Completed", name
        assert nodes_used(work, name), name
    with pytest.raises(SubmitRefused, match="Architecture=sparc64 does not hold"):  # a fact that is not so
        submit(pilot, work, "<Architecture>sparc64</Architecture>")


def test_requestable_no_is_refused_and_forced_keeps_other_jobs_off(pilot: Pilot, work: Path) -> None:
    """Defect 2: a consumable with requestable = NO cannot be asked for; a node offering a FORCED one
    (token on local-0) takes only jobs that request it."""
    with pytest.raises(SubmitRefused, match=r"seat cannot be requested \(requestable = NO"):
        submit(pilot, work, '<Resource name="seat">1</Resource>')
    spread = submit(pilot, work, '<TaskCount>4</TaskCount><TaskDistribution type="Rule">Spread</TaskDistribution>')
    tokened = submit(pilot, work, '<TaskCount>2</TaskCount><Resource name="token">1</Resource>', prefix="tok")
    assert final(pilot, spread) == "Completed" and final(pilot, tokened) == "Completed"
    assert "local-0" not in nodes_used(work, "t"), nodes_used(work, "t")
    assert nodes_used(work, "tok") == ["local-0", "local-0"]
    with pytest.raises(SubmitRefused, match="the 2 matching node"):  # 6 cores asked, 4 on the nodes it may use
        submit(pilot, work, "<TaskCount>6</TaskCount>")


def test_a_default_is_debited_where_offered_and_restricts_nothing(pilot: Pilot, work: Path) -> None:
    """Defect 4: seat (default 1, only on local-1) keeps no job off local-2; on local-1 each task
    still takes its default."""
    job_id = submit(pilot, work, "<TaskCount>4</TaskCount>", prefix="d", stop=str(work / "stop"))
    wait_for(lambda: len(nodes_used(work, "d")) == 4, timeout=30, what="4 tasks running")
    assert nodes_used(work, "d") == ["local-1", "local-1", "local-2", "local-2"]
    available = node_xml(pilot, "local-1").find("Available")
    assert available is not None
    seats = [r.text for r in available.findall("Resource") if r.get("name") == "seat"]
    assert seats and float(seats[0] or -1) == 0  # both seats taken by the two tasks' defaults
    (work / "stop").touch()
    assert final(pilot, job_id) == "Completed"


@pytest.mark.parametrize(
    ("levels", "message"),
    [
        (
            'site = { type = "string" }\n[global]\nattributes = { site = "a" }\n'
            '[nodes."local-1"]\nattributes = { site = "b" }\n',
            "cannot be overridden on a node",
        ),
        (
            'scratch = { type = "memory", relop = "<=" }\n[global]\nattributes = { scratch = "100G" }\n'
            '[nodes."local-1"]\nattributes = { scratch = "200G" }\n',
            "less restrictive",
        ),
    ],
)
def test_a_node_overriding_a_global_value_wrongly_fails_up(
    pilot_home: Path, tmp_path: Path, levels: str, message: str
) -> None:
    """Defect 3: SGE's override rules between the global and the host level, checked at 'pilot up'."""
    cfg = tmp_path / "levels.toml"
    cfg.write_text('[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 1\n[attributes]\n' + levels)
    rundir = pilot_home / "levels"
    up = [PYTHON, "-m", "pilot", "up", "--config", str(cfg), "--rundir", str(rundir)]
    proc = subprocess.run(up, capture_output=True, text=True, timeout=60)
    if proc.returncode == 0:  # accepted (the defect): stop what it started before failing
        subprocess.run([PYTHON, "-m", "pilot", "down", "--rundir", str(rundir)], capture_output=True, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    name = "site" if "site" in levels else "scratch"
    assert f"nodes.local-1.attributes.{name}" in proc.stderr and f"global.attributes.{name}" in proc.stderr
    assert message in proc.stderr, proc.stderr


def test_disk_swap_network_and_typed_resources(start_pilot: Callable[..., Pilot], work: Path) -> None:
    """Defect 6: nodes configured with Disk, Swap, Network and a typed Resource show them as Configured and
    take the tasks that ask for them; the SSS spec's elaborate Master task group runs as written."""
    pilot = started(start_pilot, SIZED, 2)
    n2 = node_xml(pilot, "local-1")
    configured = n2.find("Configured")
    assert configured is not None
    assert configured.findtext("Disk") == str(100 * 1024) and configured.findtext("Swap") == str(8 * 1024)
    assert configured.findtext("Network") == str(10 * 1024)
    assert [(r.get("name"), r.get("type")) for r in configured.findall("Resource")] == [("License", "ESSL2")]
    sized = submit(pilot, work, "<Disk>10</Disk><Swap>1</Swap><Network>1</Network>", prefix="sz")
    master = submit(
        pilot,
        work,
        '<TaskCount>1</TaskCount><Memory>2048</Memory><Resource name="License" type="ESSL2">1</Resource>'
        "<Feature>Jumbo-Frame</Feature>",
        prefix="lic",
    )
    assert final(pilot, sized) == "Completed" and final(pilot, master) == "Completed"
    assert nodes_used(work, "sz") == ["local-1"] and nodes_used(work, "lic") == ["local-1"]
    with pytest.raises(SubmitRefused, match="Disk"):
        submit(pilot, work, '<Disk units="GB">200</Disk>')


def psij_job(work: Path, prefix: str, requirements: dict[str, object], *, stop: str = "") -> psij.Job:
    """A PSI/J job running record.sh with ``pilot.*`` custom attributes."""
    return psij.Job(
        psij.JobSpec(
            executable=str(work / "record.sh"),
            arguments=[prefix, *([stop] if stop else [])],
            directory=str(work),
            attributes=psij.JobAttributes(custom_attributes=dict(requirements)),
        )
    )


def test_psij_job_requiring_a_feature_runs_only_where_it_is(pilot: Pilot, work: Path) -> None:
    """What to add 1: ``pilot.feature`` on submit, submit_all and pipelined submit: every task on local-2,
    the only node with feature 'big', as the task itself sees it."""
    ex = pilot.executor()
    one = psij_job(work, "one", {"pilot.feature": "big"})
    ex.submit(one)
    many = [psij_job(work, "many", {"pilot.feature": "big"}) for _ in range(3)]
    ex.submit_all(many)
    piped = [psij_job(work, "piped", {"pilot.feature": "big", "pilot.os": "Linux*"}) for _ in range(3)]
    pipelined = pilot.executor(pipelined=True)
    for job in piped:
        pipelined.submit(job)
    wide = psij.Job(
        psij.JobSpec(
            executable=str(work / "record.sh"),
            arguments=["wide"],
            directory=str(work),
            launcher="multiple",
            resources=psij.ResourceSpecV1(process_count=2),
            attributes=psij.JobAttributes(custom_attributes={"pilot.node": "local-[1-2]", "pilot.feature": "big"}),
        )
    )
    ex.submit(wide)
    for job in [one, *many, *piped, wide]:
        assert job.wait(timeout=60).state is psij.JobState.COMPLETED, job.status
    for prefix, count in (("one", 1), ("many", 3), ("piped", 3), ("wide", 2)):
        assert nodes_used(work, prefix) == ["local-2"] * count, (prefix, nodes_used(work, prefix))


def test_psij_soft_preference_moves_jobs_to_the_preferred_node_while_it_has_room(pilot: Pilot, work: Path) -> None:
    """``pilot.prefer.feature``: the two jobs that fit go to local-2 (feature 'big', 2 cores); the third
    runs elsewhere instead of waiting."""
    ex = pilot.executor()
    stop = str(work / "stop")
    first = [psij_job(work, "pref", {"pilot.prefer.feature": "big"}, stop=stop) for _ in range(2)]
    for job in first:
        ex.submit(job)
    wait_for(lambda: len(nodes_used(work, "pref")) == 2, timeout=30, what="two preferring jobs running")
    assert nodes_used(work, "pref") == ["local-2", "local-2"]
    third = psij_job(work, "other", {"pilot.prefer.feature": "big"}, stop=stop)
    ex.submit(third)
    wait_for(lambda: nodes_used(work, "other"), timeout=30, what="the third job running")
    assert nodes_used(work, "other") == ["local-1"]  # local-0 offers a FORCED token it does not ask for
    (work / "stop").touch()
    for job in [*first, third]:
        assert job.wait(timeout=60).state is psij.JobState.COMPLETED


def test_psij_bad_requirement_is_an_invalid_job_naming_the_attribute(pilot: Pilot, work: Path) -> None:
    cases: list[tuple[dict[str, object], str]] = [
        ({"pilot.colour": "red"}, r"custom_attributes\['pilot.colour'\]: is not a pilot requirement"),
        ({"pilot.attribute.num_proc": ">="}, r"\['pilot.attribute.num_proc'\]: '>=' has no value"),
        ({"pilot.attribute.nosuch": "1"}, r"\['pilot.attribute.nosuch'\]: .*no attribute 'nosuch'"),
        ({"pilot.node_match": "(["}, r"\['pilot.node_match'\]: .*not a valid regular expression"),
        ({"pilot.resource.seat": 1}, r"\['pilot.resource.seat'\]: seat cannot be requested"),
        ({"pilot.disk": "lots"}, r"\['pilot.disk'\]: 'lots' is not a size"),
        ({"pilot.prefer.disk": "1G"}, r"\['pilot.prefer.disk'\]: a preference names a node kind"),
        ({"pilot.feature": "none-has-it"}, "can never run in this allocation"),
    ]
    ex = pilot.executor()
    for requirements, message in cases:
        with pytest.raises(psij.InvalidJobException, match=message):
            ex.submit(psij_job(work, "bad", requirements))
    assert ex.list() == []


def test_psij_requirements_survive_a_daemon_restart(pilot: Pilot, work: Path) -> None:
    """kill -9 of the daemon while a job requiring 'big' runs and another waits behind it: after 'pilot up'
    on the same run directory both are rebuilt with their requirements and run on local-2 only."""
    ex = pilot.executor()
    stop = str(work / "stop")
    running = psij_job(work, "rs", {"pilot.feature": "big"}, stop=stop)
    waiting = psij_job(
        work,
        "rw",
        {"pilot.feature": "big"},
    )
    waiting.spec.resources = psij.ResourceSpecV1(process_count=2)  # type: ignore[union-attr]
    waiting.spec.launcher = "multiple"  # type: ignore[union-attr]
    ex.submit(running)
    wait_for(lambda: nodes_used(work, "rs"), timeout=30, what="the first job running")
    ex.submit(waiting)  # 2 processes: local-2 has one core left until the first ends
    pilot.kill9()
    pilot.up_again()
    (work / "stop").touch()
    assert running.wait(timeout=60).state is psij.JobState.COMPLETED
    assert waiting.wait(timeout=60).state is psij.JobState.COMPLETED
    assert nodes_used(work, "rs") == ["local-2"] and nodes_used(work, "rw") == ["local-2", "local-2"]


def test_plain_psij_jobs_obey_forced_attributes_and_defaults(pilot: Pilot, work: Path) -> None:
    """A PSI/J job that names no attribute is still bound by the site's: kept off local-0 (FORCED token)
    and taking a seat (its default) on local-1, so local-1 holds two of them at most."""
    ex = pilot.executor()
    stop = str(work / "stop")
    jobs = [psij_job(work, "plain", {}, stop=stop) for _ in range(4)]
    ex.submit_all(jobs)
    wait_for(lambda: len(nodes_used(work, "plain")) == 4, timeout=30, what="4 plain jobs running")
    assert nodes_used(work, "plain") == ["local-1", "local-1", "local-2", "local-2"]
    available = node_xml(pilot, "local-1").find("Available")
    assert available is not None
    assert [float(r.text or -1) for r in available.findall("Resource") if r.get("name") == "seat"] == [0.0]
    (work / "stop").touch()
    for job in jobs:
        assert job.wait(timeout=60).state is psij.JobState.COMPLETED

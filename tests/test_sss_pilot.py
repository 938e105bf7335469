"""The SSS job model end to end (issue 3): SSS XML submitted to a real pilot of three virtual nodes with
different configured features, attributes and consumables, real agents and real processes. Each task
records the node that really started it (the agent's own name, PILOT_NODE) and the cpus it was pinned
to; the tests compare that with the distribution rule, and with what 'pilot show --xml' says."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Pilot
from pilot_waits import wait_for

import client as psij

pytestmark = pytest.mark.timeout(120)

CORES = 5
CONFIG = f"""
[pilot]
heartbeat_interval = 0.5

[allocation]
lrm = "local"
nodes = 3
cores_per_node = {CORES}

[attributes]
License = {{ type = "int", consumable = true }}
scratch = {{ type = "memory", relop = ">=" }}

[nodes."local-0"]
features = ["master"]
attributes = {{ scratch = "500G" }}
consumables = {{ License = 1 }}

[nodes."local-[12]"]
features = ["worker"]
attributes = {{ scratch = "10G" }}
"""

RECORD = """#!/bin/sh
# Where this task really ran: the agent's node name, the cpus it is pinned to, its group and id.
cpus=$(grep Cpus_allowed_list /proc/self/status | cut -f2)
echo "$PILOT_NODE $cpus $PILOT_TASK_GROUP $PILOT_TASK_ID" > "$1.$PILOT_TASK_GROUP.$PILOT_TASK_ID"
sleep "${2:-0}"
exit "${3:-0}"
"""


@pytest.fixture
def pilot(start_pilot: Callable[..., Pilot]) -> Pilot:
    p = start_pilot(CONFIG, name="sss")
    wait_for(lambda: p.cli("nodes").stdout.count("<Node>") == 3, timeout=30, what="3 agents registered")
    return p


@pytest.fixture
def work(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    script = d / "record.sh"
    script.write_text(RECORD)
    script.chmod(0o755)
    return d


def submit(p: Pilot, path: Path, document: str, *, check: bool = True) -> list[str]:
    path.write_text(textwrap.dedent(document))
    proc = p.cli("submit", str(path), check=False)
    if check:
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    raise SubmitRefused(proc.stderr)


class SubmitRefused(Exception):
    pass


def final(p: Pilot, job_id: str, *, timeout: float = 60) -> ET.Element:
    """The job's SSS XML once its State is final."""
    root: list[ET.Element] = []

    def ended() -> bool:
        root[:] = [ET.fromstring(p.cli("show", job_id, "--xml").stdout)]
        return (root[0].findtext("State") or "") in ("Completed", "Failed", "Canceled")

    wait_for(ended, timeout=timeout, what=f"job {job_id} final")
    return root[0]


def ran(work: Path, prefix: str) -> dict[tuple[int, int], tuple[str, set[int]]]:
    """(group, task) -> (node that started it, cpus it was pinned to), from the files the tasks wrote."""
    out = {}
    for f in work.glob(f"{prefix}.*.*"):
        node, cpus, group, task = f.read_text().split()
        out[(int(group), int(task))] = (node, _cpu_list(cpus))
    return out


def _cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus


def real_cpus(node: str, cores: list[int]) -> set[int]:
    """The cpus the local LRM pins declared core ``c`` of virtual node ``local-i`` to."""
    cpus = sorted(os.sched_getaffinity(0))
    i = int(node.rsplit("-", 1)[1])
    return {cpus[(i * CORES + c) % len(cpus)] for c in cores}


def placed(root: ET.Element) -> dict[tuple[int, int], tuple[str, list[int]]]:
    """(group, task) -> (node, cores) from the Task elements of 'pilot show --xml'."""
    out = {}
    for gi, tg in enumerate(root.findall("TaskGroup")):
        for t in tg.findall("Task"):
            cores = next(
                (e.text or "" for e in t.findall("Extension") if e.get("name") == "Cores"),
                "",
            )
            out[(gi, int(t.findtext("Id") or -1))] = (t.findtext("Node") or "", [int(c) for c in cores.split(",") if c])
    return out


def test_master_worker_license_round_robin(pilot: Pilot, work: Path) -> None:
    """One XML file: 1 master on the node with the License resource, 12 workers RoundRobin over 3 nodes."""
    [job_id] = submit(
        pilot,
        work / "mw.xml",
        f"""
        <Job>
          <Name>master-worker</Name>
          <InitialWorkingDirectory>{work}</InitialWorkingDirectory>
          <Executable>{work}/record.sh</Executable>
          <Arguments>mw 1</Arguments>
          <TaskGroup>
            <Name>master</Name>
            <TaskCount>1</TaskCount>
            <Resource name="License">1</Resource>
          </TaskGroup>
          <TaskGroup>
            <Name>workers</Name>
            <TaskCount>12</TaskCount>
            <TaskDistribution type="Rule">RoundRobin</TaskDistribution>
          </TaskGroup>
        </Job>
        """,
    )
    root = final(pilot, job_id)
    assert root.findtext("State") == "Completed", ET.tostring(root)
    where = ran(work, "mw")
    assert len(where) == 13
    assert where[(0, 0)][0] == "local-0"  # the only node with a License
    first = [where[(1, t)][0] for t in range(3)]
    assert len(set(first)) == 3  # workers dealt one per node in turn: 0, 1, 2 on three nodes,
    for t in range(12):
        assert where[(1, t)][0] == first[t % 3], (t, where[(1, t)])  # ... then 3 with 0, 4 with 1, ...
    shown = placed(root)
    assert len(shown) == 13
    per_node: dict[str, list[int]] = {}
    for key, (node, cpus) in where.items():
        node_shown, cores = shown[key]
        assert node_shown == node  # what the scheduler says is where the agent ran it
        assert cpus == real_cpus(node, cores)  # pinned to exactly the cores placed
        per_node.setdefault(node, []).extend(cores)
    for node, cores in per_node.items():  # all 13 ran at once (1 s each): no core given twice
        assert len(cores) == len(set(cores)), (node, cores)
    delivered = root.find("Delivered")
    assert delivered is not None and delivered.findtext("Processors") == "13"
    assert delivered.findtext("NodeCount") == "3"


def test_geometry(pilot: Pilot, work: Path) -> None:
    [job_id] = submit(
        pilot,
        work / "geo.xml",
        f"""
        <Job>
          <InitialWorkingDirectory>{work}</InitialWorkingDirectory>
          <Executable>{work}/record.sh</Executable>
          <Arguments>geo</Arguments>
          <TaskGroup>
            <TaskCount>5</TaskCount>
            <TaskDistribution type="Geometry">{{1,4}}{{2}}{{3,5}}</TaskDistribution>
          </TaskGroup>
        </Job>
        """,
    )
    assert final(pilot, job_id).findtext("State") == "Completed"
    where = {task: node for (_, task), (node, _) in ran(work, "geo").items()}
    assert len(where) == 5
    assert where[0] == where[3] and where[2] == where[4]  # spec ids 1,4 and 3,5 share a node
    assert len({where[0], where[1], where[2]}) == 3  # three blocks, three nodes
    assert list(where.values()).count(where[1]) == 1  # {2} alone


@pytest.mark.parametrize(("rule", "spread"), [("Pack", [4]), ("Spread", [2, 1, 1])])
def test_pack_vs_spread(pilot: Pilot, work: Path, rule: str, spread: list[int]) -> None:
    [job_id] = submit(
        pilot,
        work / f"{rule}.xml",
        f"""
        <Job>
          <InitialWorkingDirectory>{work}</InitialWorkingDirectory>
          <Executable>{work}/record.sh</Executable>
          <Arguments>{rule}</Arguments>
          <TaskGroup>
            <TaskCount>4</TaskCount>
            <TaskDistribution type="Rule">{rule}</TaskDistribution>
          </TaskGroup>
        </Job>
        """,
    )
    assert final(pilot, job_id).findtext("State") == "Completed"
    counts = Counter(node for node, _ in ran(work, rule).values())
    assert sorted(counts.values(), reverse=True) == spread, counts


def test_dag_of_five(pilot: Pilot, work: Path) -> None:
    """a succeeds, b exits 3; c (OnSuccess a) and e (OnExit code=3 b) run, d (OnFailure a) never does."""

    def job(local: str, code: int, dep: str = "") -> str:
        return f"""
          <Job>
            <Id>{local}</Id><Name>{local}</Name>
            <Executable>{work}/record.sh</Executable>
            <Arguments>dag-{local} 0.2 {code}</Arguments>
            {dep}
          </Job>"""

    ids = submit(
        pilot,
        work / "dag.xml",
        f"""
        <JobGroup>
          <Id>dag</Id>
          <JobDefaults><InitialWorkingDirectory>{work}</InitialWorkingDirectory></JobDefaults>
          {job("c", 0, '<Dependency condition="OnSuccess">a</Dependency>')}
          {job("a", 0)}
          {job("b", 3)}
          {job("d", 0, '<Dependency condition="OnFailure">a</Dependency>')}
          {job("e", 0, '<Dependency condition="OnExit" code="3">b</Dependency>')}
        </JobGroup>
        """,
    )
    _, a, _, d, _ = ids
    states = {name: final(pilot, i) for name, i in zip("cabde", ids, strict=True)}
    assert states["a"].findtext("State") == "Completed"
    assert states["b"].findtext("State") == "Failed" and states["b"].findtext("ExitCode") == "3"
    assert states["c"].findtext("State") == "Completed"
    assert states["e"].findtext("State") == "Completed"
    assert states["d"].findtext("State") == "Failed"
    message = states["d"].findtext("StatusMessage") or ""
    assert f"OnFailure on job {a} ('a') can no longer be met" in message and "COMPLETED" in message
    ran_jobs = {p.name.split(".")[0] for p in work.glob("dag-*")}
    assert ran_jobs == {"dag-a", "dag-b", "dag-c", "dag-e"}  # d never started
    assert "it ended FAILED" in pilot.cli("explain", d).stdout


def test_cycle_and_bad_input_refused_without_harm(pilot: Pilot, work: Path) -> None:
    """Cycles, contradictions, unknown names and malformed XML are refused naming the element; a job
    accepted before keeps running and ends as it should."""
    [keep] = submit(
        pilot,
        work / "keep.xml",
        f"<Job><Executable>{work}/record.sh</Executable><Arguments>keep 1.5</Arguments>"
        f"<InitialWorkingDirectory>{work}</InitialWorkingDirectory></Job>",
    )
    bad = {
        "cycle": (
            "<JobGroup><Id>cyc</Id>"
            "<Job><Id>x</Id><Executable>/bin/true</Executable><Dependency>y</Dependency></Job>"
            "<Job><Id>y</Id><Executable>/bin/true</Executable><Dependency>x</Dependency></Job>"
            "</JobGroup>",
            "dependency cycle",
        ),
        "contradiction": (
            "<Job><Executable>/bin/true</Executable><TaskGroup><TaskCount>2</TaskCount><Processors>3</Processors>"
            "</TaskGroup></Job>",
            "Processors=3 cannot be split evenly over TaskCount=2",
        ),
        "no such job": (
            "<Job><Executable>/bin/true</Executable><Dependency>nope</Dependency></Job>",
            "names no job",
        ),
        "no node": (
            "<Job><Executable>/bin/true</Executable><Feature>gpu-rack</Feature></Job>",
            "can never run in this allocation",
        ),
        "malformed": ("<Job><Executable>/bin/true</Executable>\n<Name>x</Job>", "line 2"),
        "elaborate as written": (
            Path(__file__).with_name("data").joinpath("sss_elaborate_as_written.xml").read_text(),
            "line 16",
        ),
    }
    for what, (doc, expected) in bad.items():
        with pytest.raises(SubmitRefused) as err:
            submit(pilot, work / "bad.xml", doc, check=False)
        assert expected in str(err.value), (what, str(err.value))
    # Nothing of the refused submissions was accepted (all or none).
    listed = psij.JobExecutor.get_instance("pilot", url=str(pilot.rundir.path))
    try:
        assert listed.list() == [keep]
    finally:
        listed.close()
    assert final(pilot, keep).findtext("State") == "Completed"
    assert json.loads(pilot.cli("status", "--json").stdout)["jobs"]  # the daemon serves on after the refusals


def test_explain_hold_release_and_dependency_wait(pilot: Pilot, work: Path) -> None:
    [first] = submit(
        pilot,
        work / "first.xml",
        f"<Job><Name>first</Name><Executable>/bin/sh</Executable>"
        "<Arguments>-c 'while [ ! -e stop ]; do sleep 0.05; done'</Arguments>"
        f"<InitialWorkingDirectory>{work}</InitialWorkingDirectory></Job>",
    )
    [after] = submit(
        pilot,
        work / "after.xml",
        f'<Job><Executable>/bin/true</Executable><Dependency designator="JobName">first</Dependency>'
        f"<InitialWorkingDirectory>{work}</InitialWorkingDirectory></Job>",
    )
    [held] = submit(
        pilot,
        work / "held.xml",
        f"<Job><Executable>/bin/true</Executable><Hold>User</Hold>"
        f"<InitialWorkingDirectory>{work}</InitialWorkingDirectory></Job>",
    )
    [big] = submit(
        pilot,
        work / "big.xml",
        f"<Job><Executable>/bin/true</Executable><TaskGroup><TaskCount>15</TaskCount></TaskGroup>"
        f"<InitialWorkingDirectory>{work}</InitialWorkingDirectory></Job>",
    )
    text = pilot.cli("explain", after, held).stdout
    assert f"waits for job {first} ('first') to end (OnSuccess)" in text, text
    assert f"'pilot release {held}'" in text, text
    shown = ET.fromstring(pilot.cli("show", held, "--xml").stdout)
    assert shown.findtext("State") == "Hold"
    big_text = pilot.cli("explain", big).stdout  # 15 cores asked, first holds one
    assert "waits for resources" in big_text and "room for 14" in big_text, big_text
    assert "released" in pilot.cli("release", held).stdout
    (work / "stop").touch()  # first ends only now: everything above saw it running
    for job_id in (first, after, held, big):
        assert final(pilot, job_id).findtext("State") == "Completed"


def test_psij_depends_on(pilot: Pilot, work: Path) -> None:
    """The same through the PSI/J client: custom_attributes['depends_on']."""
    ex = pilot.executor()
    bad = psij.Job(psij.JobSpec(executable="/bin/false"))
    ex.submit(bad)
    on_fail = psij.Job(
        psij.JobSpec(
            executable="/bin/true",
            attributes=psij.JobAttributes(custom_attributes={"depends_on": f"OnFailure:{bad.native_id}"}),
        )
    )
    on_ok = psij.Job(
        psij.JobSpec(
            executable="/bin/true",
            attributes=psij.JobAttributes(custom_attributes={"depends_on": f"{bad.native_id}"}),
        )
    )
    ex.submit(on_fail)
    ex.submit(on_ok)
    assert on_fail.wait(timeout=30).state is psij.JobState.COMPLETED
    st = on_ok.wait(timeout=30)
    assert st.state is psij.JobState.FAILED and "can no longer be met" in (st.message or "")
    with pytest.raises(psij.InvalidJobException, match="names no job"):
        ex.submit(
            psij.Job(
                psij.JobSpec(
                    executable="/bin/true", attributes=psij.JobAttributes(custom_attributes={"depends_on": "999"})
                )
            )
        )


def test_nodes_xml_streams_and_limits(pilot: Pilot, work: Path) -> None:
    """Node XML with Configured/Available/Utilized and the site's features and consumables; a task's
    ResourceLimit applied with setrlimit; OutputFile redirectList Append keeps earlier output; Merge."""
    out = work / "limits.out"
    out.write_text("earlier\n")
    [job_id] = submit(
        pilot,
        work / "lim.xml",
        f"""
        <Job>
          <InitialWorkingDirectory>{work}</InitialWorkingDirectory>
          <Executable>/bin/sh</Executable>
          <Arguments>-c 'echo nofile=$(ulimit -n); echo oops >&amp;2'</Arguments>
          <OutputFile redirectList="Append">{out}</OutputFile>
          <ErrorFile redirectList="Merge"/>
          <ResourceLimit name="OpenFiles">64</ResourceLimit>
        </Job>
        """,
    )
    assert final(pilot, job_id).findtext("State") == "Completed"
    assert out.read_text() == "earlier\nnofile=64\noops\n"

    def measured() -> ET.Element | None:  # Utilized comes with the agents' heartbeats
        root = ET.fromstring(pilot.cli("nodes", "--xml").stdout)
        return root if len(root.findall("Node/Utilized")) == 3 else None

    root = wait_for(measured, timeout=20, what="Utilized of every node")
    nodes = {n.findtext("Id"): n for n in root.findall("Node")}
    assert set(nodes) == {"local-0", "local-1", "local-2"}
    n0 = nodes["local-0"]
    assert [f.text for f in n0.findall("Feature")] == ["master"]
    configured = n0.find("Configured")
    assert configured is not None and configured.findtext("Processors") == str(CORES)
    lic = [r for r in configured.findall("Resource") if r.get("name") == "License"]
    assert lic and float(lic[0].text or 0) == 1
    assert n0.find("Available") is not None
    utilized = n0.find("Utilized")
    assert utilized is not None and utilized.find("Memory") is not None
    attrs = {e.get("name"): e.text for e in n0.findall("Extension")}
    assert "load_avg" in attrs and "mem_free" in attrs and "scratch" in attrs
    assert re.fullmatch(r"[\d.]+", attrs["load_avg"] or "")


def test_client_calls(pilot: Pilot, work: Path) -> None:
    """submit_sss, explain, show_xml and nodes_xml through the PSI/J executor."""
    ex = pilot.executor()
    jobs = ex.submit_sss(
        f"""<JobGroup><Id>g</Id>
          <Job><Id>one</Id><Executable>{work}/record.sh</Executable><Arguments>cl 0.5 4</Arguments>
            <InitialWorkingDirectory>{work}</InitialWorkingDirectory></Job>
          <Job><Executable>/bin/true</Executable><Dependency condition="OnExit" code="4">one</Dependency></Job>
        </JobGroup>"""
    )
    assert len(jobs) == 2
    assert any("waits for job" in r for r in ex.explain(jobs[1]))
    assert jobs[0].wait(timeout=30).exit_code == 4
    assert jobs[1].wait(timeout=30).state is psij.JobState.COMPLETED
    root = ET.fromstring(ex.show_xml(jobs[0]))
    assert root.findtext("State") == "Failed" and root.findtext("ExitCode") == "4"
    assert {n.findtext("Id") for n in ET.fromstring(ex.nodes_xml()).findall("Node")} == {
        "local-0",
        "local-1",
        "local-2",
    }
    with pytest.raises(psij.InvalidJobException, match="line 1"):
        ex.submit_sss("<Job><Executable>/bin/true</Job>")


def test_dependencies_and_task_groups_survive_a_daemon_restart(pilot: Pilot, work: Path) -> None:
    """kill -9 of the daemon while an SSS job runs and its dependents wait: after 'pilot up' on the same
    run directory the running job is re-adopted with its task placement, the waiting ones still wait
    and then run (or fail) by their conditions."""
    ids = submit(
        pilot,
        work / "r.xml",
        f"""
        <JobGroup><Id>r</Id>
          <JobDefaults><InitialWorkingDirectory>{work}</InitialWorkingDirectory></JobDefaults>
          <Job><Id>a</Id><Executable>{work}/record.sh</Executable><Arguments>ra 3</Arguments>
            <TaskGroup><TaskCount>2</TaskCount><TaskDistribution type="Rule">Spread</TaskDistribution></TaskGroup>
          </Job>
          <Job><Id>b</Id><Executable>{work}/record.sh</Executable><Arguments>rb</Arguments>
            <Dependency>a</Dependency></Job>
          <Job><Id>c</Id><Executable>{work}/record.sh</Executable><Arguments>rc</Arguments>
            <Dependency condition="OnFailure">a</Dependency></Job>
        </JobGroup>
        """,
    )
    a, b, c = ids
    wait_for(lambda: len(list(work.glob("ra.*"))) == 2, timeout=20, what="job a running")
    pilot.kill9()
    pilot.up_again()
    assert final(pilot, a).findtext("State") == "Completed"
    assert final(pilot, b).findtext("State") == "Completed"
    assert final(pilot, c).findtext("State") == "Failed"
    shown = placed(final(pilot, a))
    assert {node for node, _ in shown.values()} == {node for node, _ in ran(work, "ra").values()}
    assert len(list(work.glob("ra.*"))) == 2 and len(list(work.glob("rb.*"))) == 1 and not list(work.glob("rc.*"))


def test_typed_attributes_features_and_load_values(pilot: Pilot, work: Path) -> None:
    """Requested typed attributes (memory with GE), a Feature, a load value refreshed by heartbeats, and a
    negative preference that ranks nodes: each task lands where the requirement holds."""

    def job(prefix: str, requirement: str, count: int = 3) -> str:
        return f"""
        <Job>
          <InitialWorkingDirectory>{work}</InitialWorkingDirectory>
          <Executable>{work}/record.sh</Executable>
          <Arguments>{prefix}</Arguments>
          <TaskGroup>
            <TaskCount>{count}</TaskCount>
            {requirement}
          </TaskGroup>
        </Job>"""

    cases = {
        "big": (
            '<Requested><Extension type="Attribute" name="scratch" op="GE">100G</Extension></Requested>',
            {"local-0"},
        ),
        "wrk": ("<Feature>worker</Feature>", {"local-1", "local-2"}),
        "load": (
            '<Requested><Extension type="Attribute" name="mem_free" op="GT">1M</Extension></Requested>'
            "<TaskDistribution>Spread</TaskDistribution>",
            {"local-0", "local-1", "local-2"},
        ),
    }
    ids = {name: submit(pilot, work / f"{name}.xml", job(name, req))[0] for name, (req, _) in cases.items()}
    for name, (_, nodes) in cases.items():
        assert final(pilot, ids[name]).findtext("State") == "Completed"
        used = {node for node, _ in ran(work, name).values()}
        assert used <= nodes and (name != "load" or used == nodes), (name, used)  # load: Spread over all
    with pytest.raises(SubmitRefused, match="scratch"):
        submit(
            pilot,
            work / "huge.xml",
            job("huge", '<Requested><Extension type="Attribute" name="scratch" op="GE">1T</Extension></Requested>'),
            check=False,
        )


def test_submit_wait_follows_every_job_to_its_end(pilot: Pilot, work: Path) -> None:
    """'pilot submit --wait' prints each job's final state and exits 1 when one did not complete."""
    (work / "w.xml").write_text(
        "<JobGroup><Id>w</Id>"
        "<Job><Id>ok</Id><Executable>/bin/true</Executable></Job>"
        "<Job><Executable>/bin/sh</Executable><Arguments>-c 'exit 5'</Arguments>"
        "<Dependency>ok</Dependency></Job>"
        "</JobGroup>"
    )
    proc = pilot.cli("submit", str(work / "w.xml"), "--wait", check=False)
    first, second = proc.stdout.split()[:2]
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert f"{first} COMPLETED" in proc.stdout
    assert f"{second} FAILED" in proc.stdout and "exited with code 5" in proc.stdout


@pytest.mark.timeout(60)
def test_submit_sss_returns_the_warnings_of_elements_it_did_not_act_on(start_pilot: Callable[..., Pilot]) -> None:
    ex = start_pilot().executor()
    jobs = ex.submit_sss(
        '<Job><Executable>/bin/true</Executable><Machine awarenessPolicy="Warn">elsewhere.example.org</Machine></Job>'
    )
    assert len(jobs) == 1 and len(jobs.warnings) == 1, jobs.warnings
    assert "<Machine>: this pilot runs on" in jobs.warnings[0] and jobs.warnings[0].endswith("; ignored")
    status = jobs[0].wait(timeout=30)
    assert status is not None and status.state is psij.JobState.COMPLETED


@pytest.mark.timeout(120)
def test_show_has_each_tasks_process_and_exit_code_and_each_groups_delivered(pilot: Pilot, work: Path) -> None:
    """Issue 20, defect 9: every Task element of a finished job names its process and exit code (as the
    task saw its own pid), and every TaskGroup has its own Delivered."""
    script = work / "pid.sh"
    script.write_text(
        '#!/bin/sh\necho $$ > "$1.$PILOT_TASK_GROUP.$PILOT_TASK_ID"\n'
        # The failing task ends last, once the other two have exited (a failed task's job stops the others,
        # whose exit codes would then differ): it waits for their pid files, then for their processes.
        'if [ "$PILOT_TASK_GROUP" = 1 ]; then\n'
        '  while [ ! -s "$1.0.0" ] || [ ! -s "$1.0.1" ]; do sleep 0.02; done\n'
        '  for f in "$1.0.0" "$1.0.1"; do while kill -0 "$(cat "$f")" 2>/dev/null; do sleep 0.02; done; done\n'
        "fi\n"
        "exit $((PILOT_TASK_GROUP * 3))\n"
    )
    script.chmod(0o755)
    [job_id] = submit(
        pilot,
        work / "pids.xml",
        f"""
        <Job>
          <Executable>{script}</Executable>
          <Arguments>{work}/p</Arguments>
          <TaskGroup><Name>ok</Name><TaskCount>2</TaskCount></TaskGroup>
          <TaskGroup><Name>bad</Name><TaskCount>1</TaskCount></TaskGroup>
        </Job>
        """,
    )
    root = final(pilot, job_id)
    assert root.findtext("State") == "Failed"
    groups = root.findall("TaskGroup")
    assert [g.findtext("Name") for g in groups] == ["ok", "bad"]
    for gi, (group, code) in enumerate(zip(groups, ["0", "3"], strict=True)):
        delivered = group.find("Delivered")
        assert delivered is not None and delivered.findtext("Processors") == str(len(group.findall("Task")))
        assert delivered.find("CpuDuration") is not None and delivered.find("Duration") is not None
        for task in group.findall("Task"):
            seen_pid = (work / f"p.{gi}.{task.findtext('Id')}").read_text().strip()
            assert task.findtext("Process") == seen_pid
            assert task.findtext("ExitCode") == code


@pytest.mark.timeout(120)
def test_nodes_have_a_description_a_spec_state_and_their_own_utilized_memory(pilot: Pilot, work: Path) -> None:
    """Issue 20, defect 9: the Node object's Description and State (the spec's Idle/Busy), and a virtual
    node's Utilized memory is what its own tasks hold, not the machine's."""
    gate = work / "gate"
    hog = work / "hog.py"
    hog.write_text(
        "import pathlib, sys, time\n"
        "block = bytearray(200 * 1024 * 1024)\n"
        "block[::4096] = b'x' * len(block[::4096])\n"
        "while not pathlib.Path(sys.argv[1]).exists():\n"
        "    time.sleep(0.05)\n"
    )
    [job_id] = submit(
        pilot,
        work / "hog.xml",
        f"""
        <Job>
          <Executable>{sys.executable}</Executable>
          <Arguments>{hog} {gate}</Arguments>
          <Requested><Node>local-1</Node></Requested>
        </Job>
        """,
    )

    def measured() -> dict[str, ET.Element] | None:
        nodes = {n.findtext("Id") or "": n for n in ET.fromstring(pilot.cli("nodes", "--xml").stdout).findall("Node")}
        memory = nodes["local-1"].findtext("Utilized/Memory") if "local-1" in nodes else None
        return nodes if memory is not None and float(memory) >= 200 else None

    try:
        nodes = wait_for(measured, timeout=30, what="local-1's Utilized memory to show its task's 200 MB")
        assert nodes["local-1"].findtext("State") == "Busy" and nodes["local-2"].findtext("State") == "Idle"
        assert float(nodes["local-2"].findtext("Utilized/Memory") or 0) < 50  # no task of its own
        description = nodes["local-1"].findtext("Description") or ""
        assert description.startswith("node of allocation a1 (site 'main', local) on host "), description
    finally:
        gate.touch()
    assert final(pilot, job_id).findtext("State") == "Completed"

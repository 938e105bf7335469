"""JRDL end to end (issue 22): documents submitted with 'pilot submit' and submit_jrdl to a real pilot of
three virtual nodes, real agents and real processes. Each task records what it saw (its arguments,
directory, environment, library path, stdin, node and cpus) in a file of its own; the tests compare
that with the document, and with what the client and 'pilot show' report."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Pilot
from pilot_waits import wait_for

import client as psij

pytestmark = pytest.mark.timeout(120)

CORES = 2
CONFIG = f"""
[pilot]
heartbeat_interval = 0.5

[allocation]
lrm = "local"
nodes = 3
cores_per_node = {CORES}
"""

RECORD = f"""#!{sys.executable}
# What this task saw, as JSON in <name>.<rank>: arguments, directory, environment, stdin, node, cpus.
import json, os, sys, time
name = sys.argv[1]
seen = {{
    "argv": sys.argv[2:],
    "cwd": os.getcwd(),
    "node": os.environ.get("PILOT_NODE"),
    "cpus": sorted(os.sched_getaffinity(0)),
    "env": dict(os.environ),
    "stdin": sys.stdin.read(),
    "start": time.time(),
}}
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PILOT_RANK", "0")
with open(f"{{name}}.{{rank}}", "w") as f:
    json.dump(seen, f)
sys.stdout.write(f"out {{name}} {{rank}}\\n")  # one write each: several processes may share the file
sys.stderr.write(f"err {{name}} {{rank}}\\n")
sys.exit(int(os.environ.get("JRDL_EXIT", "0")))
"""


@pytest.fixture
def pilot(start_pilot: Callable[..., Pilot]) -> Pilot:
    p = start_pilot(CONFIG, name="jrdl")
    wait_for(lambda: p.cli("nodes").stdout.count("<Node>") == 3, timeout=30, what="3 agents registered")
    return p


@pytest.fixture
def work(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    script = d / "record.py"
    script.write_text(RECORD)
    script.chmod(0o755)
    return d


def s(value: str) -> str:
    return f'<stringElement value="{value}"/>'


def path(tag: str, value: str) -> str:
    return f"<{tag}><path>{s(value)}</path></{tag}>"


def paths(tag: str, *values: str) -> str:
    return f"<{tag}><pathArray>" + "".join(f"<path>{s(v)}</path>" for v in values) + f"</pathArray></{tag}>"


def args(*values: str) -> str:
    return "<arguments><stringArray>" + "".join(f"<string>{v}</string>" for v in values) + "</stringArray></arguments>"


def job_type(kind: str) -> str:
    return f"<jobType><enumeration><enumerationValue><{kind}/></enumerationValue></enumeration></jobType>"


def count(n: int, tag: str = "count") -> str:
    return f'<{tag}><integer value="{n}"/></{tag}>'


def submit(p: Pilot, file: Path, document: str) -> list[str]:
    file.write_text(textwrap.dedent(document))
    proc = p.cli("submit", str(file), check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def show(p: Pilot, job_id: str) -> ET.Element:
    return ET.fromstring(p.cli("show", job_id, "--xml").stdout)


def final(p: Pilot, job_id: str, *, timeout: float = 60) -> ET.Element:
    """The job's SSS XML ('pilot show') once its State is final."""
    root: list[ET.Element] = []

    def ended() -> bool:
        root[:] = [show(p, job_id)]
        return (root[0].findtext("State") or "") in ("Completed", "Failed", "Canceled")

    wait_for(ended, timeout=timeout, what=f"job {job_id} final")
    return root[0]


def seen(work: Path, name: str) -> dict[int, dict[str, Any]]:
    """rank -> what that task recorded."""
    return {int(f.suffix[1:]): json.loads(f.read_text()) for f in work.glob(f"{name}.*") if f.suffix[1:].isdigit()}


def test_pilot_submit_runs_every_job_of_a_document_and_show_reports_it(pilot: Pilot, work: Path) -> None:
    """Two jobs in one document through 'pilot submit': arguments, directory, environment, stdin and
    several stdout/stderr destinations as each task saw them; 'pilot show' gives State and Delivered."""
    (work / "sub").mkdir()
    (work / "in.txt").write_text("input line\n")
    ids = submit(
        pilot,
        work / "two.jrdl",
        f"""
        <jrdl xmlns="http://www.moredream.org/jrdl">
          <substitutionDef name="W">{s(str(work))}</substitutionDef>
          <job>
            <executable><path><substitutionRef name="W"/>{s("/record.py")}</path></executable>
            {args(s(f"{work}/first"), s("two words"), '<substitutionRef name="W"/>' + s("/x"))}
            <directory><path><substitutionRef name="W"/>{s("/sub")}</path></directory>
            <environment><hashtable>
              <entry name="JRDL_A">{s("a value")}</entry>
              <entry name="JRDL_B"><substitutionRef name="W"/>{s(":b")}</entry>
            </hashtable></environment>
            {path("stdin", f"{work}/in.txt")}
            {paths("stdout", "out1", f"{work}/out2", "out3")}
            {paths("stderr", "err1", "err2")}
          </job>
          <job>
            {path("executable", f"{work}/record.py")}
            {args(s(f"{work}/second"))}
          </job>
        </jrdl>
        """,
    )
    assert len(ids) == 2
    for job_id in ids:
        root = final(pilot, job_id)
        assert root.findtext("State") == "Completed", ET.tostring(root)
        delivered = root.find("Delivered")
        assert delivered is not None and delivered.findtext("Processors") == "1"
    (first,) = seen(work, "first").values()
    assert first["argv"] == ["two words", f"{work}/x"]
    assert first["cwd"] == str(work / "sub")
    assert first["env"]["JRDL_A"] == "a value" and first["env"]["JRDL_B"] == f"{work}:b"
    assert first["stdin"] == "input line\n"
    for out in (work / "sub/out1", work / "out2", work / "sub/out3"):  # relative: in the job's directory
        assert out.read_text() == f"out {work}/first 0\n", out
    for err in (work / "sub/err1", work / "sub/err2"):
        assert err.read_text() == f"err {work}/first 0\n", err
    (second,) = seen(work, "second").values()
    assert second["argv"] == [] and second["stdin"] == ""


def static_facts(p: Pilot) -> bool:
    """Whether matching still sees the nodes' architecture and OS once heartbeats came (the load values a
    heartbeat brings replace them until the node-fact fix of pilot/scheduler lands)."""
    wait_for(lambda: p.cli("nodes").stdout.count("np_load_long") == 3, timeout=30, what="3 nodes' load values")
    return p.cli("nodes").stdout.count("opsys") == 3


def test_submit_jrdl_from_python_with_reserved_substitutions(
    pilot: Pilot, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submit_jrdl returns one Job per <job>, followed like any other; Table 1's names resolve to the
    submitter's home, user and directory, the job's id, and the nodes' CPU type and OS."""
    import getpass

    monkeypatch.chdir(work)
    host = ("GLOBUS_HOST_CPUTYPE", "GLOBUS_HOST_MANUFACTURER", "GLOBUS_HOST_OSNAME", "GLOBUS_HOST_OSVERSION")

    def document(*refs: str) -> str:
        return f"""
        <jrdl>
          <job>
            <executable><path><substitutionRef name="CUR_DIRL"/>{s("/record.py")}</path></executable>
            {args(s("reserved"), *(f'<substitutionRef name="{r}"/>' for r in refs))}
            {path("directory", ".")}
          </job>
        </jrdl>
        """

    ex = pilot.executor()
    (job,) = ex.submit_jrdl(document("HOME", "LOGNAME", "CUR_DIRL", "JOBID"))
    status = job.wait(timeout=60)
    assert status is not None and status.state is psij.JobState.COMPLETED, status
    (got,) = seen(work, "reserved").values()
    assert got["argv"] == [os.path.expanduser("~"), getpass.getuser(), str(work), job.native_id]
    assert got["cwd"] == str(work)  # "." is the submitter's directory
    root = show(pilot, str(job.native_id))
    assert root.findtext("State") == "Completed"
    if not static_facts(pilot):
        with pytest.raises(psij.InvalidJobException, match="the nodes do not report their architecture"):
            ex.submit_jrdl(document(*host))
        return
    (job,) = ex.submit_jrdl(document(*host))
    status = job.wait(timeout=60)
    assert status is not None and status.state is psij.JobState.COMPLETED, status
    got = seen(work, "reserved")[0]
    assert got["argv"] == [platform.machine(), "unknown", platform.system(), platform.release()]


def test_submit_jrdl_refuses_the_whole_document_naming_the_element_and_line(pilot: Pilot, work: Path) -> None:
    """A document whose second job is wrong is refused whole: the first job never runs."""
    ex = pilot.executor()
    document = f"""<jrdl>
      <job>{path("executable", f"{work}/record.py")}{args(s(f"{work}/never"))}</job>
      <job>
        {path("executable", "/bin/true")}
        <executable><path><substitutionRef name="NOPE"/></path></executable>
      </job>
    </jrdl>"""
    with pytest.raises(psij.InvalidJobException) as info:
        ex.submit_jrdl(document)
    assert "line 5, <executable>: appears twice in <job> (first on line 4)" in str(info.value)
    with pytest.raises(psij.InvalidJobException, match=r'line 5, <substitutionRef>: substitutionRef name="NOPE"'):
        ex.submit_jrdl(document.replace(path("executable", "/bin/true"), ""))
    laughs = '<?xml version="1.0"?><!DOCTYPE jrdl [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
    (work / "laughs.jrdl").write_text(laughs + f"<jrdl><job>{path('executable', '&b;')}</job></jrdl>")
    proc = pilot.cli("submit", str(work / "laughs.jrdl"), check=False)
    assert proc.returncode == 2 and "may not contain a DTD, entity declarations or external references" in proc.stderr
    assert ex.list() == []  # nothing of any of these documents was accepted
    assert not list(work.glob("never.*"))


def test_job_types_and_library_path(pilot: Pilot, work: Path) -> None:
    """single: one process holding count cores; htc: count one-core processes; libraryPath prepended."""
    ids = submit(
        pilot,
        work / "types.jrdl",
        f"""
        <jrdl>
          <job>
            {path("executable", f"{work}/record.py")}{args(s(f"{work}/single"))}
            {job_type("single")}{count(2)}
            {paths("libraryPath", "/opt/a/lib", "/opt/b/lib")}
            <environment><hashtable><entry name="LD_LIBRARY_PATH">{s("/already")}</entry></hashtable></environment>
          </job>
          <job>
            {path("executable", f"{work}/record.py")}{args(s(f"{work}/htc"))}
            {job_type("htc")}<resource>{count(3)}</resource>
            {paths("libraryPath", "/opt/c/lib")}
          </job>
        </jrdl>
        """,
    )
    for job_id in ids:
        assert final(pilot, job_id).findtext("State") == "Completed"
    (single,) = seen(work, "single").values()
    assert len(single["cpus"]) == min(2, os.cpu_count() or 1)
    assert single["env"]["LD_LIBRARY_PATH"] == "/opt/a/lib:/opt/b/lib:/already"
    htc = seen(work, "htc")
    assert sorted(htc) == [0, 1, 2]
    assert all(t["env"]["LD_LIBRARY_PATH"].split(":")[0] == "/opt/c/lib" for t in htc.values())
    root = show(pilot, ids[1])
    delivered = root.find("Delivered")
    assert delivered is not None and delivered.findtext("Processors") == "3"


def test_subjobs_run_their_own_attributes_figure_5(pilot: Pilot, work: Path) -> None:
    """The spec's Figure 5: a job of count 2 with one subjob runs the job's a.out once and b.out once."""
    for name in ("a.out", "b.out"):
        (work / name).write_text(f'#!/bin/sh\nexec {work}/record.py {work}/{name}-ran "$@"\n')
        (work / name).chmod(0o755)
    (job_id,) = submit(
        pilot,
        work / "fig5.jrdl",
        f"""
        <jrdl>
          <job>
            {path("executable", "a.out")}{path("directory", str(work))}
            {job_type("htc")}
            <subjob>{path("executable", "b.out")}{args(s("from-subjob"))}</subjob>
            <resource>{count(2)}</resource>
          </job>
        </jrdl>
        """,
    )
    root = final(pilot, job_id)
    assert root.findtext("State") == "Completed", ET.tostring(root)
    (a,) = seen(work, "a.out-ran").values()
    (b,) = seen(work, "b.out-ran").values()
    assert a["argv"] == [] and b["argv"] == ["from-subjob"]
    assert a["env"]["PILOT_TASK_GROUP"] != b["env"]["PILOT_TASK_GROUP"]
    assert [tg.findtext("TaskCount") for tg in root.findall("TaskGroup")] == ["1", "1"]


def test_xmpi_is_one_mpirun_launch_over_count(pilot: Pilot, work: Path) -> None:
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed (CI installs Debian's openmpi-bin through .ci/slurm.sh)")
    env = ""
    if os.geteuid() == 0:  # Open MPI refuses root unless told twice
        env = "".join(
            f'<entry name="{k}">{s("1")}</entry>' for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
        )
    (job_id,) = submit(
        pilot,
        work / "mpi.jrdl",
        f"""
        <jrdl>
          <job>
            {path("executable", f"{work}/record.py")}{args(s(f"{work}/mpi"))}
            {job_type("xmpi")}{count(2)}{paths("libraryPath", "/opt/mpi/lib")}
            <environment><hashtable>{env}<entry name="JRDL_A">{s("x")}</entry></hashtable></environment>
          </job>
        </jrdl>
        """,
    )
    root = final(pilot, job_id, timeout=90)
    assert root.findtext("State") == "Completed", ET.tostring(root)
    ranks = seen(work, "mpi")
    assert sorted(ranks) == [0, 1]
    assert {r["env"]["OMPI_COMM_WORLD_SIZE"] for r in ranks.values()} == {"2"}
    assert {r["env"]["JRDL_A"] for r in ranks.values()} == {"x"}
    assert {r["env"]["LD_LIBRARY_PATH"].split(":")[0] for r in ranks.values()} == {"/opt/mpi/lib"}  # each rank's


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f"{t % 1:.3f}"[1:] + "Z"


def test_start_time_start_before_and_duration(pilot: Pilot, work: Path) -> None:
    """jobStartTime: not started before it (explain says until when); jobStartBefore: FAILED when the
    pilot is full until after it; jobDuration: the walltime, enforced."""
    # (10 s ahead: the submit and explain below are CLI processes, each a second or more on a loaded
    # machine, and explain must run before the start time)
    start = time.time() + 10
    blocker = f"{path('executable', '/bin/sleep')}{args(s('3'))}{job_type('htc')}{count(3 * 2)}"
    timed = (
        f"{path('executable', f'{work}/record.py')}{args(s(f'{work}/timed'))}<jobStartTime>{iso(start)}</jobStartTime>"
    )
    late = f"{path('executable', f'{work}/record.py')}{args(s(f'{work}/late'))}<jobStartBefore>PT1S</jobStartBefore>"
    busy, waits, fails = submit(
        pilot, work / "t.jrdl", f"<jrdl><job>{blocker}</job><job>{timed}</job><job>{late}</job></jrdl>"
    )
    explained = pilot.cli("explain", waits).stdout
    assert f"does not start before its start time (JRDL jobStartTime) {iso(start)[:19]}Z" in explained, explained
    root = final(pilot, fails)
    assert root.findtext("State") == "Failed"
    message = root.findtext("StatusMessage") or ""
    assert "had to start within 1 s of its submission (JRDL jobStartBefore)" in message, ET.tostring(root)
    assert not seen(work, "late")
    assert final(pilot, waits).findtext("State") == "Completed"
    (got,) = seen(work, "timed").values()
    assert got["start"] >= start  # not started before its start time
    assert final(pilot, busy).findtext("State") == "Completed"
    (long,) = submit(
        pilot,
        work / "d.jrdl",
        f"<jrdl><job>{path('executable', '/bin/sleep')}{args(s('60'))}<jobDuration>PT1S</jobDuration></job></jrdl>",
    )
    root = final(pilot, long)
    assert root.findtext("State") == "Failed"
    message = root.findtext("StatusMessage") or ""
    assert "walltime" in message and "duration" in message, message


def test_a_waiting_document_survives_a_daemon_restart(pilot: Pilot, work: Path) -> None:
    """A JRDL job waiting for its start time, with its stream fan-out, runs after kill -9 and 'pilot up'."""
    start = time.time() + 6
    (job_id,) = submit(
        pilot,
        work / "r.jrdl",
        f"""
        <jrdl><job>
          {path("executable", f"{work}/record.py")}{args(s(f"{work}/restarted"))}{path("directory", str(work))}
          {paths("stdout", "r1", "r2")}
          <jobStartTime>{iso(start)}</jobStartTime>
        </job></jrdl>
        """,
    )
    pilot.kill9()
    pilot.up_again()
    root = final(pilot, job_id)
    assert root.findtext("State") == "Completed", ET.tostring(root)
    (got,) = seen(work, "restarted").values()
    assert got["start"] >= start
    assert (work / "r1").read_text() == (work / "r2").read_text() == f"out {work}/restarted 0\n"


def test_every_destination_receives_every_process_stream(pilot: Pilot, work: Path) -> None:
    """htc of 3: each destination holds the three processes' whole output (appended to, not truncated by
    each), including one named by the job's id (JOBID)."""
    (work / "all.out").write_text("from an earlier run\n")
    (job_id,) = submit(
        pilot,
        work / "fan.jrdl",
        f"""
        <jrdl><job>
          {path("executable", f"{work}/record.py")}{args(s(f"{work}/fan"))}{path("directory", str(work))}
          {job_type("htc")}{count(3)}
          <stdout><pathArray>
            <path>{s("all.out")}</path><path>{s("id-")}<substitutionRef name="JOBID"/>{s(".out")}</path>
          </pathArray></stdout>
          <stderr><pathArray><path>{s("e1")}</path><path>{s("e2")}</path></pathArray></stderr>
        </job></jrdl>
        """,
    )
    assert final(pilot, job_id).findtext("State") == "Completed"
    expected = sorted(f"out {work}/fan {rank}" for rank in range(3))
    assert sorted((work / "all.out").read_text().splitlines()) == expected  # truncated once, before any ran
    assert sorted((work / f"id-{job_id}.out").read_text().splitlines()) == expected
    errs = sorted(f"err {work}/fan {rank}" for rank in range(3))
    assert sorted((work / "e1").read_text().splitlines()) == sorted((work / "e2").read_text().splitlines()) == errs


def test_files_staged_in_linked_staged_out_and_cleaned_up(pilot: Pilot, work: Path) -> None:
    """fileStageIn, fileStageOut and fileCleanUp through the staging every language shares: the input is
    a symbolic link in the job's directory (the spec: "a symbolic link from the cache to the local file"),
    the output is copied to its URL after the job, the cleaned-up path is gone."""
    source = work / "input.dat"
    source.write_text("staged in\n")
    script = work / "use.sh"
    script.write_text(
        "#!/bin/sh\n[ -L in.dat ] && echo link > kind.txt\ncat in.dat > result.txt\necho scratch > scratch.txt\n"
    )
    script.chmod(0o755)
    jobdir = work / "jobdir"
    jobdir.mkdir()
    target = work / "out" / "result.txt"
    target.parent.mkdir()
    [job_id] = submit(
        pilot,
        work / "staging.jrdl",
        f"""
        <jrdl>
          <job>
            {path("executable", str(script))}
            {path("directory", str(jobdir))}
            <fileStageIn><fileInputArray><fileInput>
              <url><urlElement value="file://{source}"/></url><path>{s("in.dat")}</path>
            </fileInput></fileInputArray></fileStageIn>
            <fileStageOut><fileOutputArray><fileOutput>
              <path>{s("result.txt")}</path><url><urlElement value="file://{target}"/></url>
            </fileOutput></fileOutputArray></fileStageOut>
            {paths("fileCleanUp", "scratch.txt")}
          </job>
        </jrdl>
        """,
    )
    assert final(pilot, job_id).findtext("State") == "Completed"
    assert target.read_text() == "staged in\n"
    assert (jobdir / "kind.txt").read_text() == "link\n"
    assert not (jobdir / "scratch.txt").exists()

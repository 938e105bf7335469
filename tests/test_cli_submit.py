"""Bulk submission from the command line against a real pilot: --array, --each-line and --from-json with
placeholders in arguments and output paths, resources, duration, directory and environment; --wait whose
exit status counts only real failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pilot_waits import agents_active

PYTHON = sys.executable
TWO = '[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 2\nmemory_per_node = "1G"\n'

pytestmark = pytest.mark.timeout(120)


def cli(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "pilot", *args],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def shown(rundir: Path, job_id: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cli("show", "--rundir", str(rundir), job_id, "--json").stdout)[0]
    return out


@pytest.fixture
def pilot(start_pilot: Any) -> Any:
    p = start_pilot(TWO, name="p")
    agents_active(p.executor(), 2)
    return p


def test_array_fills_index_into_arguments_and_output_paths(pilot: Any, tmp_path: Path) -> None:
    rd = str(pilot.rundir.path)
    out = tmp_path / "out"
    out.mkdir()
    proc = cli(
        "submit", "--rundir", rd, "--array", "1-4", "--stdout", f"{out}/task-{{i}}.txt", "--job-name", "t{i}", "--wait",
        "--", "/bin/sh", "-c", "echo task {i} of ${HOME:+home}; exit $(( {i} % 2 ))",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # two of them failed for real
    head, *lines = proc.stdout.splitlines()
    run = head.split(":")[0]
    assert head == f"{run}: 4 job(s): 1-4"
    assert lines[-1] == "2 completed, 2 failed"
    assert lines[0].startswith("1 FAILED, exit 1: ") and lines[1] == "2 COMPLETED"
    for i in range(1, 5):
        assert (out / f"task-{i}.txt").read_text() == f"task {i} of home\n"  # ${HOME...} left to the shell
    rows = json.loads(cli("jobs", "--rundir", rd, "--run", run, "--json").stdout)
    assert [(r["id"], r["name"], r["state"]) for r in rows] == [
        ("1", "t1", "FAILED"),
        ("2", "t2", "COMPLETED"),
        ("3", "t3", "FAILED"),
        ("4", "t4", "COMPLETED"),
    ]
    stepped = cli("submit", "--rundir", rd, "--array", "0-20:10,7", "--json", "--", "/bin/echo", "{i}")
    assert stepped.returncode == 0, stepped.stderr
    ids = json.loads(stepped.stdout)["ids"]
    assert [shown(pilot.rundir.path, i)["command"] for i in ids] == [["/bin/echo", str(n)] for n in (0, 10, 20, 7)]


def test_each_line_with_environment_and_directory(pilot: Any, tmp_path: Path) -> None:
    rd = str(pilot.rundir.path)
    (tmp_path / "inputs").write_text("alpha\n\nbeta gamma\n")
    work = tmp_path / "work"
    work.mkdir()
    proc = cli(
        "submit", "--rundir", rd, "--each-line", str(tmp_path / "inputs"), "--directory", str(work),
        "--env", "GREETING=hello", "--stdout", "line-{i}.out", "--wait",
        "--", "/bin/sh", "-c", 'echo "$GREETING {} ($PWD)"',
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert proc.stdout.splitlines()[-1] == "2 completed"
    assert (work / "line-1.out").read_text() == f"hello alpha ({work})\n"
    assert (work / "line-2.out").read_text() == f"hello beta gamma ({work})\n"


def test_from_json_with_resources_and_duration(pilot: Any, tmp_path: Path) -> None:
    rd = str(pilot.rundir.path)
    jobs = [
        {"command": ["/bin/true"], "cores": 2, "name": "wide"},
        {"command": "/bin/true", "memory": "256M", "duration": "1m", "processes": 2},
        {"command": ["/bin/sh", "-c", "exit 4"]},
    ]
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    proc = cli("submit", "--rundir", rd, "--from-json", str(tmp_path / "jobs.json"), "--wait", "--json")
    assert proc.returncode == 1, proc.stderr
    done = json.loads(proc.stdout)
    assert done["counts"] == {"completed": 2, "failed": 1, "skipped": 0, "canceled": 0}
    wide, two, bad = (shown(pilot.rundir.path, i) for i in done["ids"])
    assert wide["name"] == "wide" and wide["cores"] == 2
    assert two["cores"] == 2  # two processes of one core
    assert bad["exit_code"] == 4


def test_wait_does_not_count_a_job_skipped_for_its_dependency(pilot: Any) -> None:
    rd = str(pilot.rundir.path)
    first = cli("submit", "--rundir", rd, "--json", "--", "/bin/true")
    assert first.returncode == 0, first.stderr
    [ok] = json.loads(first.stdout)["ids"]
    cleanup = cli("submit", "--rundir", rd, "--depends-on", f"OnFailure:{ok}", "--wait", "--", "/bin/echo", "x")
    assert cleanup.returncode == 0, (cleanup.stdout, cleanup.stderr)
    lines = cleanup.stdout.splitlines()
    assert "FAILED (skipped, not a failure): not started: dependency OnFailure" in lines[1]
    assert lines[-1] == "0 completed, 1 skipped"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--array", "5-1", "--", "x"], "--array '5-1': in '5-1' the range is empty"),
        (["--array", "a-b", "--", "x"], "--array 'a-b': give ranges such as 1-100"),
        (["--array", "1-3"], "give the command after --"),
        (["--env", "NOVALUE", "--", "x"], "argument --env: 'NOVALUE': give NAME=VALUE"),
        (["--memory", "lots", "--", "x"], "argument --memory: 'lots' is not a size"),
        (["--gpus", "-1", "--", "x"], "argument --gpus: -1 must be at least 0"),
        (["--each-line", "/nonexistent", "--", "x"], "--each-line /nonexistent: cannot read it"),
        (["--from-json", "BAD", "--", "x"], "--from-json takes its commands from the file"),
        (["a.xml", "b.xml"], "give one job document"),
    ],
)
def test_bad_submissions_are_refused_naming_the_fault(pilot_home: Path, args: list[str], says: str) -> None:
    proc = cli("submit", *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert says in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{", "not JSON: "),
        ("[]", "give a non-empty list of jobs"),
        ('[{"command": ["x"], "colour": 1}]', "job 0: unknown key 'colour'; a job takes command, name"),
        ('[{"command": []}]', "job 0: 'command' must be a list of strings"),
        ('[{"command": "x"}, {"command": "y", "cores": 0}]', "job 1: 'cores' must be a whole number >= 1"),
        ('[{"command": "x", "memory": "lots"}]', "job 0: memory = 'lots'"),
    ],
)
def test_bad_json_jobs_are_refused_naming_the_job_and_key(
    pilot_home: Path, tmp_path: Path, content: str, says: str
) -> None:
    path = tmp_path / "jobs.json"
    path.write_text(content)
    proc = cli("submit", "--from-json", str(path))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert f"--from-json {path}" in proc.stderr and says in proc.stderr, proc.stderr


def test_resubmit_runs_the_failed_jobs_of_a_run_again(pilot: Any, tmp_path: Path) -> None:
    rd = str(pilot.rundir.path)
    flag = tmp_path / "fixed"
    first = cli(
        "submit", "--rundir", rd, "--array", "1-4", "--json", "--wait",
        "--", "/bin/sh", "-c", f"[ {{i}} -le 2 ] || [ -e {flag} ]",
    )  # fmt: skip
    assert first.returncode == 1
    run = json.loads(first.stdout)["run"]
    [ok] = json.loads(cli("submit", "--rundir", rd, "--json", "--", "/bin/true").stdout)["ids"]
    skipped = cli("submit", "--rundir", rd, "--run", run, "--depends-on", f"OnFailure:{ok}", "--wait", "--", "x")
    assert skipped.returncode == 0  # in the run, FAILED as skipped: not run again
    flag.touch()
    again = cli("resubmit", "--rundir", rd, "--failed", run, "--wait", "--json")
    assert again.returncode == 0, (again.stdout, again.stderr)
    done = json.loads(again.stdout)
    assert done["counts"] == {"completed": 2, "failed": 0, "skipped": 0, "canceled": 0}
    new = [shown(pilot.rundir.path, i) for i in done["ids"]]
    assert [j["command"][-1] for j in new] == [f"[ 3 -le 2 ] || [ -e {flag} ]", f"[ 4 -le 2 ] || [ -e {flag} ]"]
    assert {j["run"] for j in new} == {done["run"]} and done["run"] != run
    nothing = cli("resubmit", "--rundir", rd, "--failed", done["run"])
    assert (
        nothing.returncode == 0 and nothing.stdout.strip() == f"no failed job in run {done['run']}: nothing to resubmit"
    )
    unknown = cli("resubmit", "--rundir", rd, "--failed", "nope")
    assert unknown.returncode == 1 and "no job of run 'nope' in this pilot" in unknown.stderr

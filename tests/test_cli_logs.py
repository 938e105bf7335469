"""Output and failures where users look, through the real CLI against a real pilot: ``pilot run`` and
``pilot submit`` keep their tasks' output (the node's stream file, or the files they name), ``pilot
logs ID`` prints its tail and how the job ended (also after ``pilot down``), and failure lines name the
job and say why."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pilot_waits import agents_active, wait_for

PYTHON = sys.executable
CONFIG = '[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n'

pytestmark = pytest.mark.timeout(120)


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "pilot", *args], env=dict(os.environ), capture_output=True, text=True, timeout=60, cwd=cwd
    )


@pytest.fixture
def pilot(start_pilot: Any) -> Any:
    p = start_pilot(CONFIG)
    agents_active(p.executor(), 1)
    return p


def logs_when(rd: str, job_id: str, *more: str, want: str, said: str = "") -> subprocess.CompletedProcess[str]:
    """``pilot logs`` once its stdout holds ``want`` (and its stderr ``said``): an agent appends what a
    task's pipe still held a moment after the task's end is reported, and a task's first output reaches
    the node's stream file a moment before its start reaches the daemon."""
    found: list[subprocess.CompletedProcess[str]] = []

    def shows() -> bool:
        found[:] = [cli("logs", "--rundir", rd, job_id, *more)]
        return want in found[0].stdout and said in found[0].stderr

    wait_for(shows, 20, f"pilot logs {job_id} to show {want!r}")
    return found[0]


def test_pilot_run_keeps_output_names_failed_jobs_and_logs_prints_output_and_exit(pilot: Any) -> None:
    rd = str(pilot.rundir.path)
    proc = cli(
        "run", "--rundir", rd, "-n", "3", "--", "/bin/sh", "-c", 'echo "out of $PILOT_NODE"; echo oops >&2; exit 3'
    )
    assert proc.returncode == 1, proc.stderr
    failed = re.findall(r"^  failed: job (\d+): exit 3: (.*)$", proc.stdout, re.M)
    assert len(failed) == 3, proc.stdout
    job_id, why = failed[0]
    assert "exited with code 3" in why and f"'pilot logs {job_id}' for its output" in why, why
    logs = logs_when(rd, job_id, want="out of local-0\n")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == "out of local-0\n"
    assert logs.stderr.splitlines() == ["oops", f"pilot logs: job {job_id} FAILED, exit 3: {why.split(' (')[0]}"]

    quiet = cli("run", "--rundir", rd, "-n", "1", "--no-output", "--", "/bin/sh", "-c", "echo lost; exit 4")
    (job_id,) = re.findall(r"failed: job (\d+): exit 4", quiet.stdout)
    logs = cli("logs", "--rundir", rd, job_id)
    assert logs.returncode == 0 and logs.stdout == "", logs
    assert logs.stderr.splitlines() == [
        f"pilot logs: job {job_id} has no output kept: it was submitted with its output discarded",
        f"pilot logs: job {job_id} FAILED, exit 4: the process exited with code 4 on node local-0",
    ]


def test_submit_wait_names_signals_and_logs_shows_the_tail_then_after_down_too(pilot: Any) -> None:
    rd = str(pilot.rundir.path)
    proc = cli("submit", "--rundir", rd, "--wait", "--", "/bin/sh", "-c", "seq 1 300; kill -KILL $$")
    assert proc.returncode == 1, proc.stderr
    run_line, end_line, counts = proc.stdout.splitlines()
    job_id = run_line.rsplit(" ", 1)[1]
    assert end_line == f"{job_id} FAILED, exit -9: the process was killed by signal 9 (SIGKILL) on node local-0"
    assert counts == "0 completed, 1 failed"
    assert "'pilot logs ID'" in proc.stderr
    logs = logs_when(rd, job_id, "-n", "3", want="300\n")
    assert logs.stdout == "298\n299\n300\n"
    assert logs.stderr.splitlines() == [
        f"pilot logs: job {job_id}: the last 3 of 300 lines of its streamed stdout (-n 0: all)",
        f"pilot logs: job {job_id} FAILED, exit -9: the process was killed by signal 9 (SIGKILL) on node local-0",
    ]
    assert cli("logs", "--rundir", rd, job_id).stdout == "".join(f"{i}\n" for i in range(201, 301))  # default: 100
    assert cli("logs", "--rundir", rd, job_id, "-n", "0").stdout == "".join(f"{i}\n" for i in range(1, 301))

    running = cli("submit", "--rundir", rd, "--", "/bin/sh", "-c", "echo started; exec sleep 30")
    running_id = running.stdout.split()[-1]
    logs = logs_when(rd, running_id, want="started\n", said=" is ACTIVE")
    assert (
        logs.stderr
        == f"pilot logs: job {running_id} is ACTIVE: it has not ended ('pilot logs {running_id} -f' follows it)\n"
    )

    assert cli("down", "--rundir", rd).returncode == 0
    after = cli("logs", "--rundir", rd, job_id, "-n", "1")
    assert after.returncode == 0, after.stderr
    assert after.stdout == "300\n"
    assert after.stderr.splitlines()[-1] == (
        f"pilot logs: job {job_id} FAILED, exit -9: the process was killed by signal 9 (SIGKILL) on node local-0"
    )
    stopped = cli("logs", "--rundir", rd, running_id)
    assert stopped.stdout == "started\n" and f"job {running_id} CANCELED" in stopped.stderr, stopped

    # A new life of the pilot numbers its jobs from 1 again: their output is never mixed with the last's,
    # and the last life's job is found in its life's files while the new life has no job of its id.
    pilot.up_again()
    agents_active(pilot.executor(), 1)
    earlier = cli("logs", "--rundir", rd, job_id, "-n", "1")
    assert earlier.stdout == "300\n", earlier
    assert f"job {job_id} FAILED, exit -9" in earlier.stderr
    again = cli("submit", "--rundir", rd, "--wait", "--", "/bin/echo", "a new life")
    new_id = again.stdout.split()[-4]  # "<run>: 1 job(s): <id>" then "<id> COMPLETED" and the counts
    assert new_id == job_id, again.stdout
    assert logs_when(rd, new_id, want="a new life\n").stdout == "a new life\n"
    # A third life: the second life's job 1, from the history, is read from the second life's files.
    assert cli("down", "--rundir", rd).returncode == 0
    pilot.up_again()
    agents_active(pilot.executor(), 1)
    assert cli("logs", "--rundir", rd, job_id).stdout == "a new life\n"


def test_logs_prints_the_files_a_job_named_and_refuses_an_unknown_id(pilot: Any, tmp_path: Path) -> None:
    rd = str(pilot.rundir.path)
    proc = cli(
        "submit", "--rundir", rd, "--array", "1-2", "--stdout", "out-{i}.txt", "--stderr", "err-{i}.txt", "--wait",
        "--", "/bin/sh", "-c", "echo to file {i}; echo complaint {i} >&2; exit $(( {i} - 1 ))",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    first, second = proc.stdout.splitlines()[0].split(": ")[-1].split()  # "1 2"
    logs = cli("logs", "--rundir", rd, second)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == "to file 2\n"
    assert logs.stderr.splitlines() == [
        "complaint 2",
        f"pilot logs: job {second} FAILED, exit 1: the process exited with code 1 on node local-0",
    ]
    assert cli("logs", "--rundir", rd, first).stderr.endswith(f"pilot logs: job {first} COMPLETED, exit 0\n")
    (tmp_path / "out-1.txt").unlink()
    gone = cli("logs", "--rundir", rd, first)
    assert f"cannot read its stdout_path {tmp_path}/out-1.txt: No such file or directory" in gone.stderr, gone.stderr

    assert cli("down", "--rundir", rd).returncode == 0
    after = cli("logs", "--rundir", rd, second)  # the history keeps where its output went
    assert after.stdout == "to file 2\n" and after.stderr.startswith("complaint 2\n"), after

    unknown = cli("logs", "--rundir", rd, "999")
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert unknown.stderr.startswith("pilot logs: no job '999' in "), unknown.stderr
    assert "Traceback" not in unknown.stderr

    refused = cli("submit", "--rundir", rd, "--no-output", str(tmp_path / "job.xml"))  # refused before connecting
    assert refused.returncode == 2 and "--no-output is for jobs from a command" in refused.stderr, refused.stderr


def test_an_embedded_pilot_run_with_failures_keeps_its_run_directory_and_names_it(
    pilot_home: Path, tmp_path: Path
) -> None:
    """With no pilot up, ``pilot run`` starts an embedded one whose run directory goes when it stops: when
    some job failed it is kept, and the failure lines name it, so the commands they suggest work."""
    config = tmp_path / "one.toml"
    config.write_text(CONFIG)
    proc = cli("run", "--config", str(config), "-n", "2", "--", "/bin/sh", "-c", "echo kept-out; exit 5")
    assert proc.returncode == 1, proc.stderr
    assert "starting an embedded one" in proc.stderr and "Traceback" not in proc.stderr
    (name,) = {m for m in re.findall(r"'pilot logs \d+ --name (embedded-\d+)' for its output", proc.stdout)}
    assert f"is kept for its jobs' output and history: {pilot_home / name}" in proc.stderr
    job_id = re.findall(r"^  failed: job (\d+): exit 5: ", proc.stdout, re.M)[0]
    logs = cli("logs", "--name", name, job_id)
    assert logs.returncode == 0 and logs.stdout == "kept-out\n", logs
    assert logs.stderr.splitlines()[-1].startswith(f"pilot logs: job {job_id} FAILED, exit 5")
    shown = cli("show", "--name", name, job_id)
    assert shown.returncode == 0 and shown.stdout.startswith(f"job {job_id} (/bin/sh): FAILED, exit 5"), shown

    clean = cli("run", "--config", str(config), "-n", "2", "--", "/bin/true")
    assert clean.returncode == 0, clean.stderr
    assert "kept" not in clean.stderr
    assert sorted(p.name for p in pilot_home.iterdir()) == [name]  # a run that went well leaves nothing

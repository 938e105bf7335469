"""Output streaming on a real pilot: tasks' stdout/stderr framed into a few stream files per node, read
back by the client and by 'pilot logs' (also -f on a running job), with real agents and processes."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import PYTHON, Pilot
from pilot_waits import agents_active, wait_for

import client as psij
from client.output import OutputReader, job_output
from pilot.model.output_stream import STREAM_OUTPUT, SUFFIX

pytestmark = pytest.mark.timeout(240)

STREAMED = """
[pilot]
heartbeat_interval = 0.5
stream_output = true

[allocation]
lrm = "local"
nodes = 2
cores_per_node = 2
"""


def test_2000_streamed_echo_tasks_leave_a_file_per_node_and_every_line_reads_back(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    pilot = start_pilot(STREAMED, name="streamed")
    ex = pilot.executor()
    agents_active(ex, 2)
    work = tmp_path / "work"
    work.mkdir()
    jobs = [psij.Job(psij.JobSpec("/bin/echo", [f"line {i}"], directory=work)) for i in range(2000)]
    ex.submit_all(jobs)
    for job in jobs:
        status = job.wait(timeout=120)
        assert status is not None and status.state is psij.JobState.COMPLETED, status
    assert not any(work.iterdir()), "a streamed task left a file of its own"
    files = sorted(pilot.rundir.agents_dir.rglob(f"*{SUFFIX}"))
    assert [f.name for f in files] == [f"local-0{SUFFIX}", f"local-1{SUFFIX}"], files
    for i, job in enumerate(jobs):
        assert job.native_id is not None
        # The agent appends what a pipe held when its task exited a moment after the exit's event.
        want, native_id = f"line {i}\n".encode(), job.native_id

        def read_back(native_id: str = native_id, want: bytes = want) -> bool:
            return job_output(native_id, rundir=pilot.rundir.path) == (want, b"")

        wait_for(read_back, 10, f"job {native_id}'s line")
    proc = pilot.cli("logs", str(jobs[1234].native_id))
    assert proc.stdout == "line 1234\n"
    assert proc.stderr == f"pilot logs: job {jobs[1234].native_id} COMPLETED, exit 0\n"  # how it ended, apart


def test_a_job_streams_by_its_custom_attribute_ranks_and_streams_apart_and_logs_follows_it(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    pilot = start_pilot()  # streaming is off for this pilot: the job asks for it
    ex = pilot.executor()
    gate = tmp_path / "gate"
    spec = psij.JobSpec(
        "/bin/sh",
        ["-c", f'echo "out $PILOT_RANK"; echo "err $PILOT_RANK" >&2; while [ ! -e {gate} ]; do sleep 0.05; done; '
               'echo "late $PILOT_RANK"'],
        directory=tmp_path,
        launcher="multiple",
        resources=psij.ResourceSpecV1(process_count=2),
        attributes=psij.JobAttributes(custom_attributes={STREAM_OUTPUT: True}),
    )  # fmt: skip
    job = psij.Job(spec)
    ex.submit(job)
    assert job.wait(timeout=60, target_states=[psij.JobState.ACTIVE]) is not None
    native_id = job.native_id
    assert native_id is not None
    follow = subprocess.Popen(
        [PYTHON, "-m", "pilot", "logs", native_id, "-f", "--rundir", str(pilot.rundir.path)],
        env=pilot.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    reader = OutputReader(native_id, rundir=pilot.rundir.path)
    seen: list[tuple[int, str, bytes]] = []
    wait_for(lambda: seen.extend(reader.read()) or len(seen) == 4, 30, "both ranks' first lines")
    assert sorted(seen) == [
        (0, "err", b"err 0\n"),
        (0, "out", b"out 0\n"),
        (1, "err", b"err 1\n"),
        (1, "out", b"out 1\n"),
    ]
    assert follow.poll() is None, "pilot logs -f ended while the job runs"
    gate.touch()
    status = job.wait(timeout=60)
    assert status is not None and status.state is psij.JobState.COMPLETED, status
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 0, err
    assert sorted(out.splitlines()) == ["late 0", "late 1", "out 0", "out 1"]
    *errs, ended = err.splitlines()
    assert sorted(errs) == ["err 0", "err 1"]
    assert ended == f"pilot logs: job {native_id} COMPLETED, exit 0"


def test_a_bad_stream_output_attribute_is_refused(start_pilot: Callable[..., Pilot]) -> None:
    ex = start_pilot().executor()
    job = psij.Job(psij.JobSpec("/bin/true", attributes=psij.JobAttributes(custom_attributes={STREAM_OUTPUT: "yes"})))
    with pytest.raises(psij.InvalidJobException, match=r"pilot\.stream_output"):
        ex.submit(job)


def test_a_task_writing_32_mib_is_streamed_whole_and_never_through_the_daemon(
    start_pilot: Callable[..., Pilot], tmp_path: Path
) -> None:
    pilot = start_pilot(STREAMED, name="big")
    ex = pilot.executor()
    agents_active(ex, 2)
    daemon = psutil.Process(pilot.pid)
    before = daemon.memory_info().rss
    size = 32 << 20
    job = psij.Job(psij.JobSpec("/bin/sh", ["-c", f"head -c {size} /dev/zero | tr '\\0' x"], directory=tmp_path))
    ex.submit(job)
    status = job.wait(timeout=120)
    assert status is not None and status.state is psij.JobState.COMPLETED, status
    assert job.native_id is not None
    native_id = job.native_id
    wait_for(lambda: len(job_output(native_id, rundir=pilot.rundir.path)[0]) == size, 30, "all 32 MiB")
    out, err = job_output(native_id, rundir=pilot.rundir.path)
    assert out == b"x" * size and err == b""
    # The output went pipe -> agent -> file: the daemon's memory did not grow by anything like it.
    assert daemon.memory_info().rss - before < size // 2, (before, daemon.memory_info().rss)

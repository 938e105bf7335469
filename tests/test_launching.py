"""Launching behaviour against a real pilot: what the task processes actually get and do.

Files written by the tasks are the evidence: their environment, working directory, standard
streams, affinity, rank variables, the order in which pre_launch, ranks and post_launch ran, and
the resources the pilot measured for them (Delivered).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pilot_waits import gone, read_pid, wait_for

import client as psij
from client import JobState

WAIT = 30.0
ENV = shutil.which("env") or "/usr/bin/env"
PY = sys.executable

FOUR_CORES = """
[allocation]
lrm = "local"
nodes = 1
cores_per_node = 4
gpus_per_node = 0
"""


# -- helpers ----------------------------------------------------------------------------------------


def sh(script: str, **kwargs: Any) -> psij.JobSpec:
    """A JobSpec running ``script`` with /bin/sh (the script itself must not use ``${...}``)."""
    return psij.JobSpec(executable="/bin/sh", arguments=["-c", script], **kwargs)


def py(code: str, **kwargs: Any) -> psij.JobSpec:
    return psij.JobSpec(executable=PY, arguments=["-c", textwrap.dedent(code)], **kwargs)


def run(ex: psij.JobExecutor, spec: psij.JobSpec, timeout: float = WAIT) -> psij.JobStatus:
    job = psij.Job(spec)
    ex.submit(job)
    status = job.wait(timeout=timeout)
    assert status is not None, f"job {job.native_id} not final after {timeout} s: {job.status}"
    return status


def completed(ex: psij.JobExecutor, spec: psij.JobSpec) -> psij.JobStatus:
    status = run(ex, spec)
    assert status.state is JobState.COMPLETED, status
    return status


def env_lines(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        k, sep, v = line.partition("=")
        if sep:
            out[k] = v
    return out


# -- pre_launch / post_launch -----------------------------------------------------------------------


def test_pre_launch_export_reaches_the_executable(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    pre = tmp_path / "pre.sh"
    pre.write_text("export GREETING='hello from pre'\nexport PATH=/opt/pre-bin:$PATH\n")
    out = tmp_path / "out"
    completed(ex, sh('echo "$GREETING"; echo "$PATH"', stdout_path=out, pre_launch=pre))
    greeting, path = out.read_text().splitlines()
    assert greeting == "hello from pre"
    assert path.startswith("/opt/pre-bin:")


def test_pre_and_post_launch_order_with_multiple_ranks(start_pilot, tmp_path: Path) -> None:
    """pre_launch runs once before any rank, post_launch once after every rank exited (the slowest
    rank finishes last), both write into the job's stdout, and post sees what pre exported."""
    pilot = start_pilot(FOUR_CORES)
    ex = pilot.executor()
    wd = tmp_path / "wd"
    wd.mkdir()
    seq = wd / "sequence"
    pre = tmp_path / "pre.sh"
    pre.write_text(f"echo pre-out\necho pre >> {seq}\nexport GREETING='hi there'\n")
    post = tmp_path / "post.sh"
    post.write_text(
        f"for i in 0 1 2; do [ -e {wd}/marker.$i ] || {{ echo missing marker $i; exit 1; }}; done\n"
        f"echo post >> {seq}\n"
        'echo "post-out $GREETING"\n'
    )
    rank = (
        # Rank 2 is the slowest: post_launch must still wait for it.
        'sleep "0.$((PILOT_RANK * 3))"; echo "rank $PILOT_RANK $GREETING"; '
        f"echo rank$PILOT_RANK >> {seq}; touch {wd}/marker.$PILOT_RANK"
    )
    out = wd / "stdout"
    out.write_text("stale output from an earlier run\n" * 10)
    st = completed(
        ex,
        sh(
            rank,
            directory=wd,
            stdout_path=out,
            pre_launch=pre,
            post_launch=post,
            launcher="multiple",
            resources=psij.ResourceSpecV1(process_count=3),
        ),
    )
    lines = out.read_text().splitlines()
    assert lines[0] == "pre-out"
    assert lines[-1] == "post-out hi there"
    assert sorted(lines[1:-1]) == [f"rank {i} hi there" for i in range(3)]
    order = seq.read_text().split()
    assert order[0] == "pre" and order[-1] == "post"
    assert sorted(order[1:-1]) == ["rank0", "rank1", "rank2"]
    assert (st.metadata or {})["processes"] >= 3


def test_failing_pre_launch_fails_the_job_before_any_rank(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    pre = tmp_path / "pre.sh"
    pre.write_text("echo setting up\nexit 3\n")
    marker = tmp_path / "rank-ran"
    out = tmp_path / "out"
    st = run(ex, sh(f"touch {marker}", pre_launch=pre, stdout_path=out))
    assert st.state is JobState.FAILED
    assert st.exit_code == 3
    assert "pre_launch" in (st.message or "") and str(pre) in (st.message or ""), st.message
    assert not marker.exists()
    assert out.read_text() == "setting up\n"


def test_cancel_during_pre_launch(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    pre = tmp_path / "pre.sh"
    pre.write_text(f"echo $$ > {tmp_path / 'pre.pid'}\nsleep 60\n")
    marker = tmp_path / "rank-ran"
    job = psij.Job(sh(f"touch {marker}", pre_launch=pre))
    ex.submit(job)
    proc = read_pid(tmp_path / "pre.pid")
    assert job.wait(timeout=WAIT, target_states=JobState.ACTIVE) is not None
    job.cancel()
    st = job.wait(timeout=WAIT)
    assert st is not None and st.state is JobState.CANCELED, st
    wait_for(lambda: gone(proc), 5, "the pre_launch shell to be gone")
    assert not marker.exists()


def test_multiple_ranks_share_truncated_stdout_without_pre_launch(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot(FOUR_CORES)
    ex = pilot.executor()
    out = tmp_path / "out"
    out.write_text("stale line from an earlier run\n" * 50)
    completed(
        ex,
        sh(
            'echo "rank $PILOT_RANK"',
            stdout_path=out,
            launcher="multiple",
            resources=psij.ResourceSpecV1(process_count=3),
        ),
    )
    assert sorted(out.read_text().splitlines()) == ["rank 0", "rank 1", "rank 2"]


def test_failing_rank_ends_the_job_and_its_siblings(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot(FOUR_CORES)
    ex = pilot.executor()
    # Rank 1 fails once both siblings are running (and the test holds their pids: read before the go,
    # else a fast failure can end them first); they would sleep for a minute.
    script = (
        f"echo $$ > {tmp_path}/pid.$PILOT_RANK; "
        'if [ "$PILOT_RANK" = 1 ]; then '
        f"while [ ! -e {tmp_path}/go ]; do sleep 0.02; done; exit 5; "
        "fi; exec sleep 60"
    )
    job = psij.Job(sh(script, launcher="multiple", resources=psij.ResourceSpecV1(process_count=3)))
    t0 = time.monotonic()
    ex.submit(job)
    siblings = [read_pid(tmp_path / f"pid.{i}") for i in (0, 2)]
    (tmp_path / "go").touch()
    st = job.wait(timeout=WAIT)
    assert st is not None and st.state is JobState.FAILED, st
    assert time.monotonic() - t0 < 15
    assert st.exit_code == 5
    assert "rank 1" in (st.message or "") and "5" in (st.message or ""), st.message
    for proc in siblings:
        wait_for(lambda p=proc: gone(p), 5, "a sibling rank to be gone")
    md = st.metadata or {}
    # Delivered names the cause: exit code 5, not the SIGTERM the siblings got.
    assert md["exit_code"] == 5 and md["signal"] is None, md


# -- ${VAR} substitution ---------------------------------------------------------------------------


def test_brace_substitution_in_environment_and_arguments(start_pilot, tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PILOT_TEST_UNSET_4711", raising=False)
    pilot = start_pilot()  # the daemon and agents inherit this HOME
    ex = pilot.executor()
    out = tmp_path / "out"
    spec = psij.JobSpec(
        executable="/bin/sh",
        arguments=[
            "-c",
            'printf "%s\\n" "$BASE" "$DERIVED" "$EMPTY" "$LITERAL" "$@"',
            "sh",
            "${HOME}",
            "${DERIVED}/arg",
            "x${PILOT_TEST_UNSET_4711}y",
            "$HOME",
        ],
        environment={
            "BASE": "${HOME}/base",
            "DERIVED": "${BASE}/derived",  # set earlier in the same map
            "EMPTY": "[${PILOT_TEST_UNSET_4711}]",  # unset: empty, as in Bash
            "LITERAL": "$HOME",  # only the brace form is substituted
        },
        stdout_path=out,
    )
    completed(ex, spec)
    assert out.read_text().splitlines() == [
        f"{home}/base",
        f"{home}/base/derived",
        "[]",
        "$HOME",
        str(home),
        f"{home}/base/derived/arg",
        "xy",
        "$HOME",
    ]


def test_environment_extends_inherited_path(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    out = tmp_path / "out"
    completed(ex, sh('echo "$PATH"', environment={"PATH": "/opt/extra/bin:${PATH}"}, stdout_path=out))
    assert out.read_text() == f"/opt/extra/bin:{os.environ['PATH']}\n"


# -- walltime ---------------------------------------------------------------------------------------


def test_walltime_kills_the_task(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    attrs = psij.JobAttributes(duration=timedelta(seconds=1))
    job = psij.Job(sh(f"echo $$ > {tmp_path / 'pid'}; exec sleep 30", attributes=attrs))
    t0 = time.monotonic()
    ex.submit(job)
    proc = read_pid(tmp_path / "pid")
    st = job.wait(timeout=15)
    elapsed = time.monotonic() - t0
    assert st is not None and st.state is JobState.FAILED, st
    msg = (st.message or "").lower()
    assert "walltime" in msg and "duration" in msg, st.message
    assert 1.0 <= elapsed < 10
    assert gone(proc)
    md = st.metadata or {}
    assert md["signal"] == 15
    assert 0.9 <= md["wall_duration"] < 10


def test_walltime_bounds_the_whole_job_not_each_process(start_pilot, tmp_path: Path) -> None:
    """pre_launch uses up most of the walltime; the rank gets only what is left, not a fresh duration."""
    pilot = start_pilot()
    ex = pilot.executor()
    pre = tmp_path / "pre.sh"
    pre.write_text("sleep 1.5\n")
    attrs = psij.JobAttributes(duration=timedelta(seconds=2))
    job = psij.Job(sh(f"echo $$ > {tmp_path / 'pid'}; exec sleep 30", pre_launch=pre, attributes=attrs))
    ex.submit(job)
    proc = read_pid(tmp_path / "pid")
    st = job.wait(timeout=15)
    assert st is not None and st.state is JobState.FAILED, st
    assert "walltime" in (st.message or "")
    wall = (st.metadata or {})["wall_duration"]
    assert 1.9 <= wall < 3.0, f"the job ran {wall:.2f} s on a 2 s walltime"
    assert gone(proc)


def test_walltime_escalates_to_sigkill(start_pilot, tmp_path: Path) -> None:
    """A task that ignores SIGTERM is killed with SIGKILL after the kill grace."""
    pilot = start_pilot('[pilot]\nkill_grace = 0.5\n[allocation]\nlrm = "local"\nnodes = 1\n')
    ex = pilot.executor()
    attrs = psij.JobAttributes(duration=timedelta(seconds=1))
    job = psij.Job(sh(f"trap '' TERM; echo $$ > {tmp_path / 'pid'}; while :; do sleep 0.05; done", attributes=attrs))
    ex.submit(job)
    proc = read_pid(tmp_path / "pid")
    st = job.wait(timeout=15)
    assert st is not None and st.state is JobState.FAILED, st
    assert "walltime" in (st.message or "")
    assert (st.metadata or {})["signal"] == 9
    assert (st.metadata or {})["wall_duration"] >= 1.4
    assert gone(proc)


# -- standard streams and directories ---------------------------------------------------------------


def test_stdin_stdout_stderr_exact(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    stdin = tmp_path / "in"
    stdin.write_text("alpha\nbeta\n\ngamma with spaces\n")
    out, err = tmp_path / "out", tmp_path / "err"
    out.write_text("an older, longer output that must be truncated\n" * 20)
    completed(ex, sh("cat; echo to-stderr >&2", stdin_path=stdin, stdout_path=out, stderr_path=err))
    assert out.read_text() == "alpha\nbeta\n\ngamma with spaces\n"
    assert err.read_text() == "to-stderr\n"

    both = tmp_path / "both"
    completed(ex, sh("echo one; echo two >&2; echo three", stdout_path=both, stderr_path=both))
    assert both.read_text() == "one\ntwo\nthree\n"


def test_directory_absolute_and_relative_paths(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    wd = tmp_path / "work dir"
    wd.mkdir()
    (wd / "input").write_text("from the job directory\n")
    tool = wd / "tool.sh"
    tool.write_text('#!/bin/sh\necho "tool ran in $(pwd -P)"\n')
    tool.chmod(0o755)
    # stdin/stdout/stderr relative to the directory; the executable too.
    completed(
        ex,
        psij.JobSpec(
            executable="/bin/sh",
            arguments=["-c", "pwd -P; cat; echo err >&2"],
            directory=wd,
            stdin_path=Path("input"),
            stdout_path=Path("out"),
            stderr_path=Path("err"),
        ),
    )
    assert (wd / "out").read_text() == f"{wd.resolve()}\nfrom the job directory\n"
    assert (wd / "err").read_text() == "err\n"
    completed(ex, psij.JobSpec(executable="./tool.sh", directory=wd, stdout_path=Path("tool.out")))
    assert (wd / "tool.out").read_text() == f"tool ran in {wd.resolve()}\n"


def test_directory_relative_to_home(start_pilot, tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    (home / "jobs" / "a").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    pilot = start_pilot()
    ex = pilot.executor()
    completed(ex, sh("pwd -P > where", directory="~/jobs/a"))
    assert (home / "jobs" / "a" / "where").read_text() == f"{(home / 'jobs' / 'a').resolve()}\n"


def test_default_directory_is_the_submit_directory(start_pilot, tmp_path: Path, monkeypatch) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    cwd = tmp_path / "submit-here"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    completed(ex, sh("pwd -P > where"))
    assert (cwd / "where").read_text() == f"{cwd.resolve()}\n"


def test_bad_directory(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    missing = tmp_path / "does-not-exist"
    st = run(ex, psij.JobSpec(executable="/bin/true", directory=missing))
    assert st.state is JobState.FAILED
    assert str(missing) in (st.message or "") and "does not exist" in (st.message or ""), st.message
    with pytest.raises(psij.InvalidJobException) as err:
        ex.submit(psij.Job(psij.JobSpec(executable="/bin/true", directory="relative/dir")))
    assert "absolute" in str(err.value)


# -- environment ------------------------------------------------------------------------------------


def test_inherit_environment_false(start_pilot, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PILOT_TEST_SENTINEL", "from-the-pilot-environment")
    pilot = start_pilot()
    ex = pilot.executor()
    clean, inherited = tmp_path / "clean", tmp_path / "inherited"
    st = completed(
        ex,
        psij.JobSpec(
            executable=ENV, inherit_environment=False, environment={"ONLY": "this", "N": 1}, stdout_path=clean
        ),
    )
    env = env_lines(clean)
    assert env["ONLY"] == "this" and env["N"] == "1"
    assert env["PILOT_RANK"] == "0" and env["PILOT_SIZE"] == "1"
    assert env["PILOT_JOB_ID"]
    # (PILOT_PROCESS_MARK: how the agent finds what a task started outside its session, agent/trees.py)
    pilot_vars = {"PILOT_JOB_ID", "PILOT_RANK", "PILOT_SIZE", "PILOT_NODE", "PSIJ_NODEFILE", "PILOT_PROCESS_MARK"}
    assert set(env) <= {"ONLY", "N", *pilot_vars}, sorted(env)
    assert st.state is JobState.COMPLETED

    completed(ex, psij.JobSpec(executable=ENV, environment={"ONLY": "this"}, stdout_path=inherited))
    env = env_lines(inherited)
    assert env["PILOT_TEST_SENTINEL"] == "from-the-pilot-environment"
    assert env["ONLY"] == "this" and env["PATH"] == os.environ["PATH"]
    # The agent's own wiring never reaches a task.
    assert not [k for k in env if k.startswith(("PILOT_AGENT_", "PILOT_NODE_SPEC"))], sorted(env)


# -- launchers --------------------------------------------------------------------------------------


def test_multiple_launcher_rank_variables(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot(FOUR_CORES)
    ex = pilot.executor()
    st = completed(
        ex,
        sh(
            'echo "$PILOT_RANK $PILOT_SIZE $(wc -l < "$PSIJ_NODEFILE") $$" > rank.$PILOT_RANK',
            directory=tmp_path,
            launcher="multiple",
            resources=psij.ResourceSpecV1(process_count=3),
        ),
    )
    rows = [(tmp_path / f"rank.{i}").read_text().split() for i in range(3)]
    assert [r[:3] for r in rows] == [[str(i), "3", "3"] for i in range(3)]
    assert len({r[3] for r in rows}) == 3  # three distinct processes
    assert not (tmp_path / "rank.3").exists()
    md = st.metadata or {}
    assert md["processes"] == 3 and md["processors"] == 3


def test_multiple_launcher_across_two_nodes(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot('[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 2\ngpus_per_node = 0\n')
    ex = pilot.executor()
    st = completed(
        ex,
        sh(
            'cp "$PSIJ_NODEFILE" nodes.$PILOT_RANK; echo "$PILOT_RANK $PILOT_SIZE" > rank.$PILOT_RANK',
            directory=tmp_path,
            launcher="multiple",
            resources=psij.ResourceSpecV1(node_count=2, processes_per_node=2),
        ),
    )
    host = socket.gethostname()
    for i in range(4):
        assert (tmp_path / f"rank.{i}").read_text() == f"{i} 4\n"
        assert (tmp_path / f"nodes.{i}").read_text().splitlines() == [host] * 4
    md = st.metadata or {}
    assert md["nodes"] == ["local-0", "local-1"]
    assert md["processes"] == 4 and md["processors"] == 4


def test_single_launcher_runs_one_process_for_all_ranks(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot(FOUR_CORES)
    ex = pilot.executor()
    out = tmp_path / "out"
    st = completed(
        ex,
        sh(
            f'echo "$$ $PILOT_RANK $(wc -l < "$PSIJ_NODEFILE")" >> {out}',
            launcher="single",
            resources=psij.ResourceSpecV1(process_count=3),
        ),
    )
    lines = out.read_text().splitlines()
    assert len(lines) == 1, lines
    _, rank, nodefile_lines = lines[0].split()
    assert rank == "0" and nodefile_lines == "3"
    md = st.metadata or {}
    assert md["processes"] == 1 and md["processors"] == 3


def test_ranks_are_pinned_to_their_own_cores(start_pilot, tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs at least 2 cpus")
    pilot = start_pilot()  # one node with this machine's real cpus
    ex = pilot.executor()
    to_file = (
        "import os, json; json.dump(sorted(os.sched_getaffinity(0)), open('aff.' + os.environ['PILOT_RANK'], 'w'))"
    )
    completed(
        ex,
        psij.JobSpec(
            executable=PY,
            arguments=["-c", to_file],
            directory=tmp_path,
            launcher="multiple",
            resources=psij.ResourceSpecV1(process_count=2),
        ),
    )
    affinities = [json.loads((tmp_path / f"aff.{i}").read_text()) for i in range(2)]
    assert all(len(a) == 1 for a in affinities), affinities
    assert affinities[0] != affinities[1]
    assert set(affinities[0] + affinities[1]) <= set(cpus)

    out = tmp_path / "two"
    to_stdout = "import os, json; print(json.dumps(sorted(os.sched_getaffinity(0))))"
    completed(ex, py(to_stdout, stdout_path=out, resources=psij.ResourceSpecV1(cpu_cores_per_process=2)))
    assert json.loads(out.read_text()) == cpus[:2]


def test_gpus_bound_per_rank(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot('[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 4\ngpus_per_node = 2\n')
    ex = pilot.executor()
    completed(
        ex,
        psij.JobSpec(
            executable="/bin/sh",
            arguments=["-c", f"{ENV} > env.$PILOT_RANK"],
            directory=tmp_path,
            launcher="multiple",
            resources=psij.ResourceSpecV1(process_count=2, gpu_cores_per_process=1),
        ),
    )
    envs = [env_lines(tmp_path / f"env.{i}") for i in range(2)]
    assert sorted(e["CUDA_VISIBLE_DEVICES"] for e in envs) == ["0", "1"]
    for e in envs:
        assert e["ROCR_VISIBLE_DEVICES"] == e["ZE_AFFINITY_MASK"] == e["CUDA_VISIBLE_DEVICES"]
    # A job that asked for no GPU sees none on a GPU node.
    out = tmp_path / "nogpu"
    completed(ex, psij.JobSpec(executable=ENV, stdout_path=out))
    assert env_lines(out)["CUDA_VISIBLE_DEVICES"] == ""


def test_unknown_launcher_is_invalid_job(start_pilot) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    with pytest.raises(psij.InvalidJobException) as err:
        ex.submit(psij.Job(psij.JobSpec(executable="/bin/true", launcher="no-such-launcher")))
    assert "no-such-launcher" in str(err.value) and "multiple" in str(err.value)


# -- Delivered --------------------------------------------------------------------------------------


def test_delivered_cpu_wall_and_rate(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot(FOUR_CORES)
    ex = pilot.executor()
    burn = """
        import time
        t = time.process_time()
        while time.process_time() - t < 0.6:
            pass
        print("burnt")
    """
    out = tmp_path / "out"
    st = completed(ex, py(burn, stdout_path=out, resources=psij.ResourceSpecV1(cpu_cores_per_process=2)))
    assert out.read_text() == "burnt\n"
    md = st.metadata or {}
    assert md["user_cpu_time"] > 0.1 and md["user_cpu_time"] + md["system_cpu_time"] >= 0.5, md
    assert md["system_cpu_time"] >= 0
    assert 0.5 <= md["wall_duration"] < 20, md
    assert md["processors"] == 2
    expected = (md["user_cpu_time"] + md["system_cpu_time"]) / (md["wall_duration"] * 2)
    assert md["consumption_rate"] == pytest.approx(expected, rel=1e-6)
    # (its value is pinned by the line above; the task's share of its 2 cpus falls with the machine's load:
    # 0.09 in a run of the suite beside a busy pilot, so the bound below is what the checks above imply)
    assert 0.5 / (20 * 2) <= md["consumption_rate"] <= 1.0, md
    assert md["nodes"] == ["local-0"]
    assert md["exit_code"] == 0 and md["signal"] is None
    assert st.exit_code == 0


def test_delivered_max_rss(start_pilot, tmp_path: Path) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    # Written, not only reserved: the pages are really resident.
    code = "b = b'x' * (64 << 20); print(len(b))"
    out = tmp_path / "out"
    st = completed(ex, py(code, stdout_path=out))
    assert out.read_text() == f"{64 << 20}\n"
    md = st.metadata or {}
    assert 50_000_000 < md["max_rss"] < 2_000_000_000, md


def test_delivered_signal_of_killed_task(start_pilot) -> None:
    pilot = start_pilot()
    ex = pilot.executor()
    st = run(ex, sh("kill -9 $$"))
    assert st.state is JobState.FAILED
    md = st.metadata or {}
    assert md["signal"] == 9
    assert st.exit_code == -9 and md["exit_code"] == -9
    assert "SIGKILL" in (st.message or ""), st.message

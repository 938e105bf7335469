"""No tracebacks, ever, in the CLI: bad input, a closed pipe, an interrupt, a refused batch each end in one
line that says what to change; Ctrl-C in 'pilot run' cancels the run's jobs; the progress bar only on a
terminal; 'pilot status' columns; shell completion."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest
from pilot_waits import agents_active, wait_for

import pilot

PYTHON = sys.executable
ONE = '[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 1\n'

pytestmark = pytest.mark.timeout(120)


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "pilot", *args], env=env or dict(os.environ), capture_output=True, text=True, timeout=timeout
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines, "nothing said"
    return lines[-1]


@pytest.mark.parametrize(
    ("args", "env", "code", "says"),
    [
        (["run", "-n", "-5"], {}, 2, "argument -n/--tasks: -5 must be at least 1"),
        (["run", "-n", "0"], {}, 2, "argument -n/--tasks: 0 must be at least 1"),
        (["run", "-n", "many"], {}, 2, "argument -n/--tasks: 'many' is not a whole number"),
        (["jobs", "--since", "yesterday"], {}, 2, "'yesterday' is not a time: give a span back from now"),
        (["jobs", "--state", "DONE"], {}, 2, "'DONE' is not a job state; use one of NEW, QUEUED, STAGE_IN, ACTIVE"),
        (["jobs", "--limit", "0"], {}, 2, "argument --limit: 0 must be at least 1"),
        (["status", "--name", "a/b"], {}, 2, "'a/b' is not a pilot name"),
        (["status"], {"PILOT_NAME": "../x"}, 2, "PILOT_NAME='../x' is not a pilot name"),
        (["down", "--timeout", "5"], {}, 2, "--timeout goes with --drain"),
        (["cancel"], {}, 2, "name the jobs: IDs, --state STATE or --run RUN"),
        (["submit", "/nonexistent/job.xml"], {}, 2, "cannot read /nonexistent/job.xml: No such file or directory"),
        (["show", "1"], {}, 1, "no pilot is running in"),
        (["run", "--url", "/nonexistent/pilot", "-n", "1"], {}, 1, "pilot run: no pilot is running in /nonexistent"),
        (["jobs"], {"PILOT_CONFIG": "/nonexistent.toml"}, 2, "config file /nonexistent.toml does not exist"),
    ],
)
def test_bad_input_is_one_clear_line(
    pilot_home: Path, args: list[str], env: dict[str, str], code: int, says: str
) -> None:
    proc = cli(*args, env=dict(os.environ) | env)
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    assert says in one_line(proc), proc.stderr


def test_version(pilot_home: Path) -> None:
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"pilot {pilot.__version__}"


def test_a_closed_pipe_ends_quietly(start_pilot: Any) -> None:
    start_pilot(ONE, name="p")
    assert cli("run", "--name", "p", "-n", "3", "--", "/bin/true").returncode == 0
    # The reader is gone before 'pilot jobs' writes a byte (as 'pilot jobs | head -0' would be).
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run(
        [PYTHON, "-m", "pilot", "jobs", "--name", "p"], stdout=write, stderr=subprocess.PIPE, text=True, timeout=60
    )
    os.close(write)
    assert proc.returncode == 141
    assert proc.stderr == ""


def test_a_refused_batch_is_one_line_not_an_exception_group(start_pilot: Any) -> None:
    start_pilot(ONE, name="p")
    proc = cli("run", "--name", "p", "-n", "3", "--", "")
    assert proc.returncode == 2
    assert "3 of 3 jobs were not submitted" in one_line(proc) and "JobSpec.executable" in one_line(proc)


def test_an_inner_double_dash_stays_in_the_command(start_pilot: Any) -> None:
    start_pilot(ONE, name="p")
    proc = cli("run", "--name", "p", "-n", "1", "--json", "--", "/bin/echo", "-n", "--", "x")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["command"] == ["/bin/echo", "-n", "--", "x"]
    shown = json.loads(cli("show", "--name", "p", "1", "--json").stdout)[0]
    assert shown["command"] == ["/bin/echo", "-n", "--", "x"]


def _start_run(n: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [PYTHON, "-m", "pilot", "run", "--name", "p", "-n", str(n), "--", "sleep", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert first.startswith("pilot run: run-"), first
    return proc, first.split(": ")[1]


def _states(run: str) -> list[str]:
    out = cli("jobs", "--name", "p", "--run", run, "--json")
    assert out.returncode == 0, out.stderr
    return [r["state"] for r in json.loads(out.stdout)]


def test_first_ctrl_c_cancels_the_run_and_prints_a_partial_summary(start_pilot: Any) -> None:
    pilot_ = start_pilot('[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n', name="p")
    agents_active(pilot_.executor(), 1)
    proc, run = _start_run(6)
    try:
        wait_for(lambda: _states(run).count("ACTIVE") == 2, what="two tasks running")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err
    assert f"interrupted: canceling the 6 unfinished job(s) of {run}" in err
    assert out.startswith(f"interrupted: 6 tasks of 'sleep 60' on 1 node(s) ({run}): 0 completed, 0 failed, 6 canceled")
    assert _states(run) == ["CANCELED"] * 6


def test_second_ctrl_c_exits_at_once(start_pilot: Any, tmp_path: Path) -> None:
    pilot_ = start_pilot(
        '[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n[pilot]\nkill_grace = 10\n', name="p"
    )
    agents_active(pilot_.executor(), 1)
    # Tasks that ignore SIGTERM keep their jobs from ending for kill_grace (10 s): the cancel is slow.
    said = tmp_path / "stderr"
    with open(said, "w") as err_file:
        proc = subprocess.Popen(
            [PYTHON, "-m", "pilot", "run", "--name", "p", "-n", "2", "--", "/bin/sh", "-c", "trap '' TERM; sleep 60"],
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
        )
    try:
        line = wait_for(lambda: said.read_text().partition("\n")[0], what="the run's first line")
        run = line.split(": ")[1]
        wait_for(lambda: _states(run).count("ACTIVE") == 2, what="two tasks running")
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: "canceling" in said.read_text(), what="the cancel under way")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = said.read_text()
    assert proc.returncode == 130
    assert "Traceback" not in err
    assert f"interrupted again: exiting now ('pilot cancel --run {run}' stops what is left)" in err
    assert out == ""  # it did not wait for the cancel to end to print a summary
    assert "ACTIVE" in _states(run)  # the tasks were still in their kill grace when it left


def test_progress_bar_only_on_a_terminal(start_pilot: Any) -> None:
    start_pilot(ONE, name="p")
    piped = cli("run", "--name", "p", "-n", "5", "--", "/bin/true")
    assert piped.returncode == 0
    assert "task/s" not in piped.stderr and "\r" not in piped.stderr
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal 100 wide
    proc = subprocess.Popen(
        [PYTHON, "-m", "pilot", "run", "--name", "p", "-n", "5", "--", "/bin/true"],
        stdout=subprocess.DEVNULL,
        stderr=follower,
    )
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal's other end closed: the run is over
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    proc.wait(timeout=30)
    os.close(leader)
    assert proc.returncode == 0
    assert b"tasks: 100%" in seen and b"5/5" in seen, seen


def test_status_columns_nodes_and_orders_waiting_at_the_agent(start_pilot: Any) -> None:
    pilot_ = start_pilot('[allocation]\nlrm = "local"\nnodes = 3\ncores_per_node = 1\n', name="p")
    agents_active(pilot_.executor(), 3)
    proc = subprocess.Popen(
        [PYTHON, "-m", "pilot", "run", "--name", "p", "-n", "6", "--", "sleep", "60"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def busy() -> dict[str, Any] | None:
            st = json.loads(cli("status", "--name", "p", "--json").stdout)
            nodes = st["nodes"]
            ok = sum(n["running"] for n in nodes) == 3 and sum(n["waiting"] for n in nodes) == 3
            return st if ok else None

        st = wait_for(busy, what="3 running, 3 waiting behind them")
        for n in st["nodes"]:
            assert n["processes"] == n["running"] + n["waiting"]
        text = cli("status", "--name", "p").stdout.splitlines()
        head = next(i for i, ln in enumerate(text) if ln.startswith("node "))
        header, rows = text[head], text[head + 1 : head + 4]
        assert header.split() == [
            "node",
            "agent",
            "free",
            "cores",
            "free",
            "gpus",
            "free",
            "memory",
            "running",
            "waiting",
        ]
        assert [r.split()[0] for r in rows] == ["local-0", "local-1", "local-2"]
        running_end = header.index("running") + len("running")
        for r in rows:  # right-aligned numbers end where their header does
            assert len(r) == len(header)
            assert r[running_end - 1] == "1" and r[:running_end].split()[-1] == "1"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def test_shell_completion_bash_completes_commands_and_options(pilot_home: Path, tmp_path: Path) -> None:
    script = cli("completion", "bash")
    assert script.returncode == 0, script.stderr
    path = tmp_path / "pilot.bash"
    path.write_text(script.stdout)

    def complete(*words: str) -> list[str]:
        line = " ".join(["pilot", *words])
        probe = (
            f"source {path}; COMP_WORDS=(pilot {' '.join(words)}); COMP_CWORD={len(words)}; "
            f"COMP_LINE='{line}'; COMP_POINT={len(line)}; _shtab_pilot; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        )
        out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert complete("ca") == ["cancel"]
    assert {"jobs", "show", "run", "status"} <= set(complete(""))
    assert "--state" in complete("jobs", "--st") and "--since" not in complete("jobs", "--st")


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_shell_completion_zsh_script_parses(pilot_home: Path, tmp_path: Path) -> None:
    script = cli("completion", "zsh")
    assert script.returncode == 0 and script.stdout.startswith("#compdef pilot")
    path = tmp_path / "_pilot"
    path.write_text(script.stdout)
    parsed = subprocess.run(["zsh", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert parsed.returncode == 0, parsed.stderr
    # Loaded by zsh, it defines the completer and lists every command.
    probe = f"source {path}; whence -w _shtab_pilot; _shtab_pilot_commands() {{ :; }}; print ok"
    loaded = subprocess.run(["zsh", "-fc", probe], capture_output=True, text=True, timeout=30)
    assert loaded.returncode == 0 and "_shtab_pilot: function" in loaded.stdout, loaded.stderr
    for command in ("jobs", "cancel", "show", "ls", "run", "status"):
        assert f"    {command}:'" in script.stdout


def test_json_from_every_command_a_script_would_read(pilot_home: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(ONE)
    rd = str(pilot_home / "j")
    checked = json.loads(cli("check", "--config", str(cfg), "--json").stdout)
    assert checked == {"config": str(cfg), "usable": True, "warnings": []}
    up = cli("up", "--config", str(cfg), "--rundir", rd, "--json")
    assert up.returncode == 0, up.stderr
    started = json.loads(up.stdout)
    assert started["rundir"] == rd and started["client_url"].startswith("ipc://")
    try:
        ran = json.loads(cli("run", "--rundir", rd, "-n", "2", "--json").stdout)
        assert ran["completed"] == 2 and ran["run"].startswith("run-")
        submitted = json.loads(cli("submit", "--rundir", rd, "--json", "--", "/bin/true").stdout)
        assert submitted["ids"] == ["3"]
        for args in (["status"], ["ls"], ["jobs"], ["show", "1"], ["explain", "1"], ["nodes"], ["history"]):
            proc = cli(*args, *([] if args == ["ls"] else ["--rundir", rd]), "--json")
            assert proc.returncode == 0, (args, proc.stderr)
            json.loads(proc.stdout)
        released = cli("release", "--rundir", rd, "1", "--json")
        assert released.returncode == 1 and json.loads(released.stdout) == []  # job 1 is not waiting
        canceled = json.loads(cli("cancel", "--rundir", rd, "1", "--json").stdout)
        assert canceled == [{"id": "1", "state": "COMPLETED", "canceled": False}]
    finally:
        down = cli("down", "--rundir", rd, "--json")
    assert down.returncode == 0 and json.loads(down.stdout) == {"rundir": rd, "pid": started["pid"], "stopped": True}


def test_status_lists_nodes_in_natural_order(start_pilot: Any) -> None:
    # Twelve simulated nodes in one agent process: 'local-2' comes before 'local-10'.
    pilot_ = start_pilot(
        '[allocation]\nlrm = "local"\nnodes = 12\ncores_per_node = 1\nlaunch = "null"\nnodes_per_agent = 12\n'
    )
    agents_active(pilot_.executor(), 12)
    lines = pilot_.cli("status").stdout.splitlines()
    assert [ln.split()[0] for ln in lines if ln.startswith("local-")] == [f"local-{i}" for i in range(12)]


def test_ctrl_c_in_submit_wait_says_the_jobs_go_on(start_pilot: Any) -> None:
    pilot_ = start_pilot(ONE, name="p")
    agents_active(pilot_.executor(), 1)
    proc = subprocess.Popen(
        [PYTHON, "-m", "pilot", "submit", "--name", "p", "--wait", "--", "sleep", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        run = proc.stdout.readline().split(":")[0]
        wait_for(lambda: _states(run) == ["ACTIVE"], what="the job running")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err
    assert f"pilot submit: interrupted: the jobs go on in the pilot ('pilot cancel --run {run}' stops them)" in err
    assert _states(run) == ["ACTIVE"]
    assert cli("cancel", "--name", "p", "--run", run).returncode == 0

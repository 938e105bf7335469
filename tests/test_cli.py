"""The ``pilot`` command line against real daemons: up, status, down, and refusals."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from pilot_waits import agents_active, ends, reach, wait_for

import client as psij
from client._connection import Connection
from pilot import wire
from pilot.rundir import RunDir, pid_alive

PYTHON = sys.executable
CONFIG = '[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 4\ngpus_per_node = 2\nmemory_per_node = "1G"\n'


def pilot_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "pilot", *args],
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def process_tree(pid: int) -> list[psutil.Process]:
    p = psutil.Process(pid)
    return [p, *p.children(recursive=True)]


def dead(p: psutil.Process) -> bool:
    """Gone, or a zombie (exited; only the reaping by its parent or init is left)."""
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def sleep_job(seconds: float = 60, pidfile: Path | None = None) -> psij.Job:
    script = f"exec sleep {seconds}" if pidfile is None else f"echo $$ > {pidfile}; exec sleep {seconds}"
    return psij.Job(psij.JobSpec(executable="/bin/sh", arguments=["-c", script]))


# -- up ---------------------------------------------------------------------------------------------------


def test_up_writes_a_private_run_dir(start_pilot: Any) -> None:
    pilot = start_pilot(CONFIG)
    rd: RunDir = pilot.rundir
    assert stat.S_IMODE(rd.path.stat().st_mode) == 0o700
    assert stat.S_IMODE(rd.agents_dir.stat().st_mode) == 0o700
    info = json.loads(rd.info_file.read_text())
    assert stat.S_IMODE(rd.info_file.stat().st_mode) == 0o600
    assert info["pid"] == pilot.pid
    assert info["config"] == str(pilot.config.resolve())
    assert info["embedded"] is False
    daemon = psutil.Process(info["pid"])
    assert daemon.is_running() and daemon.status() != psutil.STATUS_ZOMBIE
    # detached: its own session, so the shell that ran 'pilot up' can go away
    assert os.getsid(daemon.pid) == daemon.pid != os.getsid(0)
    for key in ("client_url", "agent_url"):
        url = info[key]
        assert url.startswith("ipc://")
        sock = Path(url.removeprefix("ipc://"))
        assert stat.S_ISSOCK(sock.stat().st_mode)
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    # the log is there and says where clients connect
    log = wait_for(lambda: "pilot ready" in rd.log_file.read_text() and rd.log_file.read_text(), what="log")
    assert info["client_url"] in log
    # the daemon answers on the address it advertised
    hello = Connection(info["client_url"])
    try:
        reply = hello.request(wire.Kind.HELLO, {}, timeout=10)
    finally:
        hello.close()
    assert reply["pid"] == info["pid"]


def test_up_prints_where_the_pilot_is(pilot_home: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 1\n')
    rd = RunDir(pilot_home / "printing")
    up = pilot_cli("up", "--config", str(cfg), "--rundir", str(rd.path))
    try:
        assert up.returncode == 0, up.stderr
        info = rd.read_info()
        assert info is not None
        assert f"pid {info['pid']}" in up.stdout
        assert str(rd.path) in up.stdout and info["client_url"] in up.stdout
    finally:
        down = pilot_cli("down", "--rundir", str(rd.path))
        assert down.returncode == 0, down.stderr
    assert rd.read_info() is None


# -- status -----------------------------------------------------------------------------------------------


def test_status_shows_pilot_allocation_nodes_and_jobs(start_pilot: Any) -> None:
    pilot = start_pilot(CONFIG + 'features = ["ssd"]\n')
    ex = pilot.executor()
    agents_active(ex, 2)
    ok = psij.Job(psij.JobSpec(executable="/bin/true"))
    bad = psij.Job(psij.JobSpec(executable="/bin/false"))
    running = sleep_job()
    for job in (ok, bad, running):
        ex.submit(job)
    ends(ok, psij.JobState.COMPLETED)
    ends(bad, psij.JobState.FAILED)
    reach(running, psij.JobState.ACTIVE)

    out = pilot.cli("status", "--json")
    st = json.loads(out.stdout)
    p = st["pilot"]
    assert p["pid"] == pilot.pid and p["rundir"] == str(pilot.rundir.path) and p["uptime"] >= 0
    a = st["allocation"]
    assert a["lrm"] == "local" and a["state"] == "active" and a["nodes"] == 2 and a["native_id"]
    assert sorted(n["name"] for n in st["nodes"]) == ["local-0", "local-1"]
    for n in st["nodes"]:
        assert n["agent"] == "active"
        assert (n["cores"], n["gpus"], n["memory"]) == (4, 2, 1024**3)
        assert n["features"] == ["ssd"]
    busy = [n for n in st["nodes"] if n["processes"]]
    assert len(busy) == 1 and busy[0]["free_cores"] == 3  # the sleeping job holds one core
    assert sum(n["free_cores"] for n in st["nodes"]) == 7
    assert st["jobs"] == {"COMPLETED": 1, "FAILED": 1, "ACTIVE": 1}
    assert st["queued"] == 0

    text = pilot.cli("status").stdout
    lines = text.splitlines()
    assert lines[0].startswith("pilot ") and f"pid {pilot.pid}" in lines[0] and str(pilot.rundir.path) in lines[0]
    assert lines[1].startswith("allocation local ") and "active, 2 node(s)" in lines[1]
    node_lines = {ln.split()[0]: ln for ln in lines if ln.startswith("local-")}
    assert set(node_lines) == {"local-0", "local-1"}
    for name, ln in node_lines.items():
        cols = ln.split()
        assert cols[1] == "active"
        assert cols[2] in ("4/4", "3/4")
        assert cols[3] == "2/2"
        assert cols[4] == "1.0G/1.0G"
        assert cols[5] == ("1" if name == busy[0]["name"] else "0")
    assert lines[-1] == "jobs: ACTIVE 1, COMPLETED 1, FAILED 1"
    running.cancel()
    ends(running, psij.JobState.CANCELED)
    assert json.loads(pilot.cli("status", "--json").stdout)["jobs"] == {"COMPLETED": 1, "FAILED": 1, "CANCELED": 1}


def test_status_and_down_without_a_pilot_say_so(pilot_home: Path) -> None:
    rd = pilot_home / "nothing-here"
    for cmd in ("status", "down"):
        proc = pilot_cli(cmd, "--rundir", str(rd))
        assert proc.returncode == 1
        assert f"no pilot is running in {rd}" in proc.stderr


def test_status_ignores_a_stale_info_file(pilot_home: Path) -> None:
    """pilot.json left by a daemon that was SIGKILLed names a dead pid: nothing runs there."""
    rd = RunDir(pilot_home / "stale")
    rd.create()
    corpse = subprocess.Popen([PYTHON, "-c", "pass"])
    corpse.wait()
    rd.write_info({"pid": corpse.pid, "client_url": "ipc:///nonexistent/client.sock"})
    proc = pilot_cli("status", "--rundir", str(rd.path))
    assert proc.returncode == 1 and "no pilot is running" in proc.stderr


# -- down -------------------------------------------------------------------------------------------------


def test_down_cancels_running_jobs_and_leaves_nothing_behind(start_pilot: Any, tmp_path: Path) -> None:
    pilot = start_pilot(CONFIG)
    info = pilot.info
    ex = pilot.executor()
    agents_active(ex, 2)
    pidfile = tmp_path / "task.pid"
    job = sleep_job(60, pidfile)
    queued = psij.Job(psij.JobSpec(executable="/bin/true", resources=psij.ResourceSpecV1(cpu_cores_per_process=4)))
    whole_node = psij.ResourceSpecV1(cpu_cores_per_process=4, exclusive_node_use=True)
    blocker = psij.Job(psij.JobSpec(executable="/bin/sleep", arguments=["60"], resources=whole_node))
    ex.submit(job)
    reach(job, psij.JobState.ACTIVE)
    ex.submit(blocker)  # takes the other node whole
    reach(blocker, psij.JobState.ACTIVE)
    ex.submit(queued)  # cannot start: one core is taken on each node
    task_pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="task pid"))

    tree = process_tree(pilot.pid)
    pids = {p.pid for p in tree}
    agents = [p for p in tree if p.cmdline()[1:3] == ["-m", "agent"]]
    assert len(agents) == 2
    assert task_pid in pids
    assert {p.ppid() for p in agents} == {pilot.pid}

    finals: dict[str, psij.JobStatus | None] = {}

    def waiter(name: str, j: psij.Job) -> None:
        finals[name] = j.wait(timeout=30)

    named = {"job": job, "blocker": blocker, "queued": queued}
    threads = [threading.Thread(target=waiter, args=item) for item in named.items()]
    for t in threads:
        t.start()
    down = pilot.cli("down")
    assert f"pilot down: {pilot.rundir.path} stopped" in down.stdout
    for t in threads:
        t.join(timeout=30)
    for name in ("job", "blocker", "queued"):
        status = finals[name]
        assert status is not None and status.state is psij.JobState.CANCELED, (name, status)
        assert status.message is not None and "stopped" in status.message, status.message
    # a running job was really started before it was cancelled; the queued one never was
    assert job.status.metadata is not None and job.status.metadata["nodes"]
    # when 'pilot down' returns, every process it owned has exited
    left = [p for p in tree if not dead(p)]
    assert not left, f"still running after 'pilot down': {left}"
    psutil.wait_procs(tree, timeout=10)
    assert not pid_alive(task_pid)
    assert not pilot.rundir.info_file.exists()
    for key in ("client_url", "agent_url"):
        assert not Path(info[key].removeprefix("ipc://")).exists()
    log = pilot.rundir.log_file.read_text()
    assert "pilot stopped" in log and "did not stop" not in log


def test_down_right_after_up_stops_agents_that_register_late(start_pilot: Any) -> None:
    """A shutdown that arrives before the agents have registered must still stop them cleanly
    (no 5 s wait and SIGKILL): an agent that registers while the pilot stops is told to stop."""
    pilot = start_pilot(CONFIG)
    tree = process_tree(pilot.pid)
    conn = Connection(pilot.info["client_url"])
    try:
        reply = conn.request(wire.Kind.SHUTDOWN, {}, timeout=10)
    finally:
        conn.close()
    assert reply["pid"] == pilot.pid
    _, alive = psutil.wait_procs(tree, timeout=20)
    assert not alive
    log = pilot.rundir.log_file.read_text()
    assert "did not stop" not in log, log
    for node in ("local-0", "local-1"):
        agent_log = (pilot.rundir.agents_dir / f"{node}.log").read_text()
        assert "agent stopped" in agent_log, agent_log
    assert not pilot.rundir.info_file.exists()


def test_down_answers_as_soon_as_the_daemon_has_exited(start_pilot: Any) -> None:
    pilot = start_pilot('[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 1\n')
    agents_active(pilot.executor(), 1)
    pid = pilot.pid
    t0 = time.monotonic()
    down = pilot.cli("down")
    elapsed = time.monotonic() - t0
    assert down.returncode == 0
    assert not pid_alive(pid)
    assert elapsed < 5, f"'pilot down' took {elapsed:.1f} s"


def test_pid_alive_is_false_for_a_zombie() -> None:
    """A daemon that exited but was not yet reaped (its parent is init) is not running."""
    child = subprocess.Popen([PYTHON, "-c", "pass"])
    try:
        wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, what="zombie")
        assert not pid_alive(child.pid)
    finally:
        child.wait()
    assert pid_alive(os.getpid())
    assert not pid_alive(child.pid)


# -- refusals ---------------------------------------------------------------------------------------------


def test_second_up_on_the_same_run_dir_is_refused(start_pilot: Any) -> None:
    pilot = start_pilot(CONFIG)
    before = pilot.rundir.info_file.read_text()
    again = pilot.cli("up", "--config", str(pilot.config), check=False)
    assert again.returncode == 1
    assert f"already running in {pilot.rundir.path} (pid {pilot.pid})" in again.stderr
    # even the daemon itself (racing past the check) refuses through the lock, and leaves the first alone
    fg = pilot.cli("up", "--foreground", "--config", str(pilot.config), check=False, timeout=30)
    assert fg.returncode == 1
    assert f"a pilot is already running in {pilot.rundir.path} (pid {pilot.pid})" in fg.stderr
    assert pilot.rundir.info_file.read_text() == before
    assert psutil.Process(pilot.pid).status() != psutil.STATUS_ZOMBIE
    assert agents_active(pilot.executor(), 2)


@pytest.mark.parametrize(
    ("toml", "names"),
    [
        ('[allocation]\nlrm = "local"\ncolour = "blue"\n', ["unknown key allocation.colour"]),
        ('[pilot]\nnmae = "x"\n', ["unknown key pilot.nmae", "name"]),
        ("[alocation]\nnodes = 1\n", ["unknown key alocation", "allocation"]),
        ('[allocation]\nnodes = "two"\n', ["allocation.nodes", "int"]),
        ("[allocation]\nnodes = 1.5\n", ["allocation.nodes", "int"]),
        ("[allocation]\nnodes = 0\n", ["allocation.nodes", "at least 1"]),
        ("[allocation]\nnodes = true\n", ["allocation.nodes", "boolean"]),
        ("[pilot]\nheartbeat_interval = true\n", ["pilot.heartbeat_interval", "boolean"]),
        ('[pilot]\nheartbeat_interval = "1s"\n', ["pilot.heartbeat_interval", "float"]),
        ("[pilot]\nkill_grace = -1\n", ["pilot.kill_grace", "positive"]),
        ('[pilot]\nlog_level = "loud"\n', ["pilot.log_level", "debug"]),
        ('[pilot]\nname = "a/b"\n', ["pilot.name"]),
        ("[pilot]\nagent_timeout = 1\nheartbeat_interval = 2\n", ["pilot.agent_timeout", "heartbeat_interval"]),
        ('[allocation]\nlrm = "slurmm"\n', ["allocation.lrm", "'slurmm'", "local"]),
        ('[allocation]\ncores_per_node = "4"\n', ["allocation.cores_per_node", "integer"]),
        ("[allocation]\ncores_per_node = 0\n", ["allocation.cores_per_node"]),
        ("[allocation]\ngpus_per_node = -1\n", ["allocation.gpus_per_node"]),
        ('[allocation]\nmemory_per_node = "lots"\n', ["allocation.memory_per_node", "'lots'"]),
        ('[allocation]\nfeatures = "ssd"\n', ["allocation.features", "list of strings"]),
        ('[allocation]\nwalltime = "soon"\n', ["allocation.walltime", "'soon'"]),
        ("allocation = 3\n", ["[allocation] must be a table"]),
        ("[allocation\n", ["not valid TOML"]),
    ],
)
def test_bad_config_fails_up_naming_the_key(pilot_home: Path, tmp_path: Path, toml: str, names: list[str]) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(toml)
    rd = pilot_home / "bad"
    proc = pilot_cli("up", "--config", str(cfg), "--rundir", str(rd), timeout=30)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("pilot: config error: ") and str(cfg) in proc.stderr, proc.stderr
    for n in names:
        assert n in proc.stderr, proc.stderr
    assert RunDir(rd).read_info() is None
    assert not (rd / "pilot.json").exists()


def test_missing_config_file_is_named(pilot_home: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    proc = pilot_cli("up", "--config", str(missing), "--rundir", str(pilot_home / "x"), timeout=30)
    assert proc.returncode == 2
    assert f"config file {missing} does not exist" in proc.stderr


def test_more_virtual_nodes_than_cpus_needs_cores_per_node(pilot_home: Path, tmp_path: Path) -> None:
    ncpu = len(os.sched_getaffinity(0))
    cfg = tmp_path / "many.toml"
    cfg.write_text(f'[allocation]\nlrm = "local"\nnodes = {ncpu + 1}\n')
    rd = RunDir(pilot_home / "many")
    proc = pilot_cli("up", "--config", str(cfg), "--rundir", str(rd.path), timeout=60)
    assert proc.returncode != 0
    assert f"allocation.nodes = {ncpu + 1}" in proc.stderr and "allocation.cores_per_node" in proc.stderr
    assert rd.read_info() is None
    # no agent was started for the refused allocation
    assert not any(rd.agents_dir.glob("*.log"))

"""'pilot top' as a person sees it: run in a real terminal (a detached tmux session) against a real
local pilot with jobs running and waiting, its screen read back with ``tmux capture-pane``."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from typing import Any

import pytest
from pilot_waits import agents_active, wait_for

PYTHON = sys.executable
# Two nodes of two cores: four sleeps run, two wait in the queue.
TWO_BY_TWO = '[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 2\n'

pytestmark = pytest.mark.timeout(120)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "pilot", *args], env=dict(os.environ), capture_output=True, text=True, timeout=60
    )


def busy_pilot(start_pilot: Any) -> tuple[str, str]:
    """A pilot with one FAILED job, four sleeps running and two queued; its run dir and the sleeps' run."""
    pilot = start_pilot(TWO_BY_TWO)
    ex = pilot.executor()
    agents_active(ex, 2)
    rd = str(pilot.rundir.path)
    failed = cli("submit", "--rundir", rd, "--wait", "--", "/bin/sh", "-c", "exit 3")
    assert failed.returncode == 1, failed.stderr
    sleeps = cli("submit", "--rundir", rd, "--array", "1-6", "--", "sleep", "60")
    assert sleeps.returncode == 0, sleeps.stderr

    def settled() -> bool:
        st = ex.pilot_status()
        return bool(st["jobs"].get("ACTIVE") == 4 and st["queued"] == 2)

    wait_for(settled, what="four sleeps running and two queued")
    return rd, sleeps.stdout.split(":")[0]


def node_line(screen: str, node: str) -> list[str]:
    lines = [line for line in screen.splitlines() if line.split()[:1] == [node]]
    assert len(lines) == 1, f"{node} shown {len(lines)} times:\n{screen}"  # redrawn in place, not appended
    return lines[0].split()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/tools.sh installs it)")
def test_top_in_a_real_terminal(start_pilot: Any) -> None:
    rd, run = busy_pilot(start_pilot)
    server = f"pilot-top-{uuid.uuid4().hex[:8]}"  # a private tmux server: nothing shared with the user's

    def tmux(*args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", server, *args], capture_output=True, text=True, timeout=20, check=True
        ).stdout

    env = {k: os.environ[k] for k in ("PILOT_HOME", "PYTHONPATH", "PATH", "HOME") if k in os.environ}
    top = shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), PYTHON, "-m", "pilot", "top"])
    command = f"{top} --rundir {shlex.quote(rd)} --interval 0.3; echo top exited $?; sleep 60"
    try:
        tmux("new-session", "-d", "-s", "top", "-x", "110", "-y", "30", "bash", "-c", command)

        def screen(*needles: str) -> str | None:
            text = tmux("capture-pane", "-p", "-t", "top")
            return text if all(n in text for n in needles) else None

        shown: str = wait_for(lambda: screen("local-1", "recent failures"), what="pilot top's first frame")
        assert "queued 2" in shown and "running 4" in shown and "failed 1" in shown, shown
        for node in ("local-0", "local-1"):
            cells = node_line(shown, node)
            assert cells[1] == "active" and cells[2] == "2/2", shown  # both cores busy
            assert cells[3] == "████████", shown
        failure = next(line for line in shown.splitlines() if "job 1 " in line)
        assert "exit 3" in failure, shown

        # It refreshes in place: the sleeps canceled, the same screen shows idle nodes and an empty queue.
        assert cli("cancel", "--rundir", rd, "--run", run).returncode == 0
        shown = wait_for(lambda: screen("queued 0", "running 0", "canceled 6"), what="the redrawn frame")
        for node in ("local-0", "local-1"):
            assert node_line(shown, node)[2] == "0/2", shown

        tmux("send-keys", "-t", "top", "C-c")  # how one leaves it: a clean exit, no traceback
        shown = wait_for(lambda: screen("top exited"), what="pilot top to exit on Ctrl-C")
        assert "top exited 0" in shown and "Traceback" not in shown, shown
    finally:
        subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True, timeout=20)


def test_top_once_and_json_for_scripts(start_pilot: Any) -> None:
    rd, _ = busy_pilot(start_pilot)
    once = cli("top", "--rundir", rd, "--once")
    assert once.returncode == 0, once.stderr
    assert "queued 2" in once.stdout and "running 4" in once.stdout, once.stdout
    for node in ("local-0", "local-1"):
        assert node_line(once.stdout, node)[2] == "2/2", once.stdout
    proc = cli("top", "--rundir", rd, "--json")
    assert proc.returncode == 0, proc.stderr
    frame = json.loads(proc.stdout)
    assert [(n["name"], n["busy_cores"], n["cores"]) for n in frame["nodes"]] == [("local-0", 2, 2), ("local-1", 2, 2)]
    assert frame["queued"] == 2 and frame["unfinished"] == 6 and frame["jobs"]["FAILED"] == 1
    assert [(f["id"], f["exit_code"]) for f in frame["failures"]] == [("1", 3)]
    assert frame["tasks_per_second"] > 0 and frame["eta_seconds"] > 0  # the failed job ended just now


def test_tasks_per_second_counts_the_last_window_or_the_span_of_a_cut_list() -> None:
    from pilot.cli.top import tasks_per_second

    assert tasks_per_second([39, 95, 99, 101], now=100, window=60, capped=False) == 2 / 60  # 101: not yet
    assert tasks_per_second([90, 95, 99], now=100, window=60, capped=True) == 3 / 10  # all in it: its span
    assert tasks_per_second([30, 95, 99], now=100, window=60, capped=True) == 2 / 60
    assert tasks_per_second([], now=100, window=60, capped=False) == 0.0


def test_top_without_a_pilot_says_so(pilot_home: Any) -> None:
    proc = cli("top", "--name", "nothing", "--once")
    assert proc.returncode == 1 and "no pilot is running in" in proc.stderr and "Traceback" not in proc.stderr
    bad = cli("top", "--failures", "-1")
    assert bad.returncode == 2 and "--failures" in bad.stderr

"""The accounting record that outlives the daemon: 'pilot history' and 'pilot show' after 'pilot down'
(and across pilot lives), and the daemon log's one structured line per job end."""

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
TWO = '[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 1\n'

pytestmark = pytest.mark.timeout(120)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "pilot", *args], env=dict(os.environ), capture_output=True, text=True, timeout=60
    )


def history(rd: str, *args: str) -> list[dict[str, Any]]:
    proc = cli("history", "--rundir", rd, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    out: list[dict[str, Any]] = json.loads(proc.stdout)
    return out


def test_history_and_show_outlive_the_daemon(start_pilot: Any) -> None:
    pilot = start_pilot(TWO)
    agents_active(pilot.executor(), 2)
    rd = str(pilot.rundir.path)
    first = cli("submit", "--rundir", rd, "--array", "1-3", "--wait", "--", "/bin/sh", "-c", "exit $(( {i} - 1 ))")
    assert first.returncode == 1, first.stderr
    run = first.stdout.split(":")[0]
    assert cli("down", "--rundir", rd).returncode == 0
    assert pilot.rundir.read_info() is None

    rows = history(rd)
    assert [(r["id"], r["state"], r["exit_code"], r["run"]) for r in rows] == [
        ("1", "COMPLETED", 0, run),
        ("2", "FAILED", 1, run),
        ("3", "FAILED", 2, run),
    ]
    for r in rows:
        assert r["nodes"] and r["cores"] == 1 and r["submitted"] <= r["started"] <= r["ended"]
        assert r["delivered"]["processes"] == 1
    assert [r["id"] for r in history(rd, "--state", "FAILED")] == ["2", "3"]
    text = cli("history", "--rundir", rd).stdout.splitlines()
    assert text[0].split()[:3] == ["id", "name", "state"] and len(text) == 4

    shown = cli("show", "--rundir", rd, "3")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == "job 3 (/bin/sh): FAILED, exit 2"
    assert "  Delivered: wall " in shown.stdout
    xml = cli("show", "--rundir", rd, "3", "--xml")
    assert xml.returncode == 2 and "kept only while its pilot runs; drop --xml" in xml.stderr
    missing = cli("show", "--rundir", rd, "9")
    assert missing.returncode == 1 and "no job '9' in the history of" in missing.stderr

    # A second life on the same run directory: its ids start again; both lives stay in the history.
    pilot.up_again()
    agents_active(pilot.executor(), 2)
    again = cli("submit", "--rundir", rd, "--wait", "--json", "--", "/bin/echo", "second life")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["ids"] == ["1"]
    live = history(rd)  # the running pilot's jobs with the earlier life's
    assert [(r["id"], r["state"]) for r in live] == [
        ("1", "COMPLETED"),
        ("2", "FAILED"),
        ("3", "FAILED"),
        ("1", "COMPLETED"),
    ]
    assert cli("show", "--rundir", rd, "3", "--json").returncode == 0  # job 3 of the earlier life, pilot running
    assert cli("down", "--rundir", rd).returncode == 0
    one = json.loads(cli("show", "--rundir", rd, "1", "--json").stdout)[0]
    assert one["command"] == ["/bin/echo", "second life"]  # the latest life's job 1
    assert len(history(rd)) == 4


def test_daemon_log_has_one_structured_line_per_job_end(start_pilot: Any) -> None:
    pilot = start_pilot(TWO)
    agents_active(pilot.executor(), 2)
    rd = str(pilot.rundir.path)
    proc = cli("submit", "--rundir", rd, "--array", "1-4", "--wait", "--", "/bin/sh", "-c", "exit $(( {i} % 2 ))")
    assert proc.returncode == 1
    ended = [
        line
        for line in (json.loads(t) for t in pilot.rundir.log_file.read_text().splitlines() if t.startswith("{"))
        if line.get("event") == "job ended"
    ]
    assert sorted(e["job"] for e in ended) == ["1", "2", "3", "4"]
    for e in ended:
        assert e["level"] == "info"
        i = int(e["job"])
        assert (e["state"], e["exit_code"]) == (("FAILED", 1) if i % 2 else ("COMPLETED", 0))
        assert e["nodes"] and e["nodes"][0].startswith("local-") and e["processors"] == 1 and e["wall"] >= 0
        assert e["run"].startswith("run-") and e["name"] == "/bin/sh"


def test_history_before_any_says_so(pilot_home: Path) -> None:
    proc = cli("history", "--rundir", str(pilot_home / "fresh"))
    assert proc.returncode == 1 and "no job history in" in proc.stderr and "Traceback" not in proc.stderr

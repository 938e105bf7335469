"""The operator's job commands through the real CLI and real daemons: 'pilot jobs', 'cancel', 'show',
'ls', the one rule that picks a pilot (--name, PILOT_NAME, the config's pilot.name), and 'pilot run'
refusing to start an embedded pilot silently while another pilot of the user's runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pilot_waits import agents_active, wait_for

PYTHON = sys.executable
TWO = '[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 2\n'

pytestmark = pytest.mark.timeout(120)


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "pilot", *args], env=env or dict(os.environ), capture_output=True, text=True, timeout=timeout
    )


def rows(*args: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    proc = cli("jobs", "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    out: list[dict[str, Any]] = json.loads(proc.stdout)
    return out


def run_id(stderr: str) -> str:
    """The run id 'pilot run' prints first: 'pilot run: run-...: N task(s) of ...'."""
    line = next(ln for ln in stderr.splitlines() if ln.startswith("pilot run: run-"))
    return line.split(": ")[1]


def test_jobs_lists_and_filters_by_state_name_run_and_since(start_pilot: Any) -> None:
    start_pilot(TWO, name="p")
    good = cli("run", "--name", "p", "-n", "3", "--", "/bin/true")
    assert good.returncode == 0, good.stderr
    bad = cli("run", "--name", "p", "-n", "2", "--", "/bin/false")
    assert bad.returncode == 1
    good_run, bad_run = run_id(good.stderr), run_id(bad.stderr)
    assert good_run != bad_run

    everything = rows("--name", "p")
    assert [r["id"] for r in everything] == ["1", "2", "3", "4", "5"]
    assert [r["state"] for r in everything] == ["COMPLETED"] * 3 + ["FAILED"] * 2
    for r in everything:
        assert r["nodes"] and r["nodes"][0].startswith("local-") and r["cores"] == 1
        assert r["submitted"] <= r["started"] <= r["ended"]
    assert [r["exit_code"] for r in everything] == [0, 0, 0, 1, 1]

    assert [r["id"] for r in rows("--name", "p", "--state", "failed")] == ["4", "5"]
    assert [r["id"] for r in rows("--name", "p", "--state", "FAILED,COMPLETED")] == ["1", "2", "3", "4", "5"]
    assert [r["id"] for r in rows("--name", "p", "--run", good_run)] == ["1", "2", "3"]
    assert [r["id"] for r in rows("--name", "p", "--job-name", "*false")] == ["4", "5"]
    assert len(rows("--name", "p", "--since", "1h")) == 5
    tomorrow = (datetime.now() + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    assert rows("--name", "p", "--since", tomorrow) == []
    limited = cli("jobs", "--name", "p", "--limit", "2")
    assert limited.returncode == 0
    assert limited.stderr == "pilot jobs: earlier jobs left out: --limit, or narrow with --state, --run, --since\n"
    assert [ln.split()[0] for ln in limited.stdout.splitlines()[1:]] == ["4", "5"]

    text = cli("jobs", "--name", "p").stdout.splitlines()
    assert text[0].split() == ["id", "name", "state", "submitted", "started", "ended", "nodes", "cores", "exit", "run"]
    column = text[0].index("state")  # every row's state starts under its header: the columns are aligned
    assert [ln[column:].split()[0] for ln in text[1:]] == ["COMPLETED"] * 3 + ["FAILED"] * 2
    assert text[-1].rstrip().endswith(bad_run)
    none = cli("jobs", "--name", "p", "--state", "CANCELED")
    assert none.returncode == 0 and none.stdout.strip() == "no jobs match"


def test_cancel_by_id_state_and_run(start_pilot: Any) -> None:
    pilot = start_pilot('[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 2\n[pilot]\nbacklog = 0\n', name="p")
    agents_active(pilot.executor(), 1)
    env = dict(os.environ)
    sleeper = subprocess.Popen(
        [PYTHON, "-m", "pilot", "run", "--name", "p", "-n", "4", "--", "sleep", "60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: len(rows("--name", "p", "--state", "ACTIVE")) == 2, what="two running jobs")
        assert [r["id"] for r in rows("--name", "p", "--state", "QUEUED")] == ["3", "4"]
        one = cli("cancel", "--name", "p", "1")
        assert one.returncode == 0, one.stderr
        assert one.stdout.strip() == "job 1: canceled (was ACTIVE)"
        wait_for(lambda: rows("--name", "p", "--state", "CANCELED"), what="job 1 canceled")
        queued = cli("cancel", "--name", "p", "--state", "QUEUED", "--json")
        assert queued.returncode == 0, queued.stderr
        assert {r["id"] for r in json.loads(queued.stdout) if r["canceled"]} <= {"3", "4"}
        run = run_id(sleeper.stderr.readline())
        rest = cli("cancel", "--name", "p", "--run", run)
        assert rest.returncode == 0, rest.stderr
        out, err = sleeper.communicate(timeout=60)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
    assert sleeper.returncode == 1, (out, err)  # its jobs were canceled: not a success
    assert "0 completed, 0 failed, 4 canceled" in out
    assert {r["state"] for r in rows("--name", "p")} == {"CANCELED"}
    again = cli("cancel", "--name", "p", "1", "99")
    assert again.returncode == 1
    assert "job 1: had already ended CANCELED; nothing to cancel" in again.stdout
    assert "pilot cancel: no job '99' in this pilot" in again.stderr
    nothing = cli("cancel", "--name", "p")
    assert nothing.returncode == 2 and "name the jobs: IDs, --state STATE or --run RUN" in nothing.stderr
    ended = cli("cancel", "--name", "p", "--state", "COMPLETED")
    assert ended.returncode == 2 and "those jobs have ended" in ended.stderr


def test_cancel_of_a_deep_queue_by_state_and_run(start_pilot: Any) -> None:
    """The pilot picks the jobs and names them back in runs of ids: 3,000 queued jobs of two runs."""
    pilot = start_pilot('[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 1\n[pilot]\nbacklog = 0\n', name="p")
    agents_active(pilot.executor(), 1)
    first = cli("submit", "--name", "p", "--array", "1-2000", "--", "sleep", "60")
    second = cli("submit", "--name", "p", "--array", "1-1000", "--", "sleep", "60")
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert first.stdout.split(":")[1].strip() == "2000 job(s)", first.stdout
    run = second.stdout.split(":")[0]
    wait_for(lambda: len(rows("--name", "p", "--state", "ACTIVE")) == 1, what="job 1 running")
    by_run = cli("cancel", "--name", "p", "--run", run, "--json")
    assert by_run.returncode == 0, by_run.stderr
    assert [(r["id"], r["state"], r["canceled"]) for r in json.loads(by_run.stdout)] == [
        (str(i), "QUEUED", True) for i in range(2001, 3001)
    ]
    queued = cli("cancel", "--name", "p", "--state", "QUEUED")
    assert queued.returncode == 0, queued.stderr
    assert queued.stdout.splitlines() == [f"job {i}: canceled (was QUEUED)" for i in range(2, 2001)]
    wait_for(lambda: len(rows("--name", "p", "--state", "CANCELED", "--limit", "5000")) == 2999, what="2,999 canceled")
    both = cli("cancel", "--name", "p", "--state", "ACTIVE,QUEUED", "1", "5")
    assert both.returncode == 0, both.stderr
    assert both.stdout.splitlines() == [
        "job 1: canceled (was ACTIVE)",
        "job 5: had already ended CANCELED; nothing to cancel",
    ]


def test_show_is_human_by_default_with_xml_and_json(start_pilot: Any) -> None:
    start_pilot(TWO, name="p")
    done = cli("run", "--name", "p", "-n", "1", "--", "/bin/sh", "-c", "exit 3")
    assert done.returncode == 1
    assert "failed: job 1: exit 3: " in done.stdout and "'pilot show 1'" in done.stdout
    text = cli("show", "--name", "p", "1")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == "job 1 (/bin/sh): FAILED, exit 3"
    assert any(ln.startswith("  message:   ") and "exited with code 3" in ln for ln in lines)
    assert "  command:   /bin/sh -c 'exit 3'" in lines  # quoted: the line pastes back into a shell
    assert any(ln.startswith("  node(s):   local-") and ln.endswith("1 core(s)") for ln in lines)
    zone = datetime.now().astimezone().strftime("%Z")
    for key in ("submitted", "started", "ended"):
        line = next(ln for ln in lines if ln.startswith(f"  {key}:"))
        assert line.split(": ", 1)[1].split(" (")[0].endswith(zone), line  # local time, zone named
    assert any(ln.startswith("  Delivered: wall ") for ln in lines)

    as_json = json.loads(cli("show", "--name", "p", "1", "--json").stdout)[0]
    assert as_json["state"] == "FAILED" and as_json["exit_code"] == 3 and as_json["cores"] == 1
    assert as_json["delivered"]["processes"] == 1 and len(as_json["nodes"]) == 1
    xml = cli("show", "--name", "p", "1", "--xml").stdout
    assert xml.lstrip().startswith("<") and "</Job>" in xml and "Failed" in xml
    missing = cli("show", "--name", "p", "1", "7")
    assert missing.returncode == 1 and "pilot show: no job '7' in this pilot" in missing.stderr
    assert missing.stdout.startswith("job 1 (/bin/sh): FAILED")


def test_one_rule_picks_the_pilot_in_every_command(start_pilot: Any, tmp_path: Path) -> None:
    p = start_pilot('[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 1\n', name="p")
    q = start_pilot('[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 1\n', name="q")
    env = dict(os.environ)
    env.pop("PILOT_NAME", None)

    def pid_seen(*args: str, extra: dict[str, str] | None = None) -> int:
        proc = cli("status", "--json", *args, env=env | (extra or {}))
        assert proc.returncode == 0, proc.stderr
        return int(json.loads(proc.stdout)["pilot"]["pid"])

    assert pid_seen("--name", "p") == p.pid
    assert pid_seen(extra={"PILOT_NAME": "q"}) == q.pid
    assert pid_seen("--name", "p", extra={"PILOT_NAME": "q"}) == p.pid  # --name over PILOT_NAME
    cfg = tmp_path / "named.toml"
    cfg.write_text('[pilot]\nname = "q"\n')
    assert pid_seen(extra={"PILOT_CONFIG": str(cfg)}) == q.pid  # the config's pilot.name
    assert pid_seen(extra={"PILOT_CONFIG": str(cfg), "PILOT_NAME": "p"}) == p.pid  # PILOT_NAME over it
    # the same rule in the job commands
    ran = cli("run", "-n", "1", "--", "/bin/true", env=env | {"PILOT_CONFIG": str(cfg)})
    assert ran.returncode == 0, ran.stderr
    assert len(rows("--name", "q")) == 1 and rows("--name", "p") == []
    bad = cli("status", "--name", "a/b")
    assert bad.returncode == 2 and "'a/b' is not a pilot name" in bad.stderr
    nobody = cli("jobs", "--name", "r", env=env)
    assert nobody.returncode == 1 and "no pilot is running in" in nobody.stderr and "'pilot ls'" in nobody.stderr

    listed = json.loads(cli("ls", "--json").stdout)
    assert [(x["name"], x["state"], x["pid"]) for x in listed] == [("p", "running", p.pid), ("q", "running", q.pid)]
    text = cli("ls").stdout.splitlines()
    assert text[0].split() == ["name", "state", "pid", "up", "config"]
    assert [ln.split()[:3] for ln in text[1:]] == [["p", "running", str(p.pid)], ["q", "running", str(q.pid)]]
    down = cli("down", "--name", "q")
    assert down.returncode == 0, down.stderr
    after = json.loads(cli("ls", "--json").stdout)
    assert [(x["name"], x["state"], x.get("kept")) for x in after] == [
        ("p", "running", None),
        ("q", "stopped", "history"),
    ]
    assert cli("ls").stdout.splitlines()[2].split()[:2] == ["q", "stopped"]


def test_run_never_starts_an_embedded_pilot_silently(start_pilot: Any) -> None:
    p = start_pilot('[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 1\n', name="p")
    env = dict(os.environ)
    env.pop("PILOT_NAME", None)
    refused = cli("run", "-n", "1", env=env)
    assert refused.returncode == 1
    assert "no pilot is running in" in refused.stderr and f"p (pid {p.pid})" in refused.stderr
    assert "--name NAME" in refused.stderr and "--embedded" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert rows("--name", "p") == []
    embedded = cli("run", "-n", "2", "--embedded", "--json", env=env, timeout=120)
    assert embedded.returncode == 0, embedded.stderr
    assert "starting an embedded one for this run" in embedded.stderr
    assert json.loads(embedded.stdout)["completed"] == 2
    assert rows("--name", "p") == []  # not on p

"""Config sanity: 'pilot check' and 'pilot up' refuse a walltime not longer than walltime_margin and warn
of a node pattern that matches no node and of a batch site without a walltime; a local allocation ends
at its walltime as a batch one does; a job not started for lack of time names its duration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from pilot_waits import agents_active, wait_for

from pilot.rundir import RunDir

PYTHON = sys.executable

pytestmark = pytest.mark.timeout(120)


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "pilot", *args], env=dict(os.environ), capture_output=True, text=True, timeout=timeout
    )


def test_a_walltime_not_longer_than_the_margin_is_refused(pilot_home: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "short.toml"
    cfg.write_text('[pilot]\nwalltime_margin = 60\n[allocation]\nlrm = "local"\nwalltime = "1m"\n')
    for args in (["check"], ["up", "--rundir", str(pilot_home / "short")]):
        proc = cli(*args, "--config", str(cfg))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"pilot: config error: {cfg}: allocation.walltime = 60 s is not longer than ")
        assert "pilot.walltime_margin = 60 s" in proc.stderr and "raise the walltime or lower the margin" in proc.stderr
    assert RunDir(pilot_home / "short").read_info() is None


def test_a_batch_site_without_walltime_is_warned_of(pilot_home: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "batch.toml"
    cfg.write_text('[allocation]\nlrm = "slurm"\nnodes = 2\n[sites.more]\nlrm = "slurm"\nwalltime = "1h"\n')
    proc = cli("check", "--config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{cfg}: usable, with 1 warning(s)"
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"pilot check: warning: {cfg}: allocation (slurm) has no walltime")
    assert line.endswith("set allocation.walltime")


def test_up_warns_of_a_node_pattern_that_matches_no_node(pilot_home: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(
        '[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 1\n'
        '[nodes."gpu*"]\nfeatures = ["big"]\n[nodes."local-1"]\nfeatures = ["ssd"]\n'
    )
    rd = pilot_home / "n"
    up = cli("up", "--config", str(cfg), "--rundir", str(rd))
    try:
        assert up.returncode == 0, up.stderr
        [line] = up.stderr.splitlines()
        assert line == (
            f"pilot up: warning: {cfg}: [nodes.'gpu*'] matches no node of this pilot (local-0, local-1): "
            "what it sets applies nowhere; fix the pattern"
        )

        def status() -> str | None:
            text = cli("status", "--rundir", str(rd)).stdout
            return text if "local-0  active" in text and "local-1  active" in text else None

        text = wait_for(status, what="both agents")  # as for a batch site, whose node names come only now
        assert text.splitlines()[-1] == (
            "warning: [nodes.'gpu*'] of the config matches none of the 2 node(s) registered: "
            "what it sets applies nowhere"
        )
    finally:
        assert cli("down", "--rundir", str(rd)).returncode == 0
    clean = tmp_path / "clean.toml"
    clean.write_text(
        '[allocation]\nlrm = "local"\nnodes = 2\ncores_per_node = 1\n[nodes."local-*"]\nfeatures = ["x"]\n'
    )
    ok = cli("check", "--config", str(clean))
    assert ok.returncode == 0 and ok.stderr == "" and ok.stdout.strip() == f"{clean}: usable"


def test_a_local_allocation_ends_at_its_walltime(start_pilot: Any) -> None:
    pilot = start_pilot('[pilot]\nwalltime_margin = 1\n[allocation]\nlrm = "local"\nnodes = 2\nwalltime = 6\n')
    ex = pilot.executor()
    agents_active(ex, 2)
    agents = [p for p in psutil.Process(pilot.pid).children() if p.cmdline()[1:3] == ["-m", "agent"]]
    assert len(agents) == 2

    def ended() -> dict[str, Any] | None:
        st = json.loads(pilot.cli("status", "--json").stdout)
        a = st["allocation"]
        return a if a["state"] == "done" else None

    a = wait_for(ended, timeout=30, what="the allocation to end at its walltime")
    assert "ended at its walltime of 6 s (allocation.walltime)" in a["message"]
    _, alive = psutil.wait_procs(agents, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    text = pilot.cli("status").stdout
    assert "done, 2 node(s)" in text and "(ended at its walltime of 6 s (allocation.walltime))" in text
    after = cli("run", "--rundir", str(pilot.rundir.path), "-n", "1", "--duration", "1")
    assert after.returncode == 1 and "last allocation has ended" in after.stderr


def test_a_job_not_started_for_lack_of_time_names_its_duration(start_pilot: Any) -> None:
    pilot = start_pilot('[pilot]\nwalltime_margin = 5\n[allocation]\nlrm = "local"\nnodes = 1\nwalltime = "5m"\n')
    agents_active(pilot.executor(), 1)
    default = cli("run", "--rundir", str(pilot.rundir.path), "-n", "1", "--", "/bin/true")
    assert default.returncode == 1
    failed = next(ln for ln in default.stdout.splitlines() if ln.startswith("  failed: job 1: "))
    assert "JobAttributes.duration of 600 s (PSI/J's default of 10 minutes when none is set)" in failed
    assert "give it a shorter duration (JobAttributes.duration; pilot run/submit --duration)" in failed
    shorter = cli("run", "--rundir", str(pilot.rundir.path), "-n", "1", "--duration", "2m", "--", "/bin/true")
    assert shorter.returncode == 0, shorter.stdout
    bad = cli("run", "--rundir", str(pilot.rundir.path), "--duration", "soon")
    assert bad.returncode == 2 and "'soon' is not a duration" in bad.stderr

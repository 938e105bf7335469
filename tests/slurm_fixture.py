"""The real single-machine Slurm cluster (../shared/slurm): started once per test process (``slurm_kit``),
handed to one test at a time (``slurm_cluster``), shared by the Slurm tests.

Skips only when the start script is absent (a machine without the shared Slurm kit). Anywhere else a
Slurm that cannot start is a failure with the script's output, never a silent skip.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from machine_wide import machine_wide

START = Path(__file__).resolve().parents[2] / "shared" / "slurm" / "start-slurm.sh"


@pytest.fixture
def slurm_cluster(slurm_kit: dict[str, str]) -> Iterator[dict[str, str]]:
    """The Slurm test cluster, this test's alone while it runs (see machine_wide)."""
    with machine_wide("slurm"):
        yield slurm_kit


@pytest.fixture(scope="session")
def slurm_kit() -> dict[str, str]:
    """Start (or find running) the Slurm test cluster; returns its SLURM_CI_* summary values."""
    with machine_wide("slurm"):
        return _start()


def _start() -> dict[str, str]:
    if not START.is_file():
        pytest.skip(f"{START} is absent: no Slurm test cluster kit on this machine")
    try:
        proc = subprocess.run(["bash", str(START)], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{START} did not finish within 300 s:\n{exc.stdout}\n{exc.stderr}", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(
            f"{START} failed with exit code {proc.returncode} (it must run as root):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}",
            pytrace=False,
        )
    values = dict(
        line.split("=", 1) for line in proc.stdout.splitlines() if line.startswith("SLURM_CI_") and "=" in line
    )
    if "SLURM_CI_NODE_NAMES" not in values:
        pytest.fail(f"{START} printed no SLURM_CI_NODE_NAMES line:\n{proc.stdout}", pytrace=False)
    if not Path("/etc/slurm/slurm.conf").exists() and "SLURM_CONF" not in os.environ:
        os.environ["SLURM_CONF"] = "/var/lib/slurm-ci/etc/slurm.conf"
    return values

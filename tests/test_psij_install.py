"""psij-python finds the ``pilot`` executor however the package is installed: a regular install and
``pip install -e .``, each into a throwaway venv, used from outside the checkout to run a job on a real
pilot. Offline: the venvs reach this environment's packages (psij-python, setuptools, pip ...) through
a folder of links that leaves ours out, and pip builds without isolation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pilot_waits import agents_active

ROOT = Path(__file__).resolve().parent.parent
#: What the project installs into site-packages: left out of the shared folder (only the install under test has it).
OURS = ("pilot", "client", "agent", "_pilot_psij_executor", "pilot_jobs", "__editable__", "pilot_descriptor")

pytestmark = pytest.mark.timeout(180)


def _shared_packages(target: Path) -> Path:
    """This environment's site-packages as links, without the project's own files and any .pth."""
    target.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if entry.name.startswith(OURS) or entry.suffix == ".pth":
            continue
        if entry.name == "psij-descriptors":
            (target / entry.name).mkdir()
            for d in entry.iterdir():
                if not d.name.startswith(OURS):
                    (target / entry.name / d.name).symlink_to(d)
            continue
        (target / entry.name).symlink_to(entry)
    return target


def _venv(path: Path, shared: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60)
    python = path / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "shared.pth").write_text(f"{shared}\n")
    return python


def _checkout_copy(target: Path) -> Path:
    """The project's files a build reads (not the working tree: an editable build writes into it)."""
    ignore = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "tests", "bench")
    shutil.copytree(ROOT, target, ignore=ignore, symlinks=True)
    return target


def _install(python: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


PROBE = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    import psij
    ex = psij.JobExecutor.get_instance("pilot", url=sys.argv[1])
    job = psij.Job(psij.JobSpec(executable="/bin/echo", arguments=["from psij"]))
    ex.submit(job)
    status = job.wait(timeout=timedelta(seconds=30))
    import client
    print(status.state if status else None, client.__file__)
    """
)


def _probe(python: Path, rundir: Path, cwd: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(python), "-c", PROBE, str(rundir)], capture_output=True, text=True, cwd=cwd, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split()


@pytest.mark.parametrize("editable", [True, False], ids=["pip-install-e", "pip-install"])
def test_psij_finds_the_executor_outside_the_checkout(start_pilot: Any, tmp_path: Path, editable: bool) -> None:
    pilot = start_pilot('[allocation]\nlrm = "local"\nnodes = 1\ncores_per_node = 1\n')
    agents_active(pilot.executor(), 1)
    shared = _shared_packages(tmp_path / "shared")
    python = _venv(tmp_path / "venv", shared)
    source = _checkout_copy(tmp_path / "src")
    _install(python, *(["-e"] if editable else []), str(source))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = subprocess.run(
        [str(python.parent / "pilot"), "--version"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        timeout=60,
    )
    assert script.returncode == 0 and script.stdout.startswith("pilot "), script.stderr  # the console script
    state, client_file = _probe(python, pilot.rundir.path, elsewhere)
    assert state == "COMPLETED"
    if editable:
        assert Path(client_file).is_relative_to(source)  # the checkout's own code, through the import hook
    else:
        assert Path(client_file).is_relative_to(tmp_path / "venv")

"""Fixtures that start real pilot daemons (real agents, real processes, real ZeroMQ sockets)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

import client as psij
from pilot.rundir import RunDir

PYTHON = sys.executable

#: The Slurm kit's session fixture (``slurm_kit``), behind the ``slurm_cluster`` its tests ask for.
pytest_plugins = ["slurm_fixture"]


@dataclass
class Pilot:
    """A daemon started with ``pilot up`` in its own run directory."""

    rundir: RunDir
    config: Path
    env: dict[str, str]
    executors: list[psij.JobExecutor] = field(default_factory=list)

    @property
    def info(self) -> dict[str, object]:
        info = self.rundir.read_info()
        assert info is not None, f"no pilot running in {self.rundir.path}"
        return info

    @property
    def pid(self) -> int:
        return int(self.info["pid"])  # type: ignore[call-overload]

    def executor(self, *, pipelined: bool = False) -> psij.JobExecutor:
        ex = psij.JobExecutor.get_instance("pilot", url=str(self.rundir.path), pipelined=pipelined)
        self.executors.append(ex)
        return ex

    def cli(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PYTHON, "-m", "pilot", *args, "--rundir", str(self.rundir.path)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def status(self) -> dict[str, object]:
        return self.executor().pilot_status()

    def kill9(self) -> None:
        """SIGKILL the daemon (its agents and their tasks live on) and wait until it is gone."""
        proc = psutil.Process(self.pid)
        proc.kill()
        try:
            proc.wait(timeout=20)
        except psutil.TimeoutExpired:
            assert proc.status() == psutil.STATUS_ZOMBIE, "the SIGKILLed daemon did not die"

    def up(self, *, foreground: bool = False) -> subprocess.CompletedProcess[str]:
        """``pilot up`` on this pilot's run directory and config (``--foreground``: until it exits)."""
        flags = ["--foreground"] if foreground else []
        return subprocess.run(
            [PYTHON, "-m", "pilot", "up", *flags, "--config", str(self.config), "--rundir", str(self.rundir.path)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def up_again(self) -> None:
        """``pilot up`` on the same run directory and config: a daemon that resumes from the journal."""
        proc = self.up()
        assert proc.returncode == 0, f"pilot up (restart) failed: {proc.stdout}\n{proc.stderr}"


@pytest.fixture
def pilot_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "ph"
    home.mkdir()
    monkeypatch.setenv("PILOT_HOME", str(home))
    monkeypatch.delenv("PILOT_CONFIG", raising=False)
    return home


@pytest.fixture
def start_pilot(pilot_home: Path, tmp_path: Path) -> Iterator[Callable[..., Pilot]]:
    """``start_pilot(config_toml_text, name=...)`` -> a running Pilot; all are stopped afterwards and
    the test fails if any of their processes (daemon, agents, tasks) is left behind."""
    started: list[Pilot] = []

    def start(config: str = "", *, name: str = "p") -> Pilot:
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(textwrap.dedent(config) or '[allocation]\nlrm = "local"\nnodes = 1\n')
        rundir = RunDir(pilot_home / name)
        env = dict(os.environ)
        proc = subprocess.run(
            [PYTHON, "-m", "pilot", "up", "--config", str(cfg), "--rundir", str(rundir.path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        p = Pilot(rundir=rundir, config=cfg, env=env)
        started.append(p)  # (first: a daemon that came up while 'pilot up' failed is stopped too)
        assert proc.returncode == 0, f"pilot up failed: {proc.stdout}\n{proc.stderr}"
        return p

    yield start

    for p in started:
        for ex in p.executors:
            ex.close()
        info = p.rundir.read_info()
        if info is None:
            continue
        pid = int(info["pid"])
        try:
            tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        _down(p.rundir)
        alive = _running(tree, timeout=20)
        for proc in alive:
            proc.kill()
        assert not alive, f"processes left running after 'pilot down': {alive}"


def _down(rundir: RunDir) -> None:
    """``pilot down`` run in this process (the command's own code: only the interpreter's start-up, a
    third of a second per pilot over the whole suite, is saved); whatever it says is dropped, as a
    teardown that finds the daemon already gone must."""
    from pilot.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(["down", "--rundir", str(rundir.path)])
        except SystemExit:
            pass


def _running(procs: list[psutil.Process], *, timeout: float) -> list[psutil.Process]:
    """Those of ``procs`` still running after ``timeout``; a zombie (exited, its reaper is init) counts as gone."""

    def gone(proc: psutil.Process) -> bool:
        try:
            return proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    _, alive = psutil.wait_procs([p for p in procs if not gone(p)], timeout=0)
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:
        _, alive = psutil.wait_procs(alive, timeout=0.05)
        alive = [p for p in alive if not gone(p)]
    return alive

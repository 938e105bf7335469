"""Launchers, one module each behind :class:`Launcher`."""

from __future__ import annotations

from pilot.launchers.base import Launcher, PlannedProcess, job_directory
from pilot.launchers.mpirun import MpirunLauncher
from pilot.launchers.multiple import MultipleLauncher
from pilot.launchers.single import SingleLauncher
from pilot.launchers.srun import SrunLauncher

LAUNCHERS: dict[str, Launcher] = {
    launcher.name: launcher for launcher in (SingleLauncher(), MultipleLauncher(), MpirunLauncher(), SrunLauncher())
}

__all__ = ["LAUNCHERS", "Launcher", "PlannedProcess", "job_directory"]

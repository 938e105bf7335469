"""Registers the ``pilot`` executor with psij-python (found by its ``psij-descriptors`` scan)."""

from packaging.version import Version
from psij.descriptor import Descriptor

__PSI_J_EXECUTORS__ = [
    Descriptor(name="pilot", nice_name="Pilot", version=Version("0.1.0"), cls="client.psij_executor.PilotJobExecutor")
]

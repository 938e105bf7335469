"""Registers the ``pilot`` executor with psij-python (found by its ``psij-descriptors`` scan).

psij-python runs this file at every ``import psij``: keep it to imports that start nothing. It loads
``client/psij_executor.py`` by path from the same sys.path entry as this directory.
"""

from packaging.version import Version
from psij.descriptor import Descriptor

from pilot import __version__

__PSI_J_EXECUTORS__ = [
    Descriptor(
        name="pilot", nice_name="Pilot", version=Version(__version__), cls="client.psij_executor.PilotJobExecutor"
    )
]

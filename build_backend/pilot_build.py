"""The project's build backend: setuptools', plus what psij-python needs to find the ``pilot`` executor
after ``pip install -e .``.

psij-python finds executors by looking for a ``psij-descriptors`` folder in every ``sys.path`` entry
and loads each one's class by path from that same entry. A regular wheel puts ours (and ``client/``)
in site-packages, where it looks. An editable install puts nothing there: setuptools maps the packages
onto the checkout with an import hook, so no ``sys.path`` entry holds them and psij never sees the
executor from outside the checkout. So the editable wheel gets two small files of its own, installed
into site-packages: a descriptor, and the module it names, which imports the executor through the
import hook. Nothing else changes: every other hook is setuptools'.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 -- every other hook as setuptools has it

#: The descriptor psij-python finds in site-packages/psij-descriptors (it runs it at every ``import psij``).
DESCRIPTOR = '''"""Registers the ``pilot`` executor of an editable install with psij-python (see build_backend)."""

from packaging.version import Version
from psij.descriptor import Descriptor

from pilot import __version__

__PSI_J_EXECUTORS__ = [
    Descriptor(
        name="pilot", nice_name="Pilot", version=Version(__version__), cls="_pilot_psij_executor.PilotJobExecutor"
    )
]
'''

#: The module psij-python loads by path from site-packages: the executor, imported through the import hook.
SHIM = '''"""The ``pilot`` executor for psij-python, from an editable install (see build_backend)."""

from client._psij_plugin import PilotJobExecutor

__all__ = ["PilotJobExecutor"]
'''

EXTRA = {"psij-descriptors/pilot_descriptor.py": DESCRIPTOR, "_pilot_psij_executor.py": SHIM}


def build_editable(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    name: str = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    add_files(Path(wheel_directory) / name, EXTRA)
    return name


def add_files(wheel: Path, files: dict[str, str]) -> None:
    """Add ``files`` (path in the wheel -> text) to ``wheel``, each with its line in the RECORD."""
    with zipfile.ZipFile(wheel) as z:
        entries = [(info, z.read(info)) for info in z.infolist()]
    record = next(info.filename for info, _ in entries if info.filename.endswith(".dist-info/RECORD"))
    lines = []
    for path, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{path},sha256={digest},{len(data)}\n")
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for info, data in entries:
            if info.filename == record:
                data = data + "".join(lines).encode()
            out.writestr(info, data)
        for path, text in files.items():
            out.writestr(path, text)
    tmp.replace(wheel)

"""One test at a time on a machine-wide resource (the Slurm cluster, the Grid Engine cell), across the
processes of a parallel run (pytest-xdist workers): the cluster holds only so many allocations at once,
and a second pilot's sbatch would wait for the first's nodes."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def machine_wide(name: str) -> Iterator[None]:
    """Hold the lock named ``name`` (an flock on a file in the temporary directory) while inside."""
    with open(Path(tempfile.gettempdir()) / f"pilot-tests-{name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)

"""The operating system's name of a pilot thread: its Python name, so that ``top -H``, ``ps -L``, perf,
py-spy and ``/proc/<pid>/task/*/comm`` tell a chain from the reaper or the client's reader (Python
threads are all called after the interpreter otherwise). ``python -m bench.threads`` groups each
process's CPU per task by these names."""

from __future__ import annotations

import threading
from typing import Final

from setproctitle import setthreadtitle

#: Bytes the kernel keeps of a thread's name (``TASK_COMM_LEN`` less its NUL); longer names are cut.
LIMIT: Final = 15


def name_os_thread(name: str | None = None) -> None:
    """Give the calling thread ``name`` (default: its Python name) as its OS name, its first ``LIMIT``
    characters (the pilot's names are ASCII). Nothing happens where the platform has no thread names."""
    setthreadtitle((threading.current_thread().name if name is None else name)[:LIMIT])

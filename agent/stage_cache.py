"""The node's stage-in cache: a remote source staged by many tasks on this node is fetched once and
linked into each task's directory (JRDL's fileStageIn: "staged into the cache; a symbolic link from the
cache to the local file").

An entry is keyed by the source URL (a ``file`` source copied in: also by the file's identity and
version, so a file changed since is read again, and each task then gets a local copy of the entry) and
kept for the agent's life. Entries are read-only: a task that
wants to change its copy writes a new file (writing through the link fails, never the next task's
input). Concurrent stage-ins of one source wait for the one fetch under way; a failed fetch is not kept,
so a later task tries again.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path


class _Entry:
    __slots__ = ("done", "error", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done = threading.Event()
        self.error: BaseException | None = None


class StageCache:
    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        #: Stage-ins served from the cache / fetched into it (what the tests and the agent's log show).
        self.hits = 0
        self.fetches = 0

    def get(self, url: str, fetch: Callable[[Path], None]) -> tuple[Path, bool]:
        """The cached file for ``url`` (fetched with ``fetch(path)`` if no other stage-in has), and
        whether it was a hit. Raises what the fetch raised."""
        with self._lock:
            entry = self._entries.get(url)
            owner = entry is None
            if entry is None:
                digest = hashlib.sha256(url.encode()).hexdigest()[:32]
                entry = self._entries[url] = _Entry(self._dir / digest)
        if not owner:
            entry.done.wait()
            if entry.error is not None:
                raise entry.error
            with self._lock:
                self.hits += 1
            return entry.path, True
        try:
            self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fetch(entry.path)
            os.chmod(entry.path, 0o444)
        except BaseException as exc:
            entry.error = exc
            with self._lock:
                del self._entries[url]
            entry.done.set()
            raise
        with self._lock:
            self.fetches += 1
        entry.done.set()
        return entry.path, False

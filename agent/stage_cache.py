"""The node's stage-in cache: a remote source staged by many tasks on this node is fetched once and
linked into each task's directory (JRDL's fileStageIn: "staged into the cache; a symbolic link from the
cache to the local file").

An entry is keyed by the source URL (a ``file`` source copied in: also by the file's identity and
version, so a file changed since is read again) and kept for the agent's life. Entries are read-only:
a task that links one and wants to change it writes a new file (writing through the link fails, never
the next task's input); a task that copies one gets a writable file of its own. Concurrent stage-ins
of one source wait for the one fetch under way; a failed fetch is not kept, so a later task tries
again (and a fetch stopped half-way leaves no file in the cache).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from agent.transfers.base import Interrupted, Stop


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

    def get(self, url: str, fetch: Callable[[Path], None], *, stop: Stop) -> tuple[Path, bool]:
        """The cached file for ``url`` (fetched with ``fetch(path)`` if no other stage-in has), and
        whether it was a hit. Raises what the fetch raised; a fetch stopped for another order is
        taken over (this order fetches), and this order's ``stop`` ends its wait."""
        while True:
            with self._lock:
                entry = self._entries.get(url)
                owner = entry is None
                if entry is None:
                    digest = hashlib.sha256(url.encode()).hexdigest()[:32]
                    entry = self._entries[url] = _Entry(self._dir / digest)
            if owner:
                return self._fetch(url, entry, fetch)
            while not entry.done.wait(0.2):
                stop.check()
            if isinstance(entry.error, Interrupted):
                continue  # its order was stopped, not this one
            if entry.error is not None:
                raise entry.error
            with self._lock:
                self.hits += 1
            return entry.path, True

    def _fetch(self, url: str, entry: _Entry, fetch: Callable[[Path], None]) -> tuple[Path, bool]:
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

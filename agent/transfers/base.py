"""The transfer interface: one module per URL scheme behind :class:`Transfer`, so that rsync, scp or
Globus is one more module (and its scheme in ``pilot.model.staging``'s lists, which the daemon checks at
submit). A transfer runs in one of the stager's worker threads and may block; it raises
:class:`TransferError` with the cause in words a user can act on, and stops promptly when its
:class:`Stop` is set (a canceled job, a killed order, the agent going): a module registers how to break
off what it blocks in (a socket shut down) and checks between chunks."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar


class TransferError(Exception):
    """A transfer that failed; the message is the cause (the stager names the file and the node)."""


class Interrupted(TransferError):
    """A transfer stopped on request (its :class:`Stop` was set): not a failure of the transfer."""


class Stop:
    """One order's stop request, set from the agent's loop and seen by the worker thread's transfer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._hooks: list[Callable[[], None]] = []

    @property
    def reason(self) -> str | None:
        return self._reason

    def set(self, reason: str) -> None:
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    def check(self) -> None:
        if self._reason is not None:
            raise Interrupted(self._reason)

    def on_set(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Run ``hook`` (it must not block) when the stop is set, at once if it is; returns what
        unregisters it."""
        with self._lock:
            now = self._reason is not None
            if not now:
                self._hooks.append(hook)
        if now:
            hook()

        def remove() -> None:
            with self._lock:
                if hook in self._hooks:
                    self._hooks.remove(hook)

        return remove


class Transfer(ABC):
    #: The URL schemes this module serves.
    schemes: ClassVar[tuple[str, ...]]
    #: Its sources are remote: fetched once per node into the stage-in cache and placed from there.
    cached: ClassVar[bool] = False

    @abstractmethod
    def fetch(self, url: str, target: Path, *, mode: str, stop: Stop) -> None:
        """Stage in: put what ``url`` names at ``target`` (its parent exists) by ``mode`` (copy, link,
        move; a module that cannot link or move copies, as PSI/J allows). Nothing half-written stays at
        ``target`` when it fails or is stopped."""

    @abstractmethod
    def put(self, source: Path, url: str, *, mode: str, stop: Stop) -> None:
        """Stage out: put ``source`` (it exists) where ``url`` names, by ``mode``."""

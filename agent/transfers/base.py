"""The transfer interface: one module per URL scheme behind :class:`Transfer`, so that rsync, scp or
Globus is one more module (and its scheme in ``pilot.model.staging``'s lists, which the daemon checks at
submit). A transfer runs in one of the stager's worker threads and may block; it raises
:class:`TransferError` with the cause in words a user can act on."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar


class TransferError(Exception):
    """A transfer that failed; the message is the cause (the stager names the file and the node)."""


class Transfer(ABC):
    #: The URL schemes this module serves.
    schemes: ClassVar[tuple[str, ...]]
    #: Its sources are remote: fetched once per node into the stage-in cache and linked from there.
    cached: ClassVar[bool] = False

    @abstractmethod
    def fetch(self, url: str, target: Path, *, mode: str) -> None:
        """Stage in: put what ``url`` names at ``target`` (its parent exists) by ``mode`` (copy, link,
        move; a module that cannot link or move copies, as PSI/J allows)."""

    @abstractmethod
    def put(self, source: Path, url: str, *, mode: str) -> None:
        """Stage out: put ``source`` (it exists) where ``url`` names, by ``mode``."""

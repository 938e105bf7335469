"""The agent's transfer modules by URL scheme (the daemon accepts exactly these: a test keeps
``pilot.model.staging.SCHEMES_IN`` in step)."""

from __future__ import annotations

from agent.transfers.base import Interrupted, Stop, Transfer, TransferError
from agent.transfers.file import FileTransfer
from agent.transfers.http import HttpTransfer

TRANSFERS: dict[str, Transfer] = {scheme: t for t in (FileTransfer(), HttpTransfer()) for scheme in t.schemes}

__all__ = ["TRANSFERS", "Interrupted", "Stop", "Transfer", "TransferError"]

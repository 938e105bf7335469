"""Loaded by path by psij-python's plugin scan; a thin shim so the class has one identity."""

from __future__ import annotations

from client._psij_plugin import PilotJobExecutor

__all__ = ["PilotJobExecutor"]

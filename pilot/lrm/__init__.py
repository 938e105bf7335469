"""LRM executors, one module per batch system behind :class:`LrmExecutor`."""

from __future__ import annotations

from typing import Any

from pilot.config import ConfigError
from pilot.lrm.base import Allocation, AllocationRequest, AllocationState, LrmExecutor
from pilot.lrm.local import LocalExecutor

_REGISTRY: dict[str, type[LrmExecutor]] = {LocalExecutor.kind: LocalExecutor}


def create(kind: str, *, options: dict[str, Any], source: str) -> LrmExecutor:
    cls = _REGISTRY.get(kind)
    if cls is None:
        raise ConfigError(f"{source}: allocation.lrm = {kind!r}; known: {', '.join(sorted(_REGISTRY))}")
    return cls(options=options, source=source)


__all__ = ["Allocation", "AllocationRequest", "AllocationState", "LrmExecutor", "create"]

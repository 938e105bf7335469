"""LRM executors, one module per batch system behind :class:`LrmExecutor`."""

from __future__ import annotations

from typing import Any

from pilot.config import ConfigError
from pilot.lrm.base import Allocation, AllocationRequest, AllocationState, LrmExecutor
from pilot.lrm.flux import FluxExecutor
from pilot.lrm.local import LocalExecutor
from pilot.lrm.lsf import LsfExecutor
from pilot.lrm.pbs import PbsExecutor
from pilot.lrm.sge import SgeExecutor
from pilot.lrm.slurm import SlurmExecutor

_REGISTRY: dict[str, type[LrmExecutor]] = {
    cls.kind: cls for cls in (LocalExecutor, SlurmExecutor, PbsExecutor, LsfExecutor, FluxExecutor, SgeExecutor)
}


def create(kind: str, *, options: dict[str, Any], source: str, table: str = "allocation") -> LrmExecutor:
    """The executor for one site; ``table`` is the config table it comes from (``sites.NAME``), so its
    errors name the keys where they are written."""
    cls = _REGISTRY.get(kind)
    if cls is None:
        raise ConfigError(f"{source}: {table}.lrm = {kind!r}; known: {', '.join(sorted(_REGISTRY))}")
    return cls(options=options, source=source, table=table)


__all__ = ["Allocation", "AllocationRequest", "AllocationState", "LrmExecutor", "create"]

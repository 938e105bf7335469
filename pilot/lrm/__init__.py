"""LRM executors, one module per batch system behind :class:`LrmExecutor`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
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
    """The executor for one site; ``table`` is the config table it comes from (``sites.NAME``), so
    errors name the key where it is written."""
    cls = _REGISTRY.get(kind)
    if cls is None:
        raise ConfigError(f"{source}: {table}.lrm = {kind!r}; known: {', '.join(sorted(_REGISTRY))}")
    with in_table(table):
        return cls(options=options, source=source)


@contextmanager
def in_table(table: str) -> Iterator[None]:
    """The executors name keys as ``allocation.KEY``; a site's are ``sites.NAME.KEY``."""
    try:
        yield
    except ConfigError as exc:
        if table == "allocation":
            raise
        raise ConfigError(re.sub(r"\ballocation\.(?=[a-z_])", f"{table}.", str(exc))) from None


__all__ = ["Allocation", "AllocationRequest", "AllocationState", "LrmExecutor", "create", "in_table"]

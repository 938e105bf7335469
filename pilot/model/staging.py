"""A job's file staging, as every front-end hands it to the core and the agents carry it out.

Language-neutral on purpose: PSI/J's ``stage_in``/``stage_out``/``cleanup`` and JRDL's ``fileStageIn``/
``fileStageOut`` both compile to :class:`Staging`. Stage-in sources and stage-out targets are URLs (a
plain absolute path is a ``file`` URL); the other end is a path on the job's node, relative ones under the
job's directory. Only the schemes an agent has a transfer module for are accepted (:data:`SCHEMES_IN`,
:data:`SCHEMES_OUT`): anything else is refused at submit, not discovered on a node.

The daemon decides which stage-outs and whether the cleanup happen (by the job's outcome,
:meth:`Staging.outgoing`, :meth:`Staging.cleans_up`); an agent gets only the steps to do, as
:class:`Step` lists in a process order of role ``stage_in``, ``stage_out`` or ``cleanup``.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

#: URL schemes a stage-in may read from / a stage-out may write to (each has a module in agent/transfers).
SCHEMES_IN: Final = ("file", "http", "https")
SCHEMES_OUT: Final = ("file",)
MODES: Final = ("copy", "link", "move")
#: Cleanup steps: remove the path (the step's source).
REMOVE: Final = "remove"

#: StageOutFlags, by their PSI/J values.
IF_PRESENT: Final = 1
ON_SUCCESS: Final = 2
ON_ERROR: Final = 4
ON_CANCEL: Final = 8
ALWAYS: Final = ON_SUCCESS | ON_ERROR | ON_CANCEL
#: The job's outcome -> the flag that selects it.
OUTCOME_FLAG: Final = {"COMPLETED": ON_SUCCESS, "FAILED": ON_ERROR, "CANCELED": ON_CANCEL}

_MAX_ITEMS: Final = 4096
_MAX_STR: Final = 1 << 16


class StagingError(ValueError):
    """A staging directive that can never be carried out as given; the message names it and the fix."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """One directive: ``source`` to ``target`` by ``mode``; ``flags`` (stage-out): when, and IF_PRESENT."""

    source: str
    target: str
    mode: str = "copy"
    flags: int = ALWAYS

    def to_wire(self) -> list[Any]:
        return [self.source, self.target, self.mode, self.flags]


@dataclass(frozen=True, slots=True)
class Staging:
    stage_in: tuple[Transfer, ...] = ()
    stage_out: tuple[Transfer, ...] = ()
    cleanup: tuple[str, ...] = ()
    cleanup_flags: int = ALWAYS

    def __bool__(self) -> bool:
        return bool(self.stage_in or self.stage_out or self.cleanup)

    def outgoing(self, outcome: str) -> list[Transfer]:
        """The stage-outs the job's outcome (COMPLETED, FAILED, CANCELED) selects."""
        flag = OUTCOME_FLAG[outcome]
        return [t for t in self.stage_out if t.flags & flag]

    def cleans_up(self, outcome: str) -> bool:
        return bool(self.cleanup) and bool(self.cleanup_flags & OUTCOME_FLAG[outcome])

    def to_wire(self) -> dict[str, Any]:
        """The description fields (only those that differ from the defaults)."""
        out: dict[str, Any] = {}
        if self.stage_in:
            out["stage_in"] = [t.to_wire()[:3] for t in self.stage_in]
        if self.stage_out:
            out["stage_out"] = [t.to_wire() for t in self.stage_out]
        if self.cleanup:
            out["cleanup"] = list(self.cleanup)
        if self.cleanup_flags != ALWAYS:
            out["cleanup_flags"] = self.cleanup_flags
        return out

    @classmethod
    def from_wire(cls, raw: dict[str, Any], *, where: str = "JobSpec") -> Staging:
        """From a description's ``stage_in``/``stage_out``/``cleanup``/``cleanup_flags`` (hostile input)."""
        stage_in = tuple(
            _transfer(item, where=f"{where}.stage_in", url_at=0, schemes=SCHEMES_IN)
            for item in _items(raw.get("stage_in"), f"{where}.stage_in")
        )
        stage_out = tuple(
            _transfer(item, where=f"{where}.stage_out", url_at=1, schemes=SCHEMES_OUT)
            for item in _items(raw.get("stage_out"), f"{where}.stage_out")
        )
        cleanup = []
        for item in _items(raw.get("cleanup"), f"{where}.cleanup"):
            if not isinstance(item, str) or not item or len(item) > _MAX_STR:
                raise StagingError(f"{where}.cleanup holds paths (non-empty strings), not {item!r}")
            path = job_path(item, where=f"{where}.cleanup")
            if path in (".", "/"):
                raise StagingError(f"{where}.cleanup {item!r} names a whole directory tree; list what to remove in it")
            cleanup.append(path)
        flags = _flags(raw.get("cleanup_flags", ALWAYS), f"{where}.cleanup_flags")
        return cls(stage_in, stage_out, tuple(cleanup), flags)


def job_path(path: str, *, where: str) -> str:
    """A path on the job's node: absolute, or relative and then kept under the job's directory."""
    if path.startswith("/"):
        return path
    norm = posixpath.normpath(path)
    if norm == ".." or norm.startswith("../"):
        raise StagingError(f"{where}: {path!r} leaves the job's directory; give an absolute path instead")
    return norm


def url_parts(url: str) -> tuple[str, str]:
    """(scheme, path) of a staging URL; a plain path is ``file``."""
    parts = urlsplit(url)
    return (parts.scheme or "file"), parts.path


def _items(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > _MAX_ITEMS:
        raise StagingError(f"{where} must be a list of at most {_MAX_ITEMS} items")
    return value


def _flags(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= (ALWAYS | IF_PRESENT):
        raise StagingError(f"{where} must be StageOutFlags (a whole number from 0 to 15), not {value!r}")
    return value if value & ALWAYS else value | ALWAYS  # no outcome named: every outcome


def _transfer(item: Any, *, where: str, url_at: int, schemes: tuple[str, ...]) -> Transfer:
    if not isinstance(item, list) or len(item) not in (3, 4) or not all(isinstance(s, str) for s in item[:3]):
        raise StagingError(f"{where} items are [source, target, mode(, flags)], not {item!r}")
    source, target, mode = item[:3]
    if not source or not target or len(source) > _MAX_STR or len(target) > _MAX_STR:
        raise StagingError(f"{where}: source and target must be non-empty (and shorter than {_MAX_STR})")
    if mode not in MODES:
        raise StagingError(f"{where}: mode {mode!r} is not one of {', '.join(MODES)}")
    url = item[url_at]
    scheme, path = url_parts(url)
    if scheme not in schemes:
        raise StagingError(
            f"{where}: {url!r} uses the URL scheme {scheme!r}, which this pilot cannot transfer; "
            f"use one of {', '.join(schemes)} (a plain absolute path is a file)"
        )
    if scheme == "file" and not path.startswith("/"):
        raise StagingError(f"{where}: {url!r} is not an absolute path; the client makes relative ones absolute")
    local = job_path(item[1 - url_at], where=where)
    flags = _flags(item[3], where=f"{where} flags") if len(item) == 4 else ALWAYS
    if url_at == 0:
        return Transfer(url, local, mode)
    return Transfer(local, url, mode, flags)


@dataclass(frozen=True, slots=True)
class Step:
    """What an agent does for one directive: ``action`` is a mode (copy, link, move) or ``remove``;
    ``if_present``: a missing source is skipped, not an error."""

    source: str
    target: str
    action: str
    if_present: bool = False

    def to_wire(self) -> list[Any]:
        return [self.source, self.target, self.action, self.if_present]

    @classmethod
    def from_wire(cls, raw: Any) -> Step:
        """Hostile input (a process order's ``staging``); raises ValueError naming what is wrong."""
        if not (
            isinstance(raw, list)
            and len(raw) == 4
            and all(isinstance(s, str) and len(s) <= _MAX_STR for s in raw[:3])
            and isinstance(raw[3], bool)
        ):
            raise ValueError(f"a staging step is [source, target, action, if_present], not {raw!r}")
        if raw[2] not in (*MODES, REMOVE):
            raise ValueError(f"unknown staging action {raw[2]!r}")
        return cls(raw[0], raw[1], raw[2], raw[3])


def steps_in(staging: Staging) -> list[Step]:
    return [Step(t.source, t.target, t.mode) for t in staging.stage_in]


def steps_out(transfers: list[Transfer]) -> list[Step]:
    return [Step(t.source, t.target, t.mode, bool(t.flags & IF_PRESENT)) for t in transfers]


def steps_cleanup(staging: Staging) -> list[Step]:
    return [Step(p, "", REMOVE, True) for p in staging.cleanup]


__all__ = [
    "ALWAYS",
    "IF_PRESENT",
    "MODES",
    "SCHEMES_IN",
    "SCHEMES_OUT",
    "Staging",
    "StagingError",
    "Step",
    "Transfer",
]

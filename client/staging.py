"""File staging directives, with psij-python's names (``psij.staging`` on its development branch).

A job's files come in before its processes start (:class:`StageIn`), go out after they end
(:class:`StageOut`, selected by the job's outcome with :class:`StageOutFlags`), and listed paths are
removed last (``JobSpec.cleanup``). The pilot's agent does this on the node that runs the job; sources
and targets outside the job's node are URLs (``file://``, ``http://``, ``https://``).
"""

from __future__ import annotations

from enum import Enum, Flag
from pathlib import Path
from urllib.parse import ParseResult, urlparse


class URI:
    """A local path or a URL (RFC 3986), split into its parts."""

    def __init__(self, urlstring: str) -> None:
        self.parts: ParseResult = urlparse(urlstring)

    @property
    def scheme(self) -> str:
        return self.parts.scheme

    @property
    def hostname(self) -> str | None:
        return self.parts.hostname

    @property
    def port(self) -> int | None:
        return self.parts.port

    @property
    def netloc(self) -> str:
        return self.parts.netloc

    @property
    def path(self) -> str:
        return self.parts.path

    @property
    def params(self) -> str:
        return self.parts.params

    @property
    def query(self) -> str:
        return self.parts.query

    @property
    def fragment(self) -> str:
        return self.parts.fragment

    @property
    def username(self) -> str | None:
        return self.parts.username

    @property
    def password(self) -> str | None:
        return self.parts.password

    def __str__(self) -> str:
        return self.parts.geturl()

    def __repr__(self) -> str:
        return f"URI({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, URI) and other.parts == self.parts

    def __hash__(self) -> int:
        return hash(self.parts)


class StagingMode(Enum):
    """How a file is put in place. COPY is the default; LINK makes a symbolic link; MOVE renames."""

    COPY = 1
    LINK = 2
    MOVE = 3


class StageOutFlags(Flag):
    """When a stage-out (or the cleanup) happens. No outcome flag means every outcome (ALWAYS);
    IF_PRESENT makes a missing source no error."""

    NONE = 0
    IF_PRESENT = 1
    ON_SUCCESS = 2
    ON_ERROR = 4
    ON_CANCEL = 8
    ALWAYS = ON_SUCCESS | ON_ERROR | ON_CANCEL


def with_outcomes(flags: StageOutFlags) -> StageOutFlags:
    """``flags`` with ALWAYS added when it names no outcome (the rule StageOutFlags states)."""
    if not flags & StageOutFlags.ALWAYS:
        return flags | StageOutFlags.ALWAYS
    return flags


def _uri(value: URI | Path | str) -> URI:
    return value if isinstance(value, URI) else URI(str(value))


class StageIn:
    """Put ``source`` (a path on the submitting side's filesystem, or a URL) at ``target`` (relative:
    under the job's directory) before the job's processes start."""

    def __init__(self, source: URI | Path | str, target: str | Path, mode: StagingMode = StagingMode.COPY) -> None:
        self.source = _uri(source)
        self.target = Path(target)
        self.mode = mode

    def __repr__(self) -> str:
        return f"StageIn[{self.source} -> {self.target}, {self.mode}]"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StageIn) and (other.source, other.target, other.mode) == (
            self.source,
            self.target,
            self.mode,
        )

    def __hash__(self) -> int:
        return hash((self.source, self.target, self.mode))


class StageOut:
    """Put ``source`` (relative: under the job's directory) at ``target`` (a path or a URL) after the
    job's processes end, when ``flags`` select the job's outcome."""

    def __init__(
        self,
        source: str | Path,
        target: URI | Path | str,
        flags: StageOutFlags = StageOutFlags.ALWAYS,
        mode: StagingMode = StagingMode.COPY,
    ) -> None:
        self.source = Path(source)
        self.target = _uri(target)
        self.flags = flags
        self.mode = mode

    @property
    def flags(self) -> StageOutFlags:
        return self._flags

    @flags.setter
    def flags(self, flags: StageOutFlags) -> None:
        self._flags = with_outcomes(flags)

    def __repr__(self) -> str:
        return f"StageOut[{self.source} -> {self.target}, {self.flags}, {self.mode}]"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StageOut) and (other.source, other.target, other.flags, other.mode) == (
            self.source,
            self.target,
            self.flags,
            self.mode,
        )

    def __hash__(self) -> int:
        return hash((self.source, self.target, self.flags, self.mode))


__all__ = ["URI", "StageIn", "StageOut", "StageOutFlags", "StagingMode", "with_outcomes"]

"""Errors of the SSS job and node objects: each names the element (and its line when it came from XML)."""

from __future__ import annotations

from pilot.model.job_description import DescriptionError


class SssError(DescriptionError):
    """An SSS object that cannot be accepted as given. Subclasses :class:`DescriptionError` so the
    daemon's submit path refuses it like any other invalid job, with this message."""

    def __init__(self, message: str, *, element: str | None = None, line: int | None = None) -> None:
        self.element = element
        self.line = line
        self.reason = message
        where = []
        if line is not None:
            where.append(f"line {line}")
        if element:
            where.append(element)
        super().__init__(f"{', '.join(where)}: {message}" if where else message)

"""Front-ends: one module per job language, each compiling what was submitted to the one
:class:`~pilot.request.Request` shape. A document language carries its text under its own key in a
SUBMIT entry (and in the journal); anything else is a PSI/J description. A new language is one module
here and one line in :data:`DOCUMENTS`."""

from __future__ import annotations

from typing import Any, Final, Protocol

from pilot.frontends import jrdl, psij, sss
from pilot.model.job_description import JobDescription
from pilot.request import Request, Submission
from pilot.scheduler.cluster import Cluster


class FrontEnd(Protocol):
    def compile_entry(self, entry: Any, *, cluster: Cluster) -> Submission: ...

    def rebuild(self, description: JobDescription, extra: dict[str, Any], *, cluster: Cluster) -> Request: ...


#: Document languages by the key their text travels under.
DOCUMENTS: Final[dict[str, FrontEnd]] = {sss.DOCUMENT_KEY: sss, jrdl.DOCUMENT_KEY: jrdl}

#: What the journal keeps beside a job's description: its document, resolved dependency edges, Hold.
JOURNAL_EXTRAS: Final = (*DOCUMENTS, "edges", "hold")


def _frontend(entry: Any) -> FrontEnd:
    if isinstance(entry, dict):
        for key, module in DOCUMENTS.items():
            if key in entry:
                return module
    return psij


def is_document(entry: Any) -> bool:
    """Whether a SUBMIT entry is a document (answered with a list of ids; it carries no submit id)."""
    return _frontend(entry) is not psij


def compile_entry(entry: Any, *, cluster: Cluster) -> Submission:
    """One SUBMIT entry compiled by its language's front-end; DescriptionError says what to change."""
    return _frontend(entry).compile_entry(entry, cluster=cluster)


def rebuild(description: JobDescription, extra: dict[str, Any], *, cluster: Cluster) -> Request:
    """A journaled job's request, from its description and what the journal kept beside it."""
    return _frontend(extra).rebuild(description, extra, cluster=cluster)


__all__ = ["DOCUMENTS", "JOURNAL_EXTRAS", "FrontEnd", "compile_entry", "is_document", "rebuild"]

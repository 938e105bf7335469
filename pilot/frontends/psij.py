"""The PSI/J front-end: one JobDescription in its wire form (what the client's JobSpec becomes) compiled
to a one-group :class:`~pilot.request.Request`; dependencies come from its ``depends_on`` attribute."""

from __future__ import annotations

from typing import Any, Final

from pilot.model.job_description import DescriptionError, JobDescription
from pilot.request import PRIORITY_LIMIT, Request, Submission
from pilot.scheduler.cluster import Cluster
from pilot.scheduler.dag import DEPENDS_ON, dependencies_from_custom


def compile_entry(raw: Any, *, cluster: Cluster) -> Submission:
    """Raises DescriptionError naming the field at fault. ``raw`` is what the journal keeps: from_wire
    accepted it."""
    description = JobDescription.from_wire(raw)
    request = Request.of_description(description)
    custom = description.custom_attributes
    if DEPENDS_ON in custom:
        request.dependencies = tuple(dependencies_from_custom(custom))
    if PRIORITY in custom:
        request.priority = priority_from_custom(custom)
    return Submission([request], [raw])


def rebuild(description: JobDescription, extra: dict[str, Any], *, cluster: Cluster) -> Request:
    """A journaled job (its dependency edges are restored from the journal, not from here)."""
    request = Request.of_description(description)
    if PRIORITY in description.custom_attributes:
        request.priority = priority_from_custom(description.custom_attributes)
    return request


#: The custom attribute that orders the queue (higher first), as SSS <Priority> does.
PRIORITY: Final = "pilot.priority"


def priority_from_custom(custom: dict[str, Any]) -> int:
    value = custom[PRIORITY]
    if isinstance(value, bool) or not isinstance(value, int) or not -PRIORITY_LIMIT <= value <= PRIORITY_LIMIT:
        raise DescriptionError(
            f"JobAttributes.custom_attributes[{PRIORITY!r}] must be a whole number from {-PRIORITY_LIMIT} "
            f"to {PRIORITY_LIMIT} (higher runs first), not {value!r:.40}"
        )
    return value


__all__ = ["PRIORITY", "compile_entry", "priority_from_custom", "rebuild"]

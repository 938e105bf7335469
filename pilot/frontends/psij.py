"""The PSI/J front-end: one JobDescription in its wire form (what the client's JobSpec becomes) compiled
to a one-group :class:`~pilot.request.Request`; dependencies come from its ``depends_on`` attribute,
node requirements and preferences from its ``pilot.*`` ones."""

from __future__ import annotations

from typing import Any

from pilot.frontends import psij_requirements
from pilot.launchers.base import GroupLaunch, TaskLaunch
from pilot.model.job_description import DescriptionError, JobDescription
from pilot.request import PRIORITY, PRIORITY_LIMIT, Request, Submission
from pilot.scheduler.cluster import Cluster
from pilot.scheduler.dag import DEPENDS_ON, dependencies_from_custom


def compile_entry(raw: Any, *, cluster: Cluster) -> Submission:
    """Raises DescriptionError naming the field at fault. ``raw`` is what the journal keeps: from_wire
    accepted it."""
    description = JobDescription.from_wire(raw)
    request = _request(description, cluster)
    custom = description.custom_attributes
    if DEPENDS_ON in custom:
        request.dependencies = tuple(dependencies_from_custom(custom))
    if PRIORITY in custom:
        request.priority = priority_from_custom(custom)
    return Submission([request], [raw])


def rebuild(description: JobDescription, extra: dict[str, Any], *, cluster: Cluster) -> Request:
    """A journaled job (its dependency edges are restored from the journal, not from here)."""
    request = _request(description, cluster)
    if PRIORITY in description.custom_attributes:
        request.priority = priority_from_custom(description.custom_attributes)
    return request


def _request(description: JobDescription, cluster: Cluster) -> Request:
    """Slot placement, or matching when ``pilot.*`` custom attributes ask for nodes (see
    :mod:`pilot.frontends.psij_requirements`) or the site's attributes bind every job (FORCED ones,
    consumables with a default)."""
    if not (cluster.registry.binds_every_job or psij_requirements.has_requirements(description.custom_attributes)):
        return Request.of_description(description)
    resolved = psij_requirements.resolve(description, cluster)
    group = GroupLaunch(description.launcher, TaskLaunch(description))
    return Request(description, (group,), resolved=resolved, name=description.name)


def priority_from_custom(custom: dict[str, Any]) -> int:
    value = custom[PRIORITY]
    if isinstance(value, bool) or not isinstance(value, int) or not -PRIORITY_LIMIT <= value <= PRIORITY_LIMIT:
        raise DescriptionError(
            f"JobAttributes.custom_attributes[{PRIORITY!r}] must be a whole number from {-PRIORITY_LIMIT} "
            f"to {PRIORITY_LIMIT} (higher runs first), not {value!r:.40}"
        )
    return value


__all__ = ["PRIORITY", "compile_entry", "priority_from_custom", "rebuild"]

"""The PSI/J front-end: one JobDescription in its wire form (what the client's JobSpec becomes) compiled
to a one-group :class:`~pilot.request.Request`; dependencies come from its ``depends_on`` attribute,
node requirements and preferences from its ``pilot.*`` ones."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Final

from pilot.frontends import psij_requirements
from pilot.launchers.base import GroupLaunch, TaskLaunch
from pilot.model.job_description import DescriptionError, JobDescription
from pilot.request import PRIORITY, PRIORITY_LIMIT, Request, Submission
from pilot.scheduler.cluster import Cluster
from pilot.scheduler.dag import DEPENDS_ON, dependencies_from_custom


def compile_entry(raw: Any, *, cluster: Cluster) -> Submission:
    """Raises DescriptionError naming the field at fault. ``raw`` is what the journal keeps: from_wire
    accepted it. Jobs sent with the same description share one JobDescription (and, placed on slots
    without dependencies, one Request): a million queued copies of a job cost one description."""
    key = _flat_key(raw)
    if key is None:
        key = _frozen(raw, 0)
    hit = _SHARED.get(key) if key is not None else None
    if hit is not None and hit[1] is not None and not cluster.registry.binds_every_job:
        return Submission([hit[1]], [raw])
    description = JobDescription.from_wire(raw) if hit is None else hit[0]
    request = _request(description, cluster)
    custom = description.custom_attributes
    if DEPENDS_ON in custom:
        request.dependencies = tuple(dependencies_from_custom(custom))
    if PRIORITY in custom:
        request.priority = priority_from_custom(custom)
    if key is not None and hit is None:
        if len(_SHARED) >= _SHARED_MOST:
            _SHARED.clear()  # descriptions that all differ: sharing saves nothing, and costs no more than this
        plain = request.slots is not None and DEPENDS_ON not in custom  # made from the description alone
        _SHARED[key] = (description, request if plain else None)
    return Submission([request], [raw])


#: The descriptions (and plain requests) of recent jobs by their wire form: immutable, so shared.
_SHARED: Final[dict[Hashable, tuple[JobDescription, Request | None]]] = {}
_SHARED_MOST: Final = 1024
#: Wire forms nested deeper than this are not shared (none of a PSI/J description's fields is).
_DEPTH: Final = 8


def _flat_key(raw: Any) -> Hashable | None:
    """The key of a description whose values are all strings, numbers, booleans or None (a plain
    ``JobSpec(executable=...)``), in three tuples built in C: its field names, its values and their
    types (so 1, 1.0 and True stay three keys). None for any other (then :func:`_frozen` keys it), and
    for one holding a zero (0.0 and -0.0 are equal: :func:`_frozen` tells them apart)."""
    if type(raw) is not dict:
        return None
    values = tuple(raw.values())
    types = tuple(map(type, values))
    if not _FLAT.issuperset(types) or 0 in values:
        return None
    return (_FLAT_TAG, tuple(raw), values, types)


#: The value types :func:`_flat_key` takes (exact types, as msgpack gives them), and its keys' first item
#: (no key of :func:`_frozen` starts with it).
_FLAT: Final = frozenset({str, int, float, bool, type(None)})
_FLAT_TAG: Final = "flat"


def _frozen(value: Any, depth: int) -> Hashable | None:
    """A wire value as a hashable key that tells its types apart (1, 1.0 and True are three keys, so a
    value from_wire refuses is never taken for one it accepted); None: not to be shared."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        if depth >= _DEPTH:
            return None
        items = []
        for k, v in value.items():
            fk, fv = _frozen(k, depth + 1), _frozen(v, depth + 1)
            if fk is None or fv is None:
                return None
            items.append((fk, fv))
        return (dict, *items)
    if isinstance(value, list):
        if depth >= _DEPTH:
            return None
        frozen = [_frozen(v, depth + 1) for v in value]
        return None if None in frozen else (list, *frozen)
    if value is None:
        return (None,)
    if isinstance(value, float):
        return (float, value.hex())  # -0.0 and 0.0 apart
    if isinstance(value, bool | int | bytes):
        return (type(value), value)
    return None


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

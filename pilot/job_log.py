"""The daemon's 'job ended' log line, one per job: what 'grep' and log tools find after the fact.

It comes once per job, thousands per second, so it has a renderer of its own (:func:`body`) beside the
fields structlog is given (:func:`fields`); both write the same bytes (tests/test_log_lines.py)."""

from __future__ import annotations

from typing import Any

from pilot import logs
from pilot.jobs import JobRecord
from pilot.logs import json_string
from pilot.model.job_description import RUN_TAG

EVENT = "job ended"


def log_ended(logger: Any, jobs: list[JobRecord]) -> None:
    """One info line per job, all written at once."""
    logs.info_lines_of(logger, EVENT, jobs, fields=fields, body=body)


def _values(job: JobRecord) -> tuple[Any, ...]:
    """The line's values, in the order of its fields: the one place that says what the line holds."""
    m = job.metadata or {}
    d = job.description
    return (
        job.id,
        d.name,
        job.state._value_,
        job.exit_code,
        m.get("nodes") or [],
        m.get("processors", 0),
        round(float(m.get("wall_duration") or 0.0), 6),
        d.custom_attributes.get(RUN_TAG),
        job.message,
    )


_FIELDS = ("job", "name", "state", "exit_code", "nodes", "processors", "wall", "run", "message")


def fields(job: JobRecord) -> dict[str, Any]:
    """The line's fields, in their order."""
    return dict(zip(_FIELDS, _values(job), strict=True))


def body(job: JobRecord) -> str | None:
    """:func:`fields` rendered as :func:`pilot.logs.info_lines_of` renders plain fields; None when one
    of them is not of the type it nearly always is (then the general path renders it)."""
    job_id, name, state, code, nodes, processors, wall, run, message = _values(job)
    if type(nodes) is not list or type(processors) is not int or wall - wall != 0:  # (json writes inf as Infinity)
        return None
    if len(nodes) == 1:  # (nearly every job: one string, rendered as the list's loop would)
        node = nodes[0]
        if type(node) is not str:
            return None
        listed = json_string(node)
    else:
        texts = []
        for node in nodes:
            if type(node) is not str:
                return None
            texts.append(json_string(node))
        listed = ", ".join(texts)
    if code is None:
        ended = "null"
    elif type(code) is int:
        ended = int.__repr__(code)
    else:
        return None
    if (name is not None and type(name) is not str) or (run is not None and type(run) is not str):
        return None
    if message is not None and type(message) is not str:
        return None
    return (
        f'"job": {json_string(job_id)}, "name": {"null" if name is None else json_string(name)}, '
        f'"state": {json_string(state)}, "exit_code": {ended}, "nodes": [{listed}], '
        f'"processors": {int.__repr__(processors)}, "wall": {float.__repr__(wall)}, '
        f'"run": {"null" if run is None else json_string(run)}, '
        f'"message": {"null" if message is None else json_string(message)}'
    )

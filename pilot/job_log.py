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


def fields(job: JobRecord) -> dict[str, Any]:
    """The line's fields, in their order."""
    m = job.metadata or {}
    return dict(
        job=job.id,
        name=job.description.name,
        state=job.state.value,
        exit_code=job.exit_code,
        nodes=m.get("nodes") or [],
        processors=m.get("processors", 0),
        wall=round(float(m.get("wall_duration") or 0.0), 6),
        run=job.description.custom_attributes.get(RUN_TAG),
        message=job.message,
    )


def body(job: JobRecord) -> str | None:
    """:func:`fields` rendered as :func:`pilot.logs.info_lines_of` renders plain fields; None when one
    of them is not of the type it nearly always is (then the general path renders it)."""
    m = job.metadata or {}
    nodes = m.get("nodes") or []
    processors = m.get("processors", 0)
    wall = round(float(m.get("wall_duration") or 0.0), 6)
    code = job.exit_code
    d = job.description
    name = d.name
    run = d.custom_attributes.get(RUN_TAG)
    message = job.message
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
        f'"job": {json_string(job.id)}, "name": {"null" if name is None else json_string(name)}, '
        f'"state": {json_string(job.state.value)}, "exit_code": {ended}, "nodes": [{listed}], '
        f'"processors": {int.__repr__(processors)}, "wall": {float.__repr__(wall)}, '
        f'"run": {"null" if run is None else json_string(run)}, '
        f'"message": {"null" if message is None else json_string(message)}'
    )

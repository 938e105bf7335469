"""JobSpec -> the wire's job description. Duck-typed on purpose: the same function serves our own
JobSpec and psij-python's, whose attribute names are identical."""

from __future__ import annotations

import math
import os
from datetime import timedelta
from typing import Any

from client.exceptions import InvalidJobException

_SCALARS = (str, int, float, bool, type(None))


def spec_to_wire(spec: Any) -> dict[str, Any]:
    if spec is None:
        raise InvalidJobException("the job has no JobSpec: set job.spec before submitting")
    if not spec.executable:
        raise InvalidJobException("JobSpec.executable is not set: name the program to run")
    env = spec.environment or {}
    if not isinstance(env, dict):
        raise InvalidJobException("JobSpec.environment must be a dict of names to values")
    attrs = spec.attributes
    duration = getattr(attrs, "duration", None) if attrs is not None else None
    if isinstance(duration, timedelta):
        seconds: float | None = duration.total_seconds()
    elif isinstance(duration, int | float) and not isinstance(duration, bool):
        seconds = float(duration)
    elif duration is None:
        seconds = None
    else:
        raise InvalidJobException(f"JobAttributes.duration must be a timedelta, not {type(duration).__name__}")
    custom = dict(getattr(attrs, "custom_attributes", None) or {}) if attrs is not None else {}
    return {
        "executable": str(spec.executable),
        "arguments": [str(a) for a in (spec.arguments or [])],
        "directory": _opt_str(spec.directory),
        "name": _opt_str(getattr(spec, "name", None)),
        "inherit_environment": bool(spec.inherit_environment),
        "environment": {str(k): str(v) for k, v in env.items()},
        "stdin_path": _opt_str(spec.stdin_path),
        "stdout_path": _opt_str(spec.stdout_path),
        "stderr_path": _opt_str(spec.stderr_path),
        "pre_launch": _opt_str(spec.pre_launch),
        "post_launch": _opt_str(spec.post_launch),
        "launcher": spec.launcher or None,
        "resources": _resources(spec.resources),
        "duration": seconds,
        "queue_name": getattr(attrs, "queue_name", None),
        "project_name": getattr(attrs, "account", None) or getattr(attrs, "project_name", None),
        "reservation_id": getattr(attrs, "reservation_id", None),
        "custom_attributes": {str(k): v if isinstance(v, _SCALARS) else str(v) for k, v in custom.items()},
        "submit_directory": os.getcwd(),
    }


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _resources(res: Any) -> dict[str, Any] | None:
    if res is None:
        return None
    if getattr(res, "version", 1) != 1:
        raise InvalidJobException(f"only ResourceSpecV1 is supported, not version {res.version}")
    nodes = res.node_count
    procs = res.process_count
    ppn = res.processes_per_node
    count = procs or (nodes * (ppn or 1) if nodes else (ppn or 1))
    memory = getattr(res, "memory", None)
    return {
        "node_count": nodes,
        "process_count": procs,
        "processes_per_node": ppn,
        "cpu_cores_per_process": res.cpu_cores_per_process,
        "gpu_cores_per_process": res.gpu_cores_per_process,
        "exclusive_node_use": bool(res.exclusive_node_use),
        "memory_per_process": None if not memory else math.ceil(memory / count),
    }

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
    executable = spec.executable
    if not executable:
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
    # Only what differs from the pilot's defaults (None, empty, inherit the environment): every key
    # sent is encoded here, decoded and checked by the daemon and journaled with the job. (Written out
    # field by field: this runs for every job submitted.)
    description: dict[str, Any] = {"executable": str(executable)}
    if spec.arguments:
        description["arguments"] = [str(a) for a in spec.arguments]
    if (value := spec.directory) is not None:
        description["directory"] = str(value)
    if (value := getattr(spec, "name", None)) is not None:
        description["name"] = str(value)
    if not spec.inherit_environment:
        description["inherit_environment"] = False
    if env:
        description["environment"] = {str(k): str(v) for k, v in env.items()}
    if (value := spec.stdin_path) is not None:
        description["stdin_path"] = str(value)
    if (value := spec.stdout_path) is not None:
        description["stdout_path"] = str(value)
    if (value := spec.stderr_path) is not None:
        description["stderr_path"] = str(value)
    if (value := spec.pre_launch) is not None:
        description["pre_launch"] = str(value)
    if (value := spec.post_launch) is not None:
        description["post_launch"] = str(value)
    if spec.launcher:
        description["launcher"] = _text(spec.launcher, "JobSpec.launcher")
    if spec.resources is not None:
        description["resources"] = _resources(spec.resources)
    if seconds is not None:
        description["duration"] = seconds
    if attrs is not None:
        _put_attributes(description, attrs)
    if getattr(spec, "stage_in", None) or getattr(spec, "stage_out", None) or getattr(spec, "cleanup", None):
        description.update(_staging(spec))
    description["submit_directory"] = os.getcwd()
    return description


def _put_attributes(description: dict[str, Any], attrs: Any) -> None:
    """The job attributes other than its duration that are set (duck-typed: psij-python's too)."""
    if (value := getattr(attrs, "queue_name", None)) is not None:
        description["queue_name"] = _text(value, "JobAttributes.queue_name")
    if (value := getattr(attrs, "account", None) or getattr(attrs, "project_name", None)) is not None:
        description["project_name"] = _text(value, "JobAttributes.project_name")
    if (value := getattr(attrs, "reservation_id", None)) is not None:
        description["reservation_id"] = _text(value, "JobAttributes.reservation_id")
    if custom := getattr(attrs, "custom_attributes", None):
        description["custom_attributes"] = {
            str(k): v if isinstance(v, _SCALARS) else str(v) for k, v in dict(custom).items()
        }


def _text(value: Any, what: str) -> str:
    """A field the pilot takes as text, refused here when it is not (the encoder would write a date, a
    UUID or an enum as text of its own making)."""
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str.__str__(value)  # (its text, as msgpack wrote a str subclass; not an enum's name)
    raise InvalidJobException(f"{what} must be a string, not {type(value).__name__}")


def _staging(spec: Any) -> dict[str, Any]:
    """stage_in, stage_out, cleanup and cleanup_flags in their wire form (duck-typed: psij-python's
    development branch has the same names). Paths on the submitting side are made absolute here, against
    this process's working directory (the PSI/J rule); the pilot checks the rest and refuses what it
    cannot do (an unknown URL scheme, a relative target leaving the job's directory)."""
    out: dict[str, Any] = {}
    stage_in = getattr(spec, "stage_in", None)
    stage_out = getattr(spec, "stage_out", None)
    cleanup = getattr(spec, "cleanup", None)
    if stage_in:
        out["stage_in"] = [[_url(s.source, "stage_in"), str(s.target), _mode(s.mode)] for s in _ordered(stage_in)]
    if stage_out:
        out["stage_out"] = [
            [str(s.source), _url(s.target, "stage_out"), _mode(s.mode), _flag_value(s.flags)]
            for s in _ordered(stage_out)
        ]
    if cleanup:
        out["cleanup"] = sorted(str(p) for p in cleanup)
    flags = getattr(spec, "cleanup_flags", None)
    if cleanup and flags is not None:
        out["cleanup_flags"] = _flag_value(flags)
    return out


def _ordered(items: Any) -> list[Any]:
    """A set's items in a fixed order (by their text): the same job always stages alike."""
    try:
        return sorted(items, key=str)
    except TypeError:
        raise InvalidJobException("JobSpec staging directives must be a set or list of StageIn/StageOut") from None


def _url(value: Any, field: str) -> str:
    """A URL as given; a plain path (a Path, or a URI/string without scheme) made absolute."""
    text = str(value)
    if getattr(value, "scheme", None) or "://" in text:
        return text
    if not text:
        raise InvalidJobException(f"JobSpec.{field} has an empty path")
    return os.path.abspath(os.path.expanduser(text))


def _mode(mode: Any) -> str:
    name = getattr(mode, "name", None)
    if not isinstance(name, str):
        raise InvalidJobException(f"a staging mode must be a StagingMode, not {mode!r}")
    return name.lower()


def _flag_value(flags: Any) -> int:
    value = getattr(flags, "value", flags)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJobException(f"staging flags must be StageOutFlags, not {flags!r}")
    return value


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

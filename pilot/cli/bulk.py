"""What 'pilot submit' builds from its command line: many jobs from one command with placeholders
(``--array``, ``--each-line``) or from a JSON file (``--from-json``), each a plain map of the options
(:data:`FIELDS`) turned into a PSI/J job. Everything read from a file is checked and refused with the
line or index and the field at fault."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from pilot import config as config_mod
from pilot.cli.common import fail
from pilot.model.job_description import RUN_TAG
from pilot.model.output_stream import STREAM_OUTPUT

MAX_JOBS = 1_000_000
_RANGE = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?", re.ASCII)
#: The keys of one job, as --from-json takes them (and as the command line's options fill them).
FIELDS = {
    "command": "list of strings: the executable and its arguments",
    "name": "string",
    "directory": "string",
    "environment": "map of strings",
    "stdin": "string",
    "stdout": "string",
    "stderr": "string",
    "processes": "whole number >= 1",
    "cores": "whole number >= 1 (per process)",
    "gpus": "whole number >= 0 (per process)",
    "memory": "bytes, or a size such as '512M' (the job's total)",
    "duration": "seconds, or '10m', 'HH:MM:SS'",
    "launcher": "string: single, multiple, mpirun or srun",
    "depends_on": "string: [Condition[=code]:][name=]target, comma-separated",
}


def array_indices(text: str) -> list[int]:
    """'1-10', '0-99:10', '1,3,5-7' -> the indices, in order."""
    out: list[int] = []
    for part in text.split(","):
        m = _RANGE.fullmatch(part.strip())
        if m is None:
            fail(f"--array {text!r}: give ranges such as 1-100, 0-99:10 or 1,3,5-7", code=2)
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        step = int(m.group(3)) if m.group(3) is not None else 1
        if last < first or step < 1:
            fail(f"--array {text!r}: in {part.strip()!r} the range is empty (first > last, or step 0)", code=2)
        if len(out) + (last - first) // step + 1 > MAX_JOBS:
            fail(f"--array {text!r}: more than {MAX_JOBS:,} jobs in one submission; split it", code=2)
        out += range(first, last + 1, step)
    return out


def each_line(path: str) -> list[str]:
    """The non-blank lines of ``path`` ('-': stdin), without their line ends."""
    import sys

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"--each-line {path}: cannot read it: {getattr(exc, 'strerror', None) or exc}", code=2)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        fail(f"--each-line {path}: it has no line to run", code=2)
    if len(lines) > MAX_JOBS:
        fail(f"--each-line {path}: more than {MAX_JOBS:,} lines in one submission; split it", code=2)
    return lines


def fill(template: dict[str, Any], *, i: int | str, line: str | None = None) -> dict[str, Any]:
    """A copy of ``template`` with ``{i}`` (the index, or the line number) and ``{}`` (the line) put in
    its command and output paths. Other braces are left alone: '${HOME}' stays as written."""

    def put(text: str) -> str:
        text = text.replace("{i}", str(i))
        return text.replace("{}", line) if line is not None else text

    job = dict(template)
    job["command"] = [put(a) for a in template["command"]]
    for key in ("stdout", "stderr", "stdin", "name", "directory"):
        if isinstance(job.get(key), str):
            job[key] = put(job[key])
    return job


def from_json(path: str) -> list[dict[str, Any]]:
    """The jobs of a JSON file: a list of job maps (or {"jobs": [...]}), each checked."""
    import sys

    try:
        raw = json.loads(sys.stdin.read() if path == "-" else Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"--from-json {path}: cannot read it: {getattr(exc, 'strerror', None) or exc}", code=2)
    except json.JSONDecodeError as exc:
        fail(f"--from-json {path}: not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}", code=2)
    if isinstance(raw, dict) and set(raw) == {"jobs"}:
        raw = raw["jobs"]
    if not isinstance(raw, list) or not raw:
        fail(f'--from-json {path}: give a non-empty list of jobs (or {{"jobs": [...]}})', code=2)
    if len(raw) > MAX_JOBS:
        fail(f"--from-json {path}: more than {MAX_JOBS:,} jobs in one submission; split it", code=2)
    return [check(job, where=f"--from-json {path}: job {k}") for k, job in enumerate(raw)]


def check(job: Any, *, where: str) -> dict[str, Any]:
    """One job map, its fields checked and normalised (sizes and durations to numbers)."""
    if not isinstance(job, dict):
        fail(f"{where}: a job is a map of {', '.join(FIELDS)}", code=2)
    for key in job:
        if key not in FIELDS:
            fail(f"{where}: unknown key {key!r}; a job takes {', '.join(FIELDS)}", code=2)
    command = job.get("command")
    if isinstance(command, str):
        command = [command]
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command) or not command[0]:
        fail(f"{where}: 'command' must be a {FIELDS['command']}", code=2)
    out: dict[str, Any] = {"command": command}
    for key in ("name", "directory", "stdin", "stdout", "stderr", "launcher", "depends_on"):
        value = job.get(key)
        if value is not None:
            if not isinstance(value, str) or not value:
                fail(f"{where}: {key!r} must be a non-empty string", code=2)
            out[key] = value
    env = job.get("environment")
    if env is not None:
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            fail(f"{where}: 'environment' must be a {FIELDS['environment']}", code=2)
        out["environment"] = env
    for key, least in (("processes", 1), ("cores", 1), ("gpus", 0)):
        value = job.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                fail(f"{where}: {key!r} must be a {FIELDS[key]}", code=2)
            out[key] = value
    try:
        if job.get("memory") is not None:
            out["memory"] = config_mod.parse_size(job["memory"], key="memory", source=where)
        if job.get("duration") is not None:
            out["duration"] = config_mod.parse_duration(job["duration"], key="duration", source=where)
    except config_mod.ConfigError as exc:
        fail(str(exc), code=2)
    return out


def psij_job(job: dict[str, Any], *, run: str, keep_output: bool = True) -> Any:
    """The PSI/J job of one checked job map, tagged with its run. Its stdout and stderr, where it names no
    file, go to the node's stream file ('pilot logs' reads them), or with ``keep_output=False`` nowhere."""
    import client as psij

    custom: dict[str, Any] = {RUN_TAG: run, STREAM_OUTPUT: keep_output}
    if job.get("depends_on"):
        custom["depends_on"] = job["depends_on"]
    attributes = psij.JobAttributes(custom_attributes=custom)
    if job.get("duration") is not None:
        attributes.duration = timedelta(seconds=job["duration"])
    resources = None
    if any(job.get(k) is not None for k in ("processes", "cores", "gpus", "memory")):
        resources = psij.ResourceSpecV1(
            process_count=job.get("processes"),
            cpu_cores_per_process=job.get("cores"),
            gpu_cores_per_process=job.get("gpus"),
            memory=job.get("memory"),
        )
    command = job["command"]
    return psij.Job(
        psij.JobSpec(
            executable=command[0],
            arguments=command[1:],
            name=job.get("name"),
            directory=job.get("directory"),
            environment=job.get("environment"),
            stdin_path=job.get("stdin"),
            stdout_path=job.get("stdout"),
            stderr_path=job.get("stderr"),
            launcher=job.get("launcher"),
            resources=resources,
            attributes=attributes,
        )
    )

"""A job as the daemon accepts it: the validated, wire-level form of a PSI/J JobSpec.

The client builds the dict with :meth:`JobDescription.to_wire`; the daemon rebuilds it with
:meth:`JobDescription.from_wire`, which treats the dict as hostile and names the field at fault.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from pilot.model.output_stream import STREAM_OUTPUT
from pilot.model.staging import Staging, StagingError

LAUNCHERS: Final = ("single", "multiple", "mpirun", "srun")
_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch: "$" would let a final newline in
_MAX_STR: Final = 1 << 20
_MAX_ITEMS: Final = 1 << 16


class DescriptionError(ValueError):
    """A job description that can never run as given. The message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class ResourceRequest:
    """ResourceSpecV1 resolved to what placement needs: ranks and what each rank holds."""

    process_count: int = 1
    node_count: int | None = None  # exact number of nodes, when asked
    processes_per_node: int | None = None
    cpu_cores_per_process: int = 1
    gpu_cores_per_process: int = 0
    memory_per_process: int = 0  # bytes
    exclusive_node_use: bool = False

    @property
    def category(self) -> tuple[int, int | None, int | None, int, int, int, bool]:
        """Jobs of equal categories are placed alike: the queue keeps one head per category."""
        return (
            self.process_count,
            self.node_count,
            self.processes_per_node,
            self.cpu_cores_per_process,
            self.gpu_cores_per_process,
            self.memory_per_process,
            self.exclusive_node_use,
        )


@dataclass(frozen=True, slots=True)
class JobDescription:
    executable: str
    arguments: list[str] = field(default_factory=list)
    directory: str | None = None
    name: str | None = None
    inherit_environment: bool = True
    environment: dict[str, str] = field(default_factory=dict)
    stdin_path: str | None = None
    stdout_path: str | None = None
    stderr_path: str | None = None
    pre_launch: str | None = None
    post_launch: str | None = None
    launcher: str = "single"
    resources: ResourceRequest = field(default_factory=ResourceRequest)
    duration: float | None = None  # seconds of walltime
    queue_name: str | None = None
    project_name: str | None = None
    reservation_id: str | None = None
    custom_attributes: dict[str, Any] = field(default_factory=dict)
    submit_directory: str | None = None  # the client's cwd: the default job directory
    #: Files in before its processes, out after them, removed last (wire: stage_in, stage_out, cleanup,
    #: cleanup_flags, as PSI/J names them).
    staging: Staging = field(default_factory=Staging)

    def to_wire(self) -> dict[str, Any]:
        out = asdict(self)
        del out["staging"]
        out.update(self.staging.to_wire())
        return out

    @property
    def restartable(self) -> bool:
        """SSS ``Restartable``: run again elsewhere when its node is lost (PSI/J: custom attribute)."""
        return self.custom_attributes.get(RESTARTABLE) is True

    def streams_output(self, *, default: bool) -> bool:
        """Its stdout/stderr without a file go to its node's stream file (custom attribute, else the pilot's)."""
        value = self.custom_attributes.get(STREAM_OUTPUT)
        return value if isinstance(value, bool) else default

    @property
    def retries(self) -> int:
        value = self.custom_attributes.get(RETRIES)
        return value if isinstance(value, int) and not isinstance(value, bool) else DEFAULT_RETRIES

    @classmethod
    def from_wire(cls, raw: Any) -> JobDescription:
        """A description from its wire form (hostile input: every field checked). The client sends only
        what differs from the defaults, so the optional fields are looked at only when present."""
        if not isinstance(raw, dict):
            raise DescriptionError("job description must be a map")
        if not _FIELDS.issuperset(raw):
            unknown = set(raw) - _FIELDS
            raise DescriptionError(f"unknown job description field(s): {', '.join(sorted(map(str, unknown)))}")
        executable = _str(raw, "executable")
        if not executable:
            raise DescriptionError("JobSpec.executable is required: set it to the program to run")
        fields: dict[str, Any] = {}
        for name in _OPTIONAL_STRINGS:
            if raw.get(name) is not None:
                fields[name] = _str(raw, name)
        launcher = fields.get("launcher") or "single"
        if launcher not in LAUNCHERS:
            raise DescriptionError(f"JobSpec.launcher {launcher!r} is not known: use one of {', '.join(LAUNCHERS)}")
        fields["launcher"] = launcher
        directory = fields.get("directory")
        if directory is not None and not (directory.startswith("/") or directory.startswith("~/") or directory == "~"):
            raise DescriptionError(
                f"JobSpec.directory {directory!r} must be absolute or start with '~/' (the PSI/J rule)"
            )
        if raw.get("arguments"):
            fields["arguments"] = _str_list(raw, "arguments")
        if raw.get("environment"):
            env = fields["environment"] = _str_map(raw, "environment")
            for k in env:
                if not _NAME_RE.fullmatch(k):
                    raise DescriptionError(f"JobSpec.environment name {k!r} is not a valid variable name")
        if raw.get("inherit_environment") is not None:
            fields["inherit_environment"] = _bool(raw, "inherit_environment", True)
        duration = raw.get("duration")
        if duration is not None:
            if isinstance(duration, bool) or not isinstance(duration, int | float) or not duration > 0:
                raise DescriptionError("JobAttributes.duration must be a positive number of seconds")
            duration = float(duration)
            if not math.isfinite(duration):  # agents refuse such a walltime; no job runs forever
                raise DescriptionError("JobAttributes.duration must be a finite number of seconds")
            fields["duration"] = duration
        custom = raw.get("custom_attributes")
        if custom:
            if not isinstance(custom, dict) or not all(isinstance(k, str) for k in custom):
                raise DescriptionError("JobAttributes.custom_attributes must be a map with string keys")
            if not isinstance(custom.get(STREAM_OUTPUT, False), bool):
                raise DescriptionError(f"JobAttributes.custom_attributes[{STREAM_OUTPUT!r}] must be true or false")
            if not isinstance(custom.get(RESTARTABLE, False), bool):
                raise DescriptionError(f"JobAttributes.custom_attributes[{RESTARTABLE!r}] must be true or false")
            retries = custom.get(RETRIES, DEFAULT_RETRIES)
            if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
                raise DescriptionError(
                    f"JobAttributes.custom_attributes[{RETRIES!r}] must be a whole number from 0 to {MAX_RETRIES}"
                )
            fields["custom_attributes"] = custom
        if any(raw.get(k) is not None for k in _STAGING_FIELDS):
            try:
                fields["staging"] = Staging.from_wire(raw)
            except StagingError as exc:
                raise DescriptionError(str(exc)) from None
        return cls(executable=executable, resources=_resources(raw.get("resources")), **fields)


_STAGING_FIELDS: Final = ("stage_in", "stage_out", "cleanup", "cleanup_flags")
_FIELDS: Final = frozenset(JobDescription.__dataclass_fields__) - {"staging"} | frozenset(_STAGING_FIELDS)
_OPTIONAL_STRINGS: Final = (
    "directory",
    "name",
    "stdin_path",
    "stdout_path",
    "stderr_path",
    "pre_launch",
    "post_launch",
    "launcher",
    "queue_name",
    "project_name",
    "reservation_id",
    "submit_directory",
)
#: Custom attributes (PSI/J ``JobAttributes.custom_attributes``) that make a job restartable after node loss.
RESTARTABLE: Final = "pilot.restartable"
RETRIES: Final = "pilot.retries"
#: Names the run a job belongs to: what 'pilot run' and 'pilot submit' give their jobs, and what 'pilot jobs
#: --run', 'pilot cancel --run' and 'pilot resubmit --failed' select by. Free text; the pilot only keeps it.
RUN_TAG: Final = "pilot.run"


def run_of(custom: Any) -> str | None:
    """The run a job belongs to (its ``pilot.run`` custom attribute), if it is a string."""
    run = custom.get(RUN_TAG) if isinstance(custom, dict) else None
    return run if isinstance(run, str) else None


DEFAULT_RETRIES: Final = 3
MAX_RETRIES: Final = 100
_RES_FIELDS: Final = frozenset(ResourceRequest.__dataclass_fields__)


#: One process of one core: what most jobs ask for, shared (it is frozen).
_ONE_CORE: Final = ResourceRequest()


#: Requests already read, by their wire form and its types (so that 1.0 or True never passes for 1):
#: thousands of jobs of one workflow ask alike, and reading one costs more than looking it up.
_READ: dict[tuple[Any, ...], ResourceRequest] = {}
_READ_MAX: Final = 1024


def _resources(raw: Any) -> ResourceRequest:
    if raw is None:
        return _ONE_CORE
    if not isinstance(raw, dict):
        raise DescriptionError("JobSpec.resources must be a map")
    try:
        key = (*raw.items(), *map(type, raw.values()))
        known = _READ.get(key)
    except TypeError:  # an unhashable value: _read_resources says what is wrong with it
        return _read_resources(raw)
    if known is not None:
        return known
    request = _read_resources(raw)
    if len(_READ) >= _READ_MAX:
        _READ.clear()
    _READ[key] = request
    return request


def _read_resources(raw: dict[Any, Any]) -> ResourceRequest:
    unknown = set(raw) - _RES_FIELDS
    if unknown:
        raise DescriptionError(f"unknown ResourceSpecV1 field(s): {', '.join(sorted(map(str, unknown)))}")
    node_count = _opt_pos_int(raw, "node_count")
    process_count = _opt_pos_int(raw, "process_count")
    ppn = _opt_pos_int(raw, "processes_per_node")
    cores = _opt_pos_int(raw, "cpu_cores_per_process") or 1
    gpus = _opt_nonneg_int(raw, "gpu_cores_per_process") or 0
    memory = _opt_nonneg_int(raw, "memory_per_process") or 0
    exclusive = _bool(raw, "exclusive_node_use", False)
    if node_count is not None and ppn is not None:
        implied = node_count * ppn
        if process_count is not None and process_count != implied:
            raise DescriptionError(
                f"ResourceSpecV1 contradicts itself: process_count={process_count} but node_count={node_count}"
                f" x processes_per_node={ppn} = {implied}; set only two of the three"
            )
        process_count = implied
    if process_count is None:
        process_count = node_count if node_count is not None else (ppn or 1)
    if node_count is not None and process_count < node_count:
        raise DescriptionError(
            f"ResourceSpecV1 asks for {node_count} nodes but only {process_count} processes; "
            "every node needs at least one process"
        )
    if ppn is not None and node_count is None and process_count % ppn:
        raise DescriptionError(
            f"ResourceSpecV1 process_count={process_count} is not a multiple of processes_per_node={ppn}"
        )
    return ResourceRequest(
        process_count=process_count,
        node_count=node_count,
        processes_per_node=ppn,
        cpu_cores_per_process=cores,
        gpu_cores_per_process=gpus,
        memory_per_process=memory,
        exclusive_node_use=exclusive,
    )


def _str(raw: dict[str, Any], name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str):
        raise DescriptionError(f"JobSpec.{name} must be a string, not {type(value).__name__}")
    if len(value) > _MAX_STR:
        raise DescriptionError(f"JobSpec.{name} is longer than {_MAX_STR} characters")
    return value


def _opt_str(raw: dict[str, Any], name: str) -> str | None:
    if raw.get(name) is None:
        return None
    return _str(raw, name)


def _bool(raw: dict[str, Any], name: str, default: bool) -> bool:
    value = raw.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise DescriptionError(f"{name} must be true or false, not {type(value).__name__}")
    return value


def _str_list(raw: dict[str, Any], name: str) -> list[str]:
    value = raw.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DescriptionError(f"JobSpec.{name} must be a list of strings")
    if len(value) > _MAX_ITEMS:
        raise DescriptionError(f"JobSpec.{name} has more than {_MAX_ITEMS} items")
    return value


def _str_map(raw: dict[str, Any], name: str) -> dict[str, str]:
    value = raw.get(name) or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise DescriptionError(f"JobSpec.{name} must map strings to strings")
    if len(value) > _MAX_ITEMS:
        raise DescriptionError(f"JobSpec.{name} has more than {_MAX_ITEMS} entries")
    return value


def _opt_int(raw: dict[str, Any], name: str) -> int | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise DescriptionError(f"ResourceSpecV1.{name} must be an integer, not {type(value).__name__}")
    return value


def _opt_pos_int(raw: dict[str, Any], name: str) -> int | None:
    value = _opt_int(raw, name)
    if value is not None and value < 1:
        raise DescriptionError(f"ResourceSpecV1.{name} must be at least 1, not {value}")
    return value


def _opt_nonneg_int(raw: dict[str, Any], name: str) -> int | None:
    value = _opt_int(raw, name)
    if value is not None and value < 0:
        raise DescriptionError(f"ResourceSpecV1.{name} must not be negative, not {value}")
    return value

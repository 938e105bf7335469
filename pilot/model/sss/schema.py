"""What this pilot understands of the SSS job object (``../shared/specs/sss-job-object-3.1.txt``).

One row per element: its value type, the attributes it may carry, whether it may repeat, and
whether this pilot *acts* on it, keeps it as information, or cannot honour it (then the
``awarenessPolicy`` in force decides: Reject, the default, refuses the job; Warn and Ignore accept
it). The spec's property tables lost their element-name column in the copy we have; names are
taken from the spec's examples and prose, and otherwise from the description (noted ``inferred``).
"""

from __future__ import annotations

import functools
import getpass
import grp
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pilot.model.sss.job import Property


class Kind(StrEnum):
    STRING = "String"
    INTEGER = "Integer"
    FLOAT = "Float"
    BOOLEAN = "Boolean"
    DATETIME = "DateTime"  # seconds since the epoch (xsd:int)
    DURATION = "Duration"  # seconds
    CONTAINER = "Container"  # Environment: children, no text


class Level(StrEnum):
    JOB_GROUP = "JobGroup"
    JOB = "Job"
    TASK_GROUP = "TaskGroup"
    TASK = "Task"


CONSUMABLE_ATTRS: Final = frozenset({"context", "units", "metric", "duration", "consumptionRate", "dynamic"})
REQUESTED_ATTRS: Final = frozenset({"op", "conj", "group", "preference", "performanceFactor"})
DELIVERED_ATTRS: Final = frozenset({"group"})
OPS: Final = ("EQ", "NE", "LT", "GT", "LE", "GE", "Match")
CONJS: Final = ("And", "Or", "Nand", "Nor")
CONTEXTS: Final = ("Configured", "Available", "Used", "Dedicated")
RULES: Final = ("RoundRobin", "Pack", "Spread")
DISTRIBUTIONS: Final = ("Rule", "TasksPerNode", "ProcessorsPerTask", "Geometry")
CONDITIONS: Final = ("OnSuccess", "OnFailure", "OnExit")
DESIGNATORS: Final = ("JobId", "JobName")
OUTPUT_REDIRECTS: Final = ("Append", "Close", "Flush", "Keep", "Merge")
INPUT_REDIRECTS: Final = ("Close",)

#: ResourceLimit names (case-insensitive) and the setrlimit resource each one sets. The spec lists the
#: limits by description only; these names follow its example ``CPUTime``.
RLIMITS: Final[Mapping[str, str]] = {
    "coresize": "RLIMIT_CORE",
    "corefilesize": "RLIMIT_CORE",
    "cputime": "RLIMIT_CPU",
    "datasize": "RLIMIT_DATA",
    "filesize": "RLIMIT_FSIZE",
    "residentsetsize": "RLIMIT_RSS",
    "rss": "RLIMIT_RSS",
    "processes": "RLIMIT_NPROC",
    "maxprocesses": "RLIMIT_NPROC",
    "virtualmemory": "RLIMIT_AS",
    "lockedmemory": "RLIMIT_MEMLOCK",
    "openfiles": "RLIMIT_NOFILE",
    "stacksize": "RLIMIT_STACK",
}

#: Extensions this pilot acts on (name -> type it writes). They carry what PSI/J has and SSS does not.
KNOWN_EXTENSIONS: Final = frozenset(
    {"Launcher", "PreLaunch", "PostLaunch", "SubmitDirectory", "Exclusive", "Cores", "GPUs", "CustomAttribute"}
)


@dataclass(frozen=True, slots=True)
class ElementSpec:
    name: str
    kind: Kind = Kind.STRING
    attributes: frozenset[str] = frozenset()
    required: frozenset[str] = frozenset()
    repeatable: bool = False
    categories: str = ""  # "R" may be Requested, "D" may be Delivered
    acted: bool = False  # this pilot acts on it (else: kept as information)
    unsupported: str | None = None  # why this pilot cannot honour it at all
    check: Callable[[Property], str | None] | None = None  # a value this pilot cannot honour: why
    #: The same for the element uncategorized (the job's own value, not in <Requested>): why not.
    plain: Callable[[Property], str | None] | None = None

    def unsupported_value(self, prop: Property) -> str | None:
        if self.unsupported is not None:
            return self.unsupported
        return self.check(prop) if self.check is not None else None


def _interactive(p: Property) -> str | None:
    return "interactive jobs are not supported" if p.value.strip().lower() in ("true", "1") else None


def _notification(p: Property) -> str | None:
    return None if p.value.strip() in ("", "None") else "this pilot sends no notifications; use NotificationList None"


def _executable(p: Property) -> str | None:
    if p.value.startswith("#"):
        return "executables passed in SSSRMAP File objects ('#id') are not supported; give a path"
    return None


def _consumable(p: Property) -> str | None:
    if (p.get("dynamic") or "false").strip().lower() in ("true", "1"):
        return 'dynamic="true" (growing or shrinking a running job) is not supported'
    ctx = p.get("context")
    if ctx is not None and ctx not in CONTEXTS:
        return f"context {ctx!r} is not known: use one of {', '.join(CONTEXTS)}"
    return None


def _aggregation(allowed: tuple[str, ...]) -> Callable[[Property], str | None]:
    def check(p: Property) -> str | None:
        agg = p.get("aggregation")
        if agg is not None and agg not in allowed:
            return f"aggregation {agg!r} is not known: use one of {', '.join(allowed)}"
        return None

    return check


def _distribution(p: Property) -> str | None:
    kind = p.get("type") or "Rule"
    if kind not in DISTRIBUTIONS:
        return f"type {kind!r} is not known: use one of {', '.join(DISTRIBUTIONS)}"
    if kind == "Rule" and p.value.strip() not in RULES:
        return f"rule {p.value.strip()!r} is not known: use one of {', '.join(RULES)}"
    return None


def _dependency(p: Property) -> str | None:
    cond = p.get("condition") or "OnSuccess"
    if cond not in CONDITIONS:
        return f"condition {cond!r} is not known: use one of {', '.join(CONDITIONS)}"
    des = p.get("designator") or "JobId"
    if des not in DESIGNATORS:
        return f"designator {des!r} is not known: use one of {', '.join(DESIGNATORS)}"
    if p.get("code") is not None and cond != "OnExit":
        return 'code= is only meaningful with condition="OnExit"'
    return None


def _redirect(allowed: tuple[str, ...]) -> Callable[[Property], str | None]:
    def check(p: Property) -> str | None:
        raw = p.get("redirectList")
        if raw is None:
            return None
        bad = [r for r in (x.strip() for x in raw.split(",")) if r and r not in allowed]
        if bad:
            return f"redirectList value(s) {', '.join(bad)} not known: use {', '.join(allowed)}"
        return None

    return check


def _rlimit(p: Property) -> str | None:
    name = p.get("name") or ""
    if _norm(name) not in RLIMITS:
        return f"resource limit {name!r} has no setrlimit equivalent; known: {', '.join(sorted(set(RLIMITS)))}"
    kind = p.get("type")
    if kind is not None and kind not in ("Hard", "Soft"):
        return f'type {kind!r} is not known: use "Hard" or "Soft" (or omit it for both)'
    return None


def _extension(p: Property) -> str | None:
    name = p.get("name") or ""
    if name in KNOWN_EXTENSIONS or p.get("type") in ("CustomAttribute", "Attribute"):
        return None  # a typed (SGE complex) attribute: matching checks its name against the registry
    return f"Extension {name!r} is not one this pilot understands"


@functools.cache
def _identity() -> tuple[str, frozenset[str], frozenset[str]]:
    """Who this pilot runs jobs as (its user and group names) and where (this host's names)."""
    groups = set()
    for gid in {os.getgid(), *os.getgroups()}:
        try:
            groups.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            groups.add(str(gid))
    host = socket.gethostname()
    hosts = {host, host.split(".")[0], socket.getfqdn()}
    return getpass.getuser(), frozenset(groups), frozenset(hosts)


def _plain_user(p: Property) -> str | None:
    user = _identity()[0]
    if p.value.strip() == user:
        return None
    return f"this pilot runs every job as user {user!r}; it cannot run one as {p.value.strip()!r}"


def _plain_global_user(p: Property) -> str | None:
    return f"this pilot cannot check a global identity; it runs every job as user {_identity()[0]!r}"


def _plain_group(p: Property) -> str | None:
    groups = _identity()[1]
    if p.value.strip() in groups:
        return None
    return f"this pilot runs jobs with the groups {', '.join(sorted(groups))}; {p.value.strip()!r} is not one"


def _plain_machine(p: Property) -> str | None:
    hosts = _identity()[2]
    if p.value.strip() in hosts:
        return None
    return f"this pilot runs on {min(hosts, key=len)!r}, not on {p.value.strip()!r}"


def _plain_unchecked(p: Property) -> str | None:
    return (
        f"the job's own <{p.name}> is not checked by this pilot; put it in <Requested> to have it matched "
        "against this pilot's values"
    )


def _norm(name: str) -> str:
    return re.sub(r"[^a-z]", "", name.lower())


_e = ElementSpec


_CONS = CONSUMABLE_ATTRS
_RD = "RD"

#: Job properties (spec section 5.1, tables 2-4 and the structured elements). They may also appear in
#: TaskGroup and Task elements ("<!-- Job Properties -->*").
JOB_PROPERTIES: Final[Mapping[str, ElementSpec]] = {
    e.name: e
    for e in (
        _e("Application"),
        _e("Architecture", categories=_RD, acted=True),
        _e("Arguments", acted=True),
        _e("Charge", Kind.FLOAT, attributes=frozenset({"units"})),
        _e("Checkpointable", Kind.BOOLEAN),
        _e("CpuDuration", Kind.DURATION, categories="D"),
        _e("Deadline", Kind.DATETIME, unsupported="a deadline (must end by) cannot be guaranteed"),  # inferred
        _e("EligibleTime", Kind.DATETIME, unsupported="a start-after time is not supported"),  # inferred
        _e("EndTime", Kind.DATETIME),
        _e("Executable", acted=True, check=_executable),
        _e("ExitCode", Kind.INTEGER),
        _e("GlobalId"),  # inferred
        _e("Hold", repeatable=True, acted=True),
        _e("InitialWorkingDirectory", acted=True),
        _e("Interactive", Kind.BOOLEAN, check=_interactive),
        _e("Id"),
        _e("Name"),
        _e("State"),
        _e("Type"),
        _e("Machine", categories=_RD, acted=True, plain=_plain_machine),
        _e("NodeCount", Kind.INTEGER, categories=_RD, acted=True),
        _e("OperatingSystem", categories=_RD, acted=True),
        _e("Partition", categories=_RD, acted=True, plain=_plain_unchecked),
        _e("Priority", Kind.INTEGER, acted=True),
        _e("QualityOfService", categories=_RD, acted=True, plain=_plain_unchecked),
        _e("Queue", categories=_RD, acted=True),
        _e("Quote"),
        _e("Reservation", categories=_RD, acted=True),  # inferred
        _e("ReservationTime", Kind.DATETIME),
        _e("ResourceManagerType", categories=_RD, acted=True, plain=_plain_unchecked),
        _e("Restartable", Kind.BOOLEAN, acted=True),
        _e("Shell", unsupported="a Shell to interpret the job is not supported; make the shell the Executable"),
        _e("StagedTime", Kind.DATETIME),
        _e("StartCount", Kind.INTEGER),
        _e("StartTime", Kind.DATETIME),
        _e("StatusMessage"),
        _e("SubmitTime", Kind.DATETIME),
        _e("SubmitHost"),
        _e("Suspendable", Kind.BOOLEAN),
        _e("SuspendDuration", Kind.INTEGER),
        _e("Shift"),
        _e("Duration", Kind.DURATION, categories=_RD, acted=True),
        # credentials (table 3), plus Account as the spec's own Requested example uses it
        _e("Project", categories=_RD, acted=True),
        _e("GlobalUser", categories=_RD, acted=True, plain=_plain_global_user),
        _e("Group", categories=_RD, acted=True, plain=_plain_group),
        _e("User", categories=_RD, acted=True, plain=_plain_user),
        _e("Account", categories=_RD, acted=True, plain=_plain_unchecked),
        # structured job properties
        _e("Feature", attributes=frozenset({"aggregation", "delimiter"}), repeatable=True, categories=_RD,
           acted=True, check=_aggregation(("List", "Pattern"))),
        _e("OutputFile", attributes=frozenset({"redirectList"}), acted=True, check=_redirect(OUTPUT_REDIRECTS)),
        _e("ErrorFile", attributes=frozenset({"redirectList"}), acted=True, check=_redirect(OUTPUT_REDIRECTS)),
        _e("InputFile", attributes=frozenset({"redirectList"}), acted=True, check=_redirect(INPUT_REDIRECTS)),
        _e("NotificationList", attributes=frozenset({"uri"}), check=_notification),
        _e("ResourceLimit", attributes=frozenset({"name", "type"}), required=frozenset({"name"}), repeatable=True,
           acted=True, check=_rlimit),
        _e("Environment", Kind.CONTAINER, attributes=frozenset({"export"}), acted=True),
        _e("Node", attributes=frozenset({"aggregation", "delimiter", "count"}), repeatable=True, categories=_RD,
           acted=True, check=_aggregation(("List", "Pattern", "Range"))),
        _e("TaskDistribution", attributes=frozenset({"type"}), acted=True, check=_distribution),
        _e("Dependency", attributes=frozenset({"condition", "code", "designator"}), repeatable=True, acted=True,
           check=_dependency),
        # consumable resources (table 4) and the extensible Resource
        _e("Disk", Kind.FLOAT, attributes=_CONS, categories=_RD, acted=True, check=_consumable),
        _e("Memory", Kind.FLOAT, attributes=_CONS, categories=_RD, acted=True, check=_consumable),
        _e("Network", Kind.FLOAT, attributes=_CONS, categories=_RD, acted=True, check=_consumable),
        _e("Processors", Kind.INTEGER, attributes=_CONS, categories=_RD, acted=True, check=_consumable),
        _e("Swap", Kind.FLOAT, attributes=_CONS, categories=_RD, acted=True, check=_consumable),
        _e("Resource", Kind.FLOAT, attributes=_CONS | {"name", "type"}, required=frozenset({"name"}),
           repeatable=True, categories=_RD, acted=True, check=_consumable),
        # Requested only as a typed attribute (type="Attribute", with op/conj/group/preference).
        _e("Extension", attributes=frozenset({"name", "type"}), required=frozenset({"name"}), repeatable=True,
           categories="R", acted=True, check=_extension),
    )
}  # fmt: skip

TASK_GROUP_PROPERTIES: Final[Mapping[str, ElementSpec]] = {
    "TaskCount": _e("TaskCount", Kind.INTEGER, acted=True),
    "Id": _e("Id"),
    "Name": _e("Name"),
}
TASK_PROPERTIES: Final[Mapping[str, ElementSpec]] = {
    "Node": _e("Node"),  # where the task ran: a Delivered fact, not a placement request
    "Session": _e("Session", Kind.INTEGER),
    "Id": _e("Id"),
    "Process": _e("Process", Kind.INTEGER),  # the elaborate example's per-task process id
}
JOB_GROUP_PROPERTIES: Final[Mapping[str, ElementSpec]] = {
    "CreationTime": _e("CreationTime", Kind.DATETIME),  # inferred
    "Description": _e("Description"),
    "Id": _e("Id"),
    "Name": _e("Name"),
    "State": _e("State"),
}

#: Properties that belong to the job as a whole: in a TaskGroup or Task they cannot be honoured.
JOB_ONLY: Final = frozenset({"Dependency", "Hold", "Duration"})
#: What may differ from task to task inside one task group (the rest must move up to the TaskGroup).
PER_TASK: Final = frozenset(
    {
        "Executable",
        "Arguments",
        "InitialWorkingDirectory",
        "Environment",
        "OutputFile",
        "ErrorFile",
        "InputFile",
        "ResourceLimit",
        "Extension",
        "State",
        "ExitCode",
        "StartTime",
        "EndTime",
        "StatusMessage",
        "Name",
        "CpuDuration",
    }
)


def spec_for(level: Level, name: str) -> tuple[ElementSpec | None, str | None]:
    """The spec of property ``name`` at ``level`` and, when it exists but cannot be honoured at that
    level, why (so the awareness policy can decide)."""
    if level is Level.JOB_GROUP:
        return JOB_GROUP_PROPERTIES.get(name), None
    if level is Level.TASK_GROUP and name in TASK_GROUP_PROPERTIES:
        return TASK_GROUP_PROPERTIES[name], None
    if level is Level.TASK and name in TASK_PROPERTIES:
        return TASK_PROPERTIES[name], None
    spec = JOB_PROPERTIES.get(name)
    if spec is None:
        return None, None
    if level is Level.TASK_GROUP and name in JOB_ONLY:
        return spec, f"<{name}> applies to the whole job; move it to the Job"
    if level is Level.TASK and name not in PER_TASK:
        return spec, f"<{name}> cannot differ from task to task; move it to the TaskGroup"
    return spec, None


def check_value(spec: ElementSpec, prop: Property) -> str | None:
    """Why ``prop``'s text is not a valid value of the element's type, or None."""
    text = prop.value.strip()
    if spec.kind is Kind.STRING or spec.kind is Kind.CONTAINER:
        return None
    if not text:
        return f"is empty: give a {spec.kind.value.lower()}"
    if spec.kind is Kind.INTEGER:
        return None if re.fullmatch(r"[+-]?\d+", text) else f"{text!r} is not an integer"
    if spec.kind is Kind.BOOLEAN:
        return None if text in ("true", "false", "1", "0", "True", "False") else f"{text!r} is not true or false"
    try:
        v = float(text)
    except ValueError:
        return f"{text!r} is not a number"
    if v != v or v in (float("inf"), float("-inf")):
        return f"{text!r} is not a finite number"
    if spec.kind in (Kind.DATETIME, Kind.DURATION) and v < 0:
        return f"{text!r} is negative: give seconds"
    if spec.kind is Kind.DATETIME and not v.is_integer():
        return f"{text!r} is not whole seconds since the epoch"
    return None

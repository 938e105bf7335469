"""The SSS job and node objects (``../shared/specs/sss-*-3.1.txt``), the daemon's own job model."""

from __future__ import annotations

from pilot.model.sss.errors import SssError
from pilot.model.sss.job import (
    Dependency,
    EffectiveJob,
    EffectiveTask,
    EffectiveTaskGroup,
    Job,
    JobDefaults,
    JobGroup,
    Properties,
    Property,
    Redirect,
    ResourceLimit,
    Task,
    TaskDefaults,
    TaskDistribution,
    TaskGroup,
    TaskGroupDefaults,
    amount,
    effective_jobs,
    job_state,
    merge,
    sss_state,
)
from pilot.model.sss.node import NodeObject, node_object
from pilot.model.sss.status import JobStatus, TaskStatus, job_with_status

__all__ = [
    "Dependency",
    "EffectiveJob",
    "EffectiveTask",
    "EffectiveTaskGroup",
    "Job",
    "JobDefaults",
    "JobGroup",
    "JobStatus",
    "NodeObject",
    "Properties",
    "Property",
    "Redirect",
    "ResourceLimit",
    "SssError",
    "Task",
    "TaskDefaults",
    "TaskDistribution",
    "TaskGroup",
    "TaskGroupDefaults",
    "TaskStatus",
    "amount",
    "effective_jobs",
    "job_state",
    "job_with_status",
    "merge",
    "node_object",
    "sss_state",
]

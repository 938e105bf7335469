"""The PSI/J interface to the pilot, with psij-python's names: ``import client as psij``; its async face
(``AsyncJobExecutor``, ``AsyncJob``) for asyncio, trio and anyio programs."""

from __future__ import annotations

from client.aio import AsyncBatchSubmitException, AsyncJob, AsyncJobExecutor, JobEvent
from client.exceptions import InvalidJobException, InvalidStateException, SubmitException
from client.job import Job, JobStatusCallback
from client.job_attributes import JobAttributes
from client.job_executor import BatchSubmitException, JobExecutor, JobExecutorConfig
from client.job_spec import JobSpec
from client.job_status import JobStatus
from client.resource_spec import ResourceSpec, ResourceSpecV1
from pilot.model.job_state import JobState

__all__ = [
    "AsyncBatchSubmitException",
    "AsyncJob",
    "AsyncJobExecutor",
    "BatchSubmitException",
    "InvalidJobException",
    "InvalidStateException",
    "Job",
    "JobAttributes",
    "JobEvent",
    "JobExecutor",
    "JobExecutorConfig",
    "JobSpec",
    "JobState",
    "JobStatus",
    "JobStatusCallback",
    "ResourceSpec",
    "ResourceSpecV1",
    "SubmitException",
]

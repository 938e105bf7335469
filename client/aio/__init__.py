"""The pilot's client for asyncio, trio and anyio programs: ``from client.aio import AsyncJobExecutor``."""

from __future__ import annotations

from client.aio.executor import AsyncBatchSubmitException, AsyncJobExecutor, JobEvent, JobEvents
from client.aio.job import AsyncJob

__all__ = ["AsyncBatchSubmitException", "AsyncJob", "AsyncJobExecutor", "JobEvent", "JobEvents"]

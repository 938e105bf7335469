"""The object model shared by daemon, agents and clients."""

from __future__ import annotations

from pilot.model.job_description import DescriptionError, JobDescription, ResourceRequest
from pilot.model.job_state import JobState
from pilot.model.node import NodeConfigured

__all__ = ["DescriptionError", "JobDescription", "JobState", "NodeConfigured", "ResourceRequest"]

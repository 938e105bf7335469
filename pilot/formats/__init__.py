"""Wire formats other than msgpack: SSS job and node XML, read safely and written exactly."""

from __future__ import annotations

from pilot.formats.sss_job import ReadResult, read_job, write_job
from pilot.formats.sss_node import read_nodes, write_nodes

__all__ = ["ReadResult", "read_job", "read_nodes", "write_job", "write_nodes"]

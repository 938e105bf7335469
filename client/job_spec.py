"""JobSpec: every field of the PSI/J specification, with psij-python's Python names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from client.job_attributes import JobAttributes
from client.resource_spec import ResourceSpec
from client.staging import StageIn, StageOut, StageOutFlags


def _path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)


class JobSpec:
    def __init__(
        self,
        executable: str | None = None,
        arguments: list[str] | None = None,
        directory: str | Path | None = None,
        name: str | None = None,
        inherit_environment: bool = True,
        environment: dict[str, str | int] | None = None,
        stdin_path: str | Path | None = None,
        stdout_path: str | Path | None = None,
        stderr_path: str | Path | None = None,
        resources: ResourceSpec | None = None,
        attributes: JobAttributes | None = None,
        pre_launch: str | Path | None = None,
        post_launch: str | Path | None = None,
        launcher: str | None = None,
        stage_in: set[StageIn] | None = None,
        stage_out: set[StageOut] | None = None,
        cleanup: set[str | Path] | None = None,
        cleanup_flags: StageOutFlags = StageOutFlags.ALWAYS,
    ) -> None:
        self.executable = executable
        self.arguments = arguments
        self.directory = _path(directory)
        self._name = name
        self.inherit_environment = inherit_environment
        self.environment = environment
        self.stdin_path = _path(stdin_path)
        self.stdout_path = _path(stdout_path)
        self.stderr_path = _path(stderr_path)
        self.resources = resources
        self.attributes = attributes if attributes is not None else JobAttributes()
        self.pre_launch = _path(pre_launch)
        self.post_launch = _path(post_launch)
        self.launcher = launcher
        #: Files put in place before the processes start, taken out after they end, removed last.
        self.stage_in = stage_in
        self.stage_out = stage_out
        self.cleanup = cleanup
        #: When ``cleanup`` happens (the job's outcome), as for a StageOut.
        self.cleanup_flags = cleanup_flags

    @property
    def name(self) -> str | None:
        return self._name if self._name is not None else self.executable

    @name.setter
    def name(self, value: str | None) -> None:
        self._name = value

    @property
    def cleanup(self) -> set[Path] | None:
        return self._cleanup

    @cleanup.setter
    def cleanup(self, value: set[str | Path] | None) -> None:
        self._cleanup = None if value is None else {Path(p) for p in value}

    @property
    def environment(self) -> dict[str, str] | None:
        return self._environment

    @environment.setter
    def environment(self, value: dict[str, Any] | None) -> None:
        self._environment = None if value is None else {k: str(v) for k, v in value.items()}

    def __repr__(self) -> str:
        return f"JobSpec(executable={self.executable!r}, arguments={self.arguments!r}, launcher={self.launcher!r})"

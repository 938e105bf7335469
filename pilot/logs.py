"""structlog set-up shared by daemon, agents and the CLI: JSON when not a TTY, console otherwise."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure(*, level: str = "info", stream: TextIO | None = None, json: bool | None = None) -> None:
    stream = stream or sys.stderr
    if json is None:
        json = not stream.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )

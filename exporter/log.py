"""structlog set-up: JSON lines in production, readable console output in a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog once for the process. fmt: json | console | auto (console on a TTY)."""
    if level.lower() not in _LEVELS:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(sorted(_LEVELS))}")
    if fmt not in ("json", "console", "auto"):
        raise ValueError(f"unknown log format {fmt!r}; use json, console or auto")
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: Any = structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level.lower()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # uvicorn and other libraries log through the standard library: keep them quiet and on stderr.
    logging.basicConfig(level=max(_LEVELS[level.lower()], logging.WARNING), stream=sys.stderr)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)

"""Logging setup: plain console lines for people, or one JSON object per line for pipelines."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO

__all__ = ["configure_logging"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "warning": logging.WARNING, "error": logging.ERROR}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str = "info", encoding: str = "console", *, stream: TextIO | None = None) -> None:
    """Route gputally's logs to stderr (stdout stays free for the debug exporter)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if encoding == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_LEVELS.get(level, logging.INFO))

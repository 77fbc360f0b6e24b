"""``exporters: debug:``: prints what would be exported."""

from __future__ import annotations

from typing import Literal

from gputally.config.types import Strict

__all__ = ["DebugConfig"]


class DebugConfig(Strict):
    """``exporters: debug:`` — prints what would be exported."""

    verbosity: Literal["basic", "normal", "detailed"] = "basic"
    """``basic``: one line per batch (time, exporter, pipeline, counts); ``normal``: then a line
    per resource and one per data point, log record and span (value, attributes, time);
    ``detailed``: every field, readable, one block per resource."""

"""Config of the ``batch`` processor; keys and defaults as the Collector's batch processor."""

from __future__ import annotations

from pydantic import Field, model_validator

from gputally.config.types import Duration, Strict

__all__ = ["BatchConfig"]


class BatchConfig(Strict):
    """``processors: batch:``."""

    send_batch_size: int = Field(8192, ge=0)
    """Items (data points, log records, spans) that trigger a send. It is a trigger, not a
    cap: a send holds what has arrived, up to ``send_batch_max_size``. 0 sends every request
    at once."""
    timeout: Duration = 0.2
    """Longest time data waits for more to arrive (``200ms``). 0 sends every request at once."""
    send_batch_max_size: int = Field(0, ge=0)
    """Most items in one send; larger batches are split between resources. 0: no limit."""

    @model_validator(mode="after")
    def _max_covers_trigger(self) -> BatchConfig:
        if self.send_batch_max_size and self.send_batch_max_size < self.send_batch_size:
            raise ValueError("send_batch_max_size must be 0 or at least send_batch_size")
        return self

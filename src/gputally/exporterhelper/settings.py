"""The exporter helper's keys: ``retry_on_failure`` and ``sending_queue``, as every exporter
built on it takes them (the Collector's ``configretry`` and ``exporterhelper`` queue settings)."""

from __future__ import annotations

from pydantic import Field

from gputally.config.types import Duration, Strict
from gputally.storage import StorageRef

__all__ = ["QueueSettings", "RetrySettings"]


class RetrySettings(Strict):
    """``retry_on_failure``: exponential backoff with jitter, as the Collector's exporters do."""

    enabled: bool = True
    initial_interval: Duration = 5.0
    """Wait after the first failure."""
    randomization_factor: float = Field(0.5, ge=0, le=1)
    """Each wait is drawn from interval * (1 ± factor)."""
    multiplier: float = Field(1.5, ge=1)
    """Growth of the interval after each failure."""
    max_interval: Duration = 30.0
    """Cap on one wait."""
    max_elapsed_time: Duration = 300.0
    """Give up on a batch after this long; 0 retries forever."""


class QueueSettings(Strict):
    """``sending_queue``: batches wait here for the backend; bounded, optionally on disk."""

    enabled: bool = True
    num_consumers: int = Field(10, ge=1, le=1000)
    """Batches sent concurrently."""
    queue_size: int = Field(1000, ge=1, le=10_000_000)
    """Most batches held; beyond it new data is refused (and counted)."""
    storage: StorageRef | None = None
    """A ``file_storage`` extension: the queue is kept on disk in its directory (under
    ``<exporter id, %-encoded>/``), so a restart loses nothing."""

    @property
    def durable(self) -> bool:
        """On disk (``storage``) or sent inline (queue off): either way ``export`` returns only
        once a crash can no longer lose the batch."""
        return self.storage is not None or not self.enabled

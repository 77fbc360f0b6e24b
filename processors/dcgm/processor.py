"""The ``dcgm`` processor at run time: one regrouping per request that has dcgm GPU points.

Most requests through a gputally pipeline are not dcgm-exporter scrapes (the probes already
send one resource per GPU). Those are recognised from their bytes alone: a request none of
whose attributes is keyed by the UUID label cannot hold a point to move, and goes on as it
came, never decoded here or re-encoded.
"""

from __future__ import annotations

from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext, Processor

from .config import DcgmConfig
from .regroup import Regrouper

__all__ = ["DcgmProcessor", "create"]


class DcgmProcessor(Processor):
    """Gives every GPU that dcgm-exporter reports a resource of its own, as the probes do."""

    def __init__(self, config: DcgmConfig) -> None:
        self.config = config
        self._regrouper = Regrouper(config.labels)

    async def process(self, batch: Batch) -> Batch | None:
        if self._regrouper.needle not in batch.serialize():
            return batch
        # Read through ``message``; ``mutable()`` (which drops the cached bytes) only once a
        # point really moves, so a coincidental match still forwards the bytes as received.
        self._regrouper.regroup(batch.message, batch.mutable)
        return batch


def create(config: DcgmConfig, context: ComponentContext, signal: Signal) -> DcgmProcessor:
    """Factory hook: one processor per pipeline (metrics only: dcgm-exporter sends nothing else)."""
    del context  # nothing from the service is needed
    if signal is not Signal.METRICS:
        raise ValueError(f"the dcgm processor handles metrics, not {signal}")
    return DcgmProcessor(config)

"""The one interface the runner drives: every vendor's collector satisfies :class:`Collector`.

NVIDIA's (:class:`~gputally.probes.nvml.collector.NvmlCollector`) reads NVML field by field;
AMD's and Gaudi's (:class:`~gputally.probes.snapshot.collector.SnapshotCollector`) read one
snapshot per cycle. The runner needs only a cycle now and then, and a way to let go.
"""

from __future__ import annotations

from typing import Protocol

from gputally.probes.core.model import Cycle

__all__ = ["Collector"]


class Collector(Protocol):
    """Collects a node's devices once per :meth:`collect`; never blocks the event loop."""

    async def collect(self) -> Cycle:
        """One collection: what could be read, and the problems with what could not."""

    async def close(self) -> None:
        """Stop reading and release the vendor library (a read still running is abandoned)."""

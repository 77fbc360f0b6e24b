"""The engine readers' small model: where an engine listens, and what one read of it gave.

Two halves meet here: :mod:`discovery <gputally.probes.engines>` finds :class:`Endpoint` s
(from the containers of GPU processes, or the probe's explicit list), and the scrape and the
per-engine mappings turn one endpoint's exposition into an :class:`EngineReading` of the
probe's own :class:`~gputally.probes.core.model.Point` s, named as ``docs/accounts.md`` says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gputally.probes.core.model import Attributes, AttrValue, MetricDef, Point

__all__ = ["ENGINES", "Connect", "EngineReading", "Endpoint", "HistogramPoint"]

ENGINES = ("vllm", "sglang", "tgi", "triton", "nim", "llamacpp")
"""Values of ``gputally.inference.engine``."""

Connect = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
"""Opens a TCP connection to (host, port): ``asyncio.open_connection``, or one that connects
from inside another network namespace (a pod's)."""


@dataclass(frozen=True)
class Endpoint:
    """One place an engine serves its metrics."""

    host: str
    port: int
    path: str = "/metrics"
    engine: str | None = None
    """One of :data:`ENGINES`, or ``None``: told from the exposition itself."""
    model: str | None = None
    """The served model's name where the engine's metrics name none (llama.cpp)."""
    pid: int | None = None
    """The listening process, where known (discovery always knows it)."""
    netns: str | None = None
    """``/proc/PID/ns/net`` of the namespace to connect from; ``None``: the probe's own."""


@dataclass(frozen=True, slots=True)
class HistogramPoint:
    """One cumulative explicit-bucket histogram series, in OTLP's shape.

    The core :class:`~gputally.probes.core.model.Point` holds one number; engines' latencies
    are histograms, and keeping their buckets (bounds converted to the contract's unit) lets
    the backend compute any percentile, which a mean or a fixed quantile would not.
    """

    metric: MetricDef
    bounds: tuple[float, ...]
    """Upper bounds, ascending, without +Inf (OTLP ``explicit_bounds``)."""
    counts: tuple[int, ...]
    """Observations per bucket, not cumulative: ``len(bounds) + 1`` of them, the last above
    every bound (OTLP ``bucket_counts``)."""
    count: int
    sum: float
    attributes: Attributes = ()
    start_ns: int | None = None
    """When the series began counting (the engine's ``_created`` sample), where it says."""


@dataclass
class EngineReading:
    """What one read of one endpoint gave: the engine, its points and the resource's attributes."""

    endpoint: Endpoint
    engine: str
    points: list[Point]
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    """Resource attributes beyond the endpoint's and the process's (``docs/accounts.md``)."""
    histograms: list[HistogramPoint] = field(default_factory=list)
    """The histogram metrics (``gen_ai.server.time_to_first_token``...), apart from
    :attr:`points` because a core ``Point`` holds one number."""

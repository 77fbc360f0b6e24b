"""GPM (GPU Performance Monitoring, Hopper and newer): DCGM-class profiling metrics from NVML alone.

The live source takes one GPM sample per GPU per cycle and computes the metrics between it and
the previous cycle's, so the window is the collection interval and nothing sleeps. GPUs without
GPM (``gpm_support.isSupportedDevice`` 0, or calls refused) simply get none of these points.

PCIe and NVLink rates come from GPM rather than ``nvmlDeviceGetPcieThroughput``, which blocks
~20 ms per call. Where the GPU has no PCIe byte-counter fields, :class:`IoTotals` integrates
those rates over each window into the ``hw.gpu.io`` counter.
"""

from __future__ import annotations

from typing import Any

from gputally.probes.core import catalog as m
from gputally.probes.core.model import MetricDef, Point

__all__ = ["METRIC_IDS", "IoTotals", "gpm_points", "gpm_supported", "link_rates"]

_MIB = 1024 * 1024
_PERCENT: dict[int, tuple[MetricDef, tuple[tuple[str, str], ...]]] = {
    1: (m.GRAPHICS_ACTIVITY, ()),
    2: (m.SM_ACTIVITY, ()),
    3: (m.SM_OCCUPANCY, ()),
    5: (m.TENSOR_ACTIVITY, ()),
    10: (m.DRAM_ACTIVITY, ()),
    4: (m.PIPE_ACTIVITY, (("gputally.gpu.pipe", "integer"),)),
    6: (m.PIPE_ACTIVITY, (("gputally.gpu.pipe", "tensor_dfma"),)),
    7: (m.PIPE_ACTIVITY, (("gputally.gpu.pipe", "tensor_hmma"),)),
    8: (m.PIPE_ACTIVITY, (("gputally.gpu.pipe", "tensor_dmma"),)),
    9: (m.PIPE_ACTIVITY, (("gputally.gpu.pipe", "tensor_imma"),)),
    11: (m.PIPE_ACTIVITY, (("gputally.gpu.pipe", "fp64"),)),
    12: (m.PIPE_ACTIVITY, (("gputally.gpu.pipe", "fp32"),)),
    13: (m.PIPE_ACTIVITY, (("gputally.gpu.pipe", "fp16"),)),
}
"""GPM metric IDs reported in percent, as ratios."""
_RATES: dict[int, tuple[str, str]] = {
    20: ("pcie", "transmit"),
    21: ("pcie", "receive"),
    60: ("nvlink", "receive"),
    61: ("nvlink", "transmit"),
}
"""GPM metric IDs reported in MiB/s (``NVML_GPM_METRIC_PCIE_TX_PER_SEC``...), as (link, direction)."""
METRIC_IDS: tuple[int, ...] = tuple(sorted([*_PERCENT, *_RATES]))


def gpm_supported(info: dict[str, Any]) -> bool:
    support = info.get("gpm_support")
    return isinstance(support, dict) and bool(support.get("isSupportedDevice"))


def _value(gpm: dict[str, dict[str, Any]], metric_id: int) -> float | None:
    entry = gpm.get(str(metric_id))
    if not entry or entry.get("ret") != 0:
        return None
    value = entry.get("value")
    return float(value) if isinstance(value, int | float) else None


def link_rates(gpm: dict[str, dict[str, Any]]) -> dict[tuple[str, str], float]:
    """Bytes per second by (link, direction), from one cycle's GPM metrics."""
    rates = {}
    for metric_id, key in _RATES.items():
        value = _value(gpm, metric_id)
        if value is not None:
            rates[key] = value * _MIB
    return rates


def gpm_points(gpm: dict[str, dict[str, Any]]) -> list[Point]:
    points = []
    for metric_id, (metric, attributes) in _PERCENT.items():
        value = _value(gpm, metric_id)
        if value is not None:
            points.append(Point(metric, min(max(value / 100.0, 0.0), 1.0), attributes))
    for (link, direction), rate in link_rates(gpm).items():
        points.append(
            Point(m.LINK_THROUGHPUT, rate, (("gputally.gpu.link", link), ("network.io.direction", direction)))
        )
    return points


class IoTotals:
    """Bytes per (link, direction) summed from GPM rates: the window since the previous update
    times the rate GPM measured over that same window."""

    def __init__(self) -> None:
        self._bytes: dict[tuple[str, str], float] = {}
        self._last_ns: int | None = None

    def update(self, rates: dict[tuple[str, str], float], now_ns: int) -> dict[tuple[str, str], int]:
        if self._last_ns is not None and rates:
            window = max(now_ns - self._last_ns, 0) / 1e9
            for key, rate in rates.items():
                self._bytes[key] = self._bytes.get(key, 0.0) + rate * window
        else:
            for key in rates:
                self._bytes.setdefault(key, 0.0)
        self._last_ns = now_ns
        return {key: int(total) for key, total in self._bytes.items() if key in rates}

    def points(self, totals: dict[tuple[str, str], int], *, skip_links: set[str]) -> list[Point]:
        return [
            Point(m.GPU_IO, total, (("network.io.direction", direction), ("gputally.gpu.link", link)))
            for (link, direction), total in totals.items()
            if link not in skip_links
        ]

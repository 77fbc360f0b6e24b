"""What the AMD and Intel Gaudi probes share: one *snapshot* of every device per cycle, mapped
onto the shared catalog.

The NVIDIA probe's collector is shaped around NVML (field batches, GPM, event sets). The other
vendors are simpler: one snapshot per cycle (amdsmi's return values per device, or hl-smi's
text output), kept in plain JSON so the same dict is what the live source returns, what
``--record`` writes and what ``--replay`` serves
(:mod:`~gputally.probes.snapshot.replay`). A vendor's pure :data:`Mapper` turns a snapshot
into :class:`DeviceReading` values with the shared catalog (:mod:`~gputally.probes.core.catalog`),
and :class:`~gputally.probes.snapshot.collector.SnapshotCollector` does the rest exactly as the
NVIDIA probe does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gputally.errors import GputallyError
from gputally.probes.core.model import AttrValue, Point

__all__ = [
    "DeviceReading",
    "Mapper",
    "ProcessUse",
    "SnapshotSource",
    "VendorUnavailable",
    "number",
]


class VendorUnavailable(GputallyError):
    """The vendor's library or tool cannot be used at all (one line, fit for a log)."""


def number(value: Any) -> float | int | None:
    """A numeric reading, or None for what the vendor tools print for "no value".

    amdsmi returns ``"N/A"`` strings (and sometimes ``0xFFFF``-style sentinels) for values a
    device does not report; hl-smi prints ``N/A``, ``[N/A]`` or a number with its unit.
    """
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        if isinstance(value, int) and value in (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF):
            return None
        return value
    if isinstance(value, str):
        text = value.strip().strip("[]").strip()
        if not text or text.upper() in ("N/A", "NA", "NOT SUPPORTED", "UNKNOWN", "-"):
            return None
        head = text.split()[0].rstrip("%")
        try:
            return int(head)
        except ValueError:
            try:
                return float(head)
            except ValueError:
                return None
    return None


@dataclass(frozen=True)
class ProcessUse:
    pid: int
    memory_bytes: int | None
    """Device memory the process holds; None where the vendor does not say."""


@dataclass
class DeviceReading:
    """One device (GPU, accelerator or partition) of one snapshot, mapped."""

    hw_id: str
    attributes: dict[str, AttrValue]
    """Resource attributes without ``host.name``."""
    points: list[Point] = field(default_factory=list)
    processes: list[ProcessUse] = field(default_factory=list)
    state: str = "ok"
    label: str = ""
    body: dict[str, Any] = field(default_factory=dict)
    """The raw readings of this device, for the snapshot log record."""
    problems: list[str] = field(default_factory=list)


class SnapshotSource(Protocol):
    """A vendor boundary: ``open`` may raise VendorUnavailable; ``snapshot`` reads every device once
    (blocking) and returns plain JSON values."""

    def open(self) -> dict[str, Any]: ...

    def snapshot(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


Mapper = Callable[[dict[str, Any], dict[str, Any]], list[DeviceReading]]
"""``(snapshot, driver) -> devices``: a vendor's pure mapping."""

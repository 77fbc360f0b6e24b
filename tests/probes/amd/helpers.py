"""The constructed AMD recordings (tests/fixtures/amd, not from hardware) and small readers."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from gputally.probes.amd.mapping import map_amd
from gputally.probes.core.model import Cycle, Entity
from gputally.probes.snapshot.collector import SnapshotCollector
from gputally.probes.snapshot.replay import SnapshotReplay
from tests.probes.readers import device, values

__all__ = ["DPX", "GPU0", "GPU1", "TWO_GPUS", "cycles", "device", "one", "recording", "values"]

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "amd"
TWO_GPUS = FIXTURES / "mi300x-two-gpus.json"
DPX = FIXTURES / "mi300x-dpx-partitions.json"
GPU0 = "b8ff74a1-0000-1000-80ea-8c2b5f7d0a11"
GPU1 = "93ff74a1-0000-1000-8041-a1c3b0e60d22"


def recording(path: Path = TWO_GPUS) -> dict[str, Any]:
    return copy.deepcopy(json.loads(path.read_text()))


async def cycles(rec: dict[str, Any], count: int = 1, **options: Any) -> list[Cycle]:
    source = SnapshotReplay(rec)
    options.setdefault("node_name", "node-a")
    probe = SnapshotCollector(source, source, map_amd, vendor="amd", **options)
    try:
        return [await probe.collect() for _ in range(count)]
    finally:
        await probe.close()


def one(entity: Entity, name: str, attributes: tuple[tuple[str, Any], ...] = ()) -> float | int:
    return values(entity, name)[attributes]

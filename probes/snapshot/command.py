"""The run step the snapshot vendors' commands share (``gputally probe amd`` / ``gaudi``): a
replay or the vendor's live source, optionally recorded, mapped by the vendor, then the runner.

Neither path imports amdsmi or runs hl-smi until a live collection needs it, so ``--replay
FILE --once --debug`` works on any laptop.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from gputally.probes.core.command import both, node_name_of, open_sources, run_collector
from gputally.probes.snapshot.source import Mapper, SnapshotSource

__all__ = ["LiveSource", "run_snapshot_probe"]

LiveSource = Callable[[argparse.Namespace, float], SnapshotSource]
"""``(options, read budget in seconds) -> the vendor's live source``; may raise VendorUnavailable."""


async def run_snapshot_probe(
    args: argparse.Namespace, interval: float, *, vendor: str, fmt: str, mapper: Mapper, live: LiveSource
) -> int:
    """A snapshot vendor's probe from parsed options; ``fmt`` names its recording format."""
    from gputally.probes.core.hints import ProcFs
    from gputally.probes.core.procfacts import ProcessInfoSource
    from gputally.probes.snapshot.collector import SnapshotCollector
    from gputally.probes.snapshot.replay import SnapshotRecorder, SnapshotReplay

    budget = min(5.0, interval * 0.8)
    opened: tuple[SnapshotSource, ProcessInfoSource, str] | int = open_sources(
        args,
        replay=lambda path: both(SnapshotReplay.from_file(path)),
        live=lambda: (live(args, budget), ProcFs(args.proc_root)),
        record=lambda source, processes, path: both(SnapshotRecorder(source, processes, path=path, fmt=fmt)),
    )
    if isinstance(opened, int):
        return opened
    source, processes, title = opened
    collector = SnapshotCollector(source, processes, mapper, node_name=node_name_of(args), vendor=vendor,
                                  budget_s=budget)
    return await run_collector(args, interval, collector, title=title, probe=vendor)

"""The run step the snapshot vendors' commands share (``gputally probe amd`` / ``gaudi``): a
replay or the vendor's live source, optionally recorded, mapped by the vendor, then the runner.

Neither path imports amdsmi or runs hl-smi until a live collection needs it, so ``--replay
FILE --once --debug`` works on any laptop.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from gputally.probes.command import node_name_of, run_collector
from gputally.probes.procfacts import ProcessInfoSource
from gputally.probes.snapshot import Mapper, SnapshotSource

__all__ = ["LiveSource", "run_snapshot_probe"]

LiveSource = Callable[[argparse.Namespace, float], SnapshotSource]
"""``(options, read budget in seconds) -> the vendor's live source``; may raise VendorUnavailable."""


async def run_snapshot_probe(
    args: argparse.Namespace, interval: float, *, vendor: str, fmt: str, mapper: Mapper, live: LiveSource
) -> int:
    """A snapshot vendor's probe from parsed options; ``fmt`` names its recording format."""
    from gputally.probes.hints import ProcFs
    from gputally.probes.snapshot import VendorUnavailable
    from gputally.probes.snapshot_collector import SnapshotCollector
    from gputally.probes.snapshot_replay import SnapshotRecorder, SnapshotReplay

    budget = min(5.0, interval * 0.8)
    source: SnapshotSource
    processes: ProcessInfoSource
    if args.replay is not None:
        try:
            source = processes = SnapshotReplay.from_file(args.replay)
        except (OSError, ValueError) as exc:
            print(f"gputally: cannot replay {args.replay}: {exc}", file=sys.stderr)
            return 2
        title = f"replay of {args.replay.name}"
    else:
        try:
            source, processes = live(args, budget), ProcFs(args.proc_root)
        except VendorUnavailable as exc:
            print(f"gputally probe {vendor}: {exc}", file=sys.stderr)
            return 1
        title = "live"
    if args.record is not None:
        source = processes = SnapshotRecorder(source, processes, path=args.record, fmt=fmt)
    collector = SnapshotCollector(source, processes, mapper, node_name=node_name_of(args), vendor=vendor,
                                  budget_s=budget)
    return await run_collector(args, interval, collector, title=title, probe=vendor)

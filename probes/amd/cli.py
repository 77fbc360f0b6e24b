"""``gputally probe amd ...``: AMD GPUs through amdsmi (ROCm), with the options every probe takes."""

from __future__ import annotations

import argparse
import asyncio

from gputally.probes.core.command import add_probe_parser, probe_interval
from gputally.probes.snapshot.source import SnapshotSource

__all__ = ["live_source", "register", "run"]

_HELP = "Read AMD GPUs through amdsmi (ROCm) and send OTLP (or print it with --debug)."


def register(probes: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``amd`` under ``gputally probe``."""
    parser = add_probe_parser(probes, "amd", text=_HELP, example="mi300x.json", source="the devices")
    parser.set_defaults(handler=_command, vendor="amd")


def live_source(args: argparse.Namespace, budget: float) -> SnapshotSource:
    """amdsmi loaded now: VendorUnavailable (one line) where it cannot be."""
    del budget  # amdsmi calls return promptly; the collector's budget covers a hung one
    from gputally.probes.amd.source import AmdsmiSource, load_amdsmi

    return AmdsmiSource(proc_root=args.proc_root, module=load_amdsmi())


def _command(args: argparse.Namespace) -> int:
    return asyncio.run(run(args, probe_interval(args)))


async def run(args: argparse.Namespace, interval: float) -> int:
    """The AMD probe from parsed options: live, or a replay, optionally recorded."""
    from gputally.probes.amd.mapping import map_amd
    from gputally.probes.amd.source import FORMAT
    from gputally.probes.snapshot.command import run_snapshot_probe

    return await run_snapshot_probe(args, interval, vendor="amd", fmt=FORMAT, mapper=map_amd, live=live_source)

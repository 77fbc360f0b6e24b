"""``gputally probe gaudi ...``: Intel Gaudi accelerators through hl-smi (and the NIC ports' sysfs),
with the options every probe takes and two of its own."""

from __future__ import annotations

import argparse
import asyncio

from gputally.probes.core.command import add_probe_parser, probe_interval
from gputally.probes.snapshot.source import SnapshotSource

__all__ = ["live_source", "register", "run"]

_HELP = "Read Intel Gaudi accelerators through hl-smi and send OTLP (or print it with --debug)."


def register(probes: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gaudi`` under ``gputally probe``."""
    parser = add_probe_parser(probes, "gaudi", text=_HELP, example="gaudi3.json", source="the devices")
    parser.set_defaults(handler=_command, vendor="gaudi")
    parser.add_argument("--hl-smi", default="hl-smi", metavar="PATH", help="the hl-smi binary (default: on PATH)")
    parser.add_argument("--sys-root", default="/sys", metavar="DIR",
                        help="the host's sysfs, for the NIC ports' counters (default /sys; in a container "
                             "without hostNetwork, mount the host's /sys and point here)")


def live_source(args: argparse.Namespace, budget: float) -> SnapshotSource:
    """hl-smi with a timeout inside the read budget, and the NIC ports under ``--sys-root``."""
    from gputally.probes.gaudi.source import HlSmiSource

    return HlSmiSource(binary=args.hl_smi, timeout_s=max(0.5, budget * 0.9), sys_root=args.sys_root)


def _command(args: argparse.Namespace) -> int:
    return asyncio.run(run(args, probe_interval(args)))


async def run(args: argparse.Namespace, interval: float) -> int:
    """The Gaudi probe from parsed options: live, or a replay, optionally recorded."""
    from gputally.probes.gaudi.mapping import map_gaudi
    from gputally.probes.gaudi.source import FORMAT
    from gputally.probes.snapshot.command import run_snapshot_probe

    return await run_snapshot_probe(args, interval, vendor="gaudi", fmt=FORMAT, mapper=map_gaudi, live=live_source)

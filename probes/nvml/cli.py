"""``gputally probe nvml ...``: the NVIDIA node probe's command line.

The replay path (``--replay FILE``) never imports pynvml, so ``gputally probe nvml --replay
FILE --once --debug`` is a newcomer's first command on a laptop without a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from gputally.probes.command import add_probe_parser, node_name_of, probe_interval, run_collector

__all__ = ["register"]

_HELP = "Read NVIDIA GPUs through NVML and send OTLP (or print it with --debug)."


def register(probes: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``nvml`` under ``gputally probe``."""
    parser = add_probe_parser(probes, "nvml", text=_HELP, example="h200.json", source="NVML", devices="GPUs")
    parser.set_defaults(handler=_command)


def _command(args: argparse.Namespace) -> int:
    return asyncio.run(run(args, probe_interval(args)))


async def run(args: argparse.Namespace, interval: float) -> int:
    """The NVIDIA probe from parsed options: live NVML or a replay, optionally recorded."""
    from gputally.probes.nvml.collector import NvmlCollector
    from gputally.probes.nvml.source import DeviceSource
    from gputally.probes.procfacts import ProcessInfoSource

    source: DeviceSource
    processes: ProcessInfoSource
    if args.replay is not None:
        from gputally.probes.nvml.replay import ReplaySource

        try:
            source = processes = ReplaySource.from_file(args.replay)
        except (OSError, ValueError) as exc:
            print(f"gputally: cannot replay {args.replay}: {exc}", file=sys.stderr)
            return 2
        title = f"replay of {args.replay.name}"
    else:
        from gputally.probes.hints import ProcFs
        from gputally.probes.nvml.live import NvmlSource

        source, processes, title = NvmlSource(), ProcFs(args.proc_root), "live"
    if args.record is not None:
        from gputally.probes.nvml.record import RecordingSource

        source = processes = RecordingSource(source, processes, path=args.record)
    collector = NvmlCollector(
        source, processes, node_name=node_name_of(args), budget_s=min(5.0, interval * 0.8), events=not args.once
    )
    return await run_collector(args, interval, collector, title=title, probe="nvml")

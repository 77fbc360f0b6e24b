"""``gputally probe nvml ...``: the NVIDIA node probe's command line.

The replay path (``--replay FILE``) never imports pynvml, so ``gputally probe nvml --replay
FILE --once --debug`` is a newcomer's first command on a laptop without a GPU.
"""

from __future__ import annotations

import argparse
import asyncio

from gputally.probes.core.command import (
    add_probe_parser,
    both,
    node_name_of,
    open_sources,
    probe_interval,
    run_collector,
)

__all__ = ["register"]

_HELP = "Read NVIDIA GPUs through NVML and send OTLP (or print it with --debug)."


def register(probes: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``nvml`` under ``gputally probe``."""
    parser = add_probe_parser(probes, "nvml", text=_HELP, example="h200.json", source="NVML", devices="GPUs")
    parser.set_defaults(handler=_command)


def _command(args: argparse.Namespace) -> int:
    return asyncio.run(run(args, probe_interval(args)))


async def run(args: argparse.Namespace, interval: float) -> int:
    """The NVIDIA probe from parsed options: live NVML or a replay, optionally recorded."""
    from gputally.probes.core.hints import ProcFs
    from gputally.probes.core.procfacts import ProcessInfoSource
    from gputally.probes.nvml.collector import NvmlCollector
    from gputally.probes.nvml.live import NvmlSource
    from gputally.probes.nvml.record import RecordingSource
    from gputally.probes.nvml.replay import ReplaySource
    from gputally.probes.nvml.source import DeviceSource

    opened: tuple[DeviceSource, ProcessInfoSource, str] | int = open_sources(
        args,
        replay=lambda path: both(ReplaySource.from_file(path)),
        live=lambda: (NvmlSource(), ProcFs(args.proc_root)),
        record=lambda source, processes, path: both(RecordingSource(source, processes, path=path)),
    )
    if isinstance(opened, int):
        return opened
    source, processes, title = opened
    collector = NvmlCollector(
        source, processes, node_name=node_name_of(args), budget_s=min(5.0, interval * 0.8), events=not args.once
    )
    return await run_collector(args, interval, collector, title=title, probe="nvml")

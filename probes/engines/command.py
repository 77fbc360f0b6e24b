"""The engine options every probe takes, their checks, and the step that adds engines to a
vendor's collector (``gputally probe nvml|amd|gaudi`` alike).

Imports nothing heavy at the top: ``gputally --help`` builds every probe's parser.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gputally.errors import ConfigError

if TYPE_CHECKING:
    from gputally.probes.core.collector import Collector
    from gputally.probes.engines.collector import Read

__all__ = ["add_engine_arguments", "check_engine_options", "engine_deadline", "with_engines"]

_DEADLINE_MOST_S = 2.0


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """``--engine``, ``--no-engine-discovery``, ``--engine-deadline``, ``--cgroup-root``."""
    parser.add_argument(
        "--engine", action="append", default=[], metavar="URL[,engine=E][,model=M][,pid=N][,cgroup=PATH]",
        help="also read this inference engine's metrics each cycle (repeatable), for one discovery cannot "
             "see: a Slurm job or bare-metal server, e.g. http://127.0.0.1:8000/metrics,engine=vllm,model=llama-8b",
    )
    parser.add_argument(
        "--no-engine-discovery", dest="engine_discovery", action="store_false",
        help="do not look for inference engines in the containers of the GPU processes (a replay never does)",
    )
    parser.add_argument(
        "--engine-deadline", metavar="DURATION",
        help="engine reads not done this long after a cycle starts are given up for that cycle "
             "(default: a quarter of --interval, at most 2s)",
    )
    parser.add_argument(
        "--cgroup-root", type=Path, default=Path("/sys/fs/cgroup"),
        help="where the host's cgroup file system is, for engine discovery (default /sys/fs/cgroup)",
    )


def engine_deadline(args: argparse.Namespace, interval: float) -> float:
    """``--engine-deadline`` in seconds (ConfigError when it is no duration or not below the interval)."""
    from gputally.config.types import parse_duration

    if args.engine_deadline is None:
        return min(_DEADLINE_MOST_S, interval / 4)
    try:
        deadline = parse_duration(args.engine_deadline)
    except ValueError as exc:
        raise ConfigError(f"--engine-deadline: {exc}") from exc
    if not 0 < deadline < interval:
        raise ConfigError(f"--engine-deadline: must be above 0 and below --interval ({interval:g}s)")
    return deadline


def check_engine_options(args: argparse.Namespace, interval: float) -> None:
    """Every fault in the engine options at once, as one ConfigError; the parsed endpoints go
    to ``args.engines`` and the deadline to ``args.engine_deadline_s``."""
    from gputally.probes.engines.options import parse_engine

    problems: list[str] = []
    args.engines = []
    for spec in args.engine:
        try:
            args.engines.append(parse_engine(spec))
        except ValueError as exc:
            problems.append(f"--engine {spec}: {exc}")
    try:
        args.engine_deadline_s = engine_deadline(args, interval)
    except ConfigError as exc:
        problems.append(str(exc))
    if problems:
        raise ConfigError("; ".join(problems))


def with_engines(args: argparse.Namespace, collector: Collector, *, interval: float, node_name: str,
                 read: Read | None = None) -> Collector:
    """``collector`` with the node's engines added to each cycle, or as it is when there are
    none to read (no ``--engine``, and discovery off or a replay)."""
    if not hasattr(args, "engines"):
        check_engine_options(args, interval)
    discover = bool(args.engine_discovery) and args.replay is None
    if not args.engines and not discover:
        return collector
    from gputally.probes.core.hints import ProcFs
    from gputally.probes.engines.collector import EngineCollector, EngineReads
    from gputally.probes.engines.discover import Discovery

    if read is None:
        read = default_read()
    procfs = ProcFs(args.proc_root)
    walker = Discovery(processes=procfs, proc_root=args.proc_root, cgroup_root=args.cgroup_root)
    reads = EngineReads(read, walker=walker, processes=procfs, node_name=node_name, explicit=args.engines,
                        discover=discover)
    return EngineCollector(collector, reads, deadline_s=args.engine_deadline_s)


def default_read() -> Read:
    """The scrape and the engines' mappings (:mod:`.read`), with their default limits; the
    served-model names asked of engines whose metrics name none, and the expositions'
    shapes, are kept across cycles."""
    from gputally.probes.engines.model import Connect, Endpoint, EngineReading
    from gputally.probes.engines.read import ServedModels, read_endpoint
    from gputally.probes.engines.scrape import ScrapeLimits
    from gputally.probes.engines.shape import Shapes

    limits = ScrapeLimits()
    models = ServedModels()
    shapes = Shapes()

    async def read(endpoint: Endpoint, connect: Connect) -> EngineReading:
        return await read_endpoint(endpoint, limits=limits, connect=connect, models=models, shapes=shapes)

    return read

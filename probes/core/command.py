"""What every probe's command line shares (``nvml``, ``amd``, ``gaudi``): the options, their
checks, the example text, and the last step that hands a collector to the runner.

Imports nothing heavy at the top: ``gputally --help`` builds every probe's parser.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gputally.errors import GputallyError
from gputally.probes.core.procfacts import ProcessInfoSource
from gputally.probes.engines.command import add_engine_arguments, check_engine_options, with_engines

if TYPE_CHECKING:
    from gputally.probes.core.collector import Collector

__all__ = [
    "add_probe_arguments", "add_probe_parser", "both", "epilog", "node_name_of", "open_sources", "probe_interval",
    "run_collector",
]

S = TypeVar("S")
T = TypeVar("T")


def epilog(probe: str, example: str, *, devices: str = "devices") -> str:
    """The examples under ``gputally probe PROBE --help``; ``example`` names a recording."""
    return f"""\
examples:
  gputally probe {probe} --endpoint gateway:4317 --insecure --interval 10s
  gputally probe {probe} --once --debug                  # print one collection of this node's {devices}
  gputally probe {probe} --replay {example} --once --debug
  gputally probe {probe} --record {example} --interval 2s  # Ctrl-C when enough cycles are in

With --debug and no --endpoint nothing is sent. Exporter keys not given as flags come from
OTEL_EXPORTER_OTLP_* (endpoint, headers, certificates, timeout, compression).
"""


def add_probe_parser(
    probes: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    *,
    text: str,
    example: str,
    source: str,
    devices: str = "devices",
) -> argparse.ArgumentParser:
    """``gputally probe NAME`` with every probe's options; the caller adds its own and the handler."""
    parser = probes.add_parser(name, help=text, description=text, epilog=epilog(name, example, devices=devices),
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    add_probe_arguments(parser, source=source)
    return parser


def add_probe_arguments(parser: argparse.ArgumentParser, *, source: str) -> None:
    """The options every probe takes (``nvml``, ``amd``, ``gaudi``): one definition for all."""
    parser.add_argument(
        "--endpoint", metavar="HOST:PORT", help="receiver (default: OTEL_EXPORTER_OTLP_ENDPOINT, else localhost)"
    )
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc", help="OTLP transport (default grpc)")
    parser.add_argument("--insecure", action="store_true", help="plain text, no TLS")
    parser.add_argument("--header", action="append", default=[], metavar="K=V", help="request header (repeatable)")
    parser.add_argument("--interval", default="10s", help="time between collections (default 10s)")
    parser.add_argument("--once", action="store_true", help="collect once, deliver, exit")
    parser.add_argument("--debug", action="store_true", help="print each collection to stdout")
    parser.add_argument("--metrics-only", action="store_true",
                        help="send no logs (events): for a server without a logs pipeline")
    parser.add_argument("--summary-every", default="5m", metavar="DURATION",
                        help="a one-line summary at info this often (cycles, GPUs, points sent, failures, queue); "
                             "0: only the final one (default 5m)")
    parser.add_argument("--replay", type=Path, metavar="FILE", help=f"read a recording instead of {source}")
    parser.add_argument("--record", type=Path, metavar="FILE", help="also write what is read as a recording")
    parser.add_argument(
        "--proc-root", type=Path, default=Path("/proc"), help="where the host's /proc is (default /proc)"
    )
    parser.add_argument("--queue-dir", type=Path, metavar="DIR", help="keep the sending queue on disk here")
    parser.add_argument("--node-name", help="host.name on every resource (default: $NODE_NAME, else the hostname)")
    parser.add_argument(
        "--pod-resources", metavar="SOCKET",
        help="the kubelet's PodResources socket: each GPU then carries the pods it is allocated to "
             "(gputally.k8s.podresources.holders); 'off' never asks (default: the kubelet's socket, if it exists)",
    )
    parser.add_argument(
        "--no-pod-resources", dest="pod_resources", action="store_const", const="off",
        help="the same as --pod-resources off",
    )
    parser.add_argument(
        "--pod-resources-refresh", default="10s", metavar="DURATION",
        help="least time between two PodResources calls (default 10s)",
    )
    parser.add_argument(
        "--cri", metavar="SOCKET",
        help="the container runtime's CRI socket: each GPU's holders then carry their pod uids "
             "(gputally.k8s.podresources.uids), so pods are named on the node without the API server; "
             "'off' never asks (default: containerd's or CRI-O's socket, if one exists)",
    )
    add_engine_arguments(parser)
    parser.add_argument("--log-level", choices=("debug", "info", "warn", "error"), default="info")


def probe_interval(args: argparse.Namespace) -> float:
    """Set up logging and return ``--interval`` in seconds (ConfigError when it is no duration)."""
    from gputally.config.types import parse_duration
    from gputally.errors import ConfigError
    from gputally.logs import configure_logging

    configure_logging(args.log_level)
    # gRPC's own TLS handshake lines would repeat on every retry; the probe says what they mean once.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        interval = parse_duration(args.interval)
    except ValueError as exc:
        raise ConfigError(f"--interval: {exc}") from exc
    if interval <= 0:
        raise ConfigError("--interval: must be above 0")
    try:
        args.summary_every_s = parse_duration(args.summary_every)
    except ValueError as exc:
        raise ConfigError(f"--summary-every: {exc}") from exc
    check_engine_options(args, interval)
    return interval


def open_sources(
    args: argparse.Namespace,
    *,
    replay: Callable[[Path], tuple[S, ProcessInfoSource]],
    live: Callable[[], tuple[S, ProcessInfoSource]],
    record: Callable[[S, ProcessInfoSource, Path], tuple[S, ProcessInfoSource]],
) -> tuple[S, ProcessInfoSource, str] | int:
    """A probe's device and /proc sources from ``--replay`` / live / ``--record``, and the debug
    dump's title; or the exit status (2: no recording, 1: the vendor stack is unusable) once the
    reason is on stderr."""
    if args.replay is not None:
        try:
            source, processes = replay(args.replay)
        except (OSError, ValueError) as exc:
            print(f"gputally: cannot replay {args.replay}: {exc}", file=sys.stderr)
            return 2
        title = f"replay of {args.replay.name}"
    else:
        try:
            source, processes = live()
        except GputallyError as exc:
            print(f"gputally probe {args.probe}: {exc}", file=sys.stderr)
            return 1
        title = "live"
    if args.record is not None:
        source, processes = record(source, processes, args.record)
    return source, processes, title


def both(value: T) -> tuple[T, T]:
    """One object serving as device and /proc source (a replay, a recorder)."""
    return value, value


def node_name_of(args: argparse.Namespace) -> str:
    """``host.name`` on every resource: ``--node-name``, else $NODE_NAME, else the hostname."""
    return str(args.node_name or os.environ.get("NODE_NAME") or socket.gethostname())


async def run_collector(args: argparse.Namespace, interval: float, collector: Collector, *, title: str, probe: str) -> int:
    """Every probe's last step: its exporter from the common options, then the run loop."""
    from gputally.probes.core.allocations import from_options
    from gputally.probes.core.runner import ProbeOptions, Runner
    from gputally.telemetry import SelfTelemetry

    allocations = from_options(args.pod_resources, args.pod_resources_refresh, cri=args.cri)
    collector = with_engines(args, collector, interval=interval, node_name=node_name_of(args))
    telemetry = SelfTelemetry()
    exporter = None
    diagnose = None
    if not args.debug or args.endpoint is not None:
        from gputally.probes.delivery.exporter import create_exporter, parse_headers

        _, exporter = create_exporter(
            protocol=args.protocol,
            endpoint=args.endpoint,
            insecure=args.insecure,
            headers=parse_headers(args.header),
            queue_dir=args.queue_dir,
            telemetry=telemetry,
        )
        from gputally.probes.delivery.exporter import tls_mismatch

        destination = exporter.destination
        insecure = args.insecure or destination.startswith("http://")

        async def diagnose() -> str | None:
            return await tls_mismatch(destination, insecure=insecure)

    options = ProbeOptions(interval_s=interval, once=args.once, debug=args.debug, title=title, probe=probe,
                           metrics_only=args.metrics_only,
                           summary_interval_s=getattr(args, "summary_every_s", 300.0))
    runner = Runner(collector, options=options, exporter=exporter, allocations=allocations, diagnose=diagnose)
    return await runner.run()

"""``gputally probe amd ...`` and ``gputally probe gaudi ...``: the same options as ``probe nvml``.

Neither path imports amdsmi or runs hl-smi until a live collection needs it, so ``--replay
FILE --once --debug`` works on any laptop.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from gputally.probes.cli import add_probe_arguments, node_name_of, probe_interval, run_collector

__all__ = ["register"]

_PROBES = {
    "amd": ("Read AMD GPUs through amdsmi (ROCm) and send OTLP (or print it with --debug).", "mi300x.json"),
    "gaudi": ("Read Intel Gaudi accelerators through hl-smi and send OTLP (or print it with --debug).", "gaudi3.json"),
}


def _epilog(name: str, example: str) -> str:
    return f"""\
examples:
  gputally probe {name} --endpoint gateway:4317 --insecure --interval 10s
  gputally probe {name} --once --debug                  # print one collection of this node's devices
  gputally probe {name} --replay {example} --once --debug
  gputally probe {name} --record {example} --interval 2s  # Ctrl-C when enough cycles are in

With --debug and no --endpoint nothing is sent. Exporter keys not given as flags come from
OTEL_EXPORTER_OTLP_* (endpoint, headers, certificates, timeout, compression).
"""


def register(probes: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``amd`` and ``gaudi`` beside ``nvml`` under ``gputally probe``."""
    for name, (text, example) in _PROBES.items():
        p = probes.add_parser(name, help=text, description=text, epilog=_epilog(name, example),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(handler=_command, vendor=name)
        add_probe_arguments(p, source="the devices")
        if name == "gaudi":
            p.add_argument("--hl-smi", default="hl-smi", metavar="PATH", help="the hl-smi binary (default: on PATH)")
            p.add_argument("--sys-root", default="/sys", metavar="DIR",
                           help="the host's sysfs, for the NIC ports' counters (default /sys; in a container "
                                "without hostNetwork, mount the host's /sys and point here)")


def _command(args: argparse.Namespace) -> int:
    return asyncio.run(run(args, probe_interval(args)))


def _live(args: argparse.Namespace, budget: float) -> tuple[Any, Any]:
    from gputally.probes.hints import ProcFs

    processes = ProcFs(args.proc_root)
    if args.vendor == "amd":
        from gputally.probes.amd_probe import AmdsmiSource, load_amdsmi

        return AmdsmiSource(proc_root=args.proc_root, module=load_amdsmi()), processes
    from gputally.probes.gaudi_probe import HlSmiSource

    return HlSmiSource(binary=args.hl_smi, timeout_s=max(0.5, budget * 0.9), sys_root=args.sys_root), processes


async def run(args: argparse.Namespace, interval: float) -> int:
    from gputally.probes.vendor_common import VendorCollector, VendorRecorder, VendorReplay, VendorUnavailable

    vendor = args.vendor
    if vendor == "amd":
        from gputally.probes.amd_probe import FORMAT, map_amd as mapper
    else:
        from gputally.probes.gaudi_probe import FORMAT, map_gaudi as mapper  # type: ignore[assignment]
    budget = min(5.0, interval * 0.8)
    source: Any
    processes: Any
    if args.replay is not None:
        try:
            source = processes = VendorReplay.from_file(args.replay)
        except (OSError, ValueError) as exc:
            print(f"gputally: cannot replay {args.replay}: {exc}", file=sys.stderr)
            return 2
        title = f"replay of {args.replay.name}"
    else:
        try:
            source, processes = _live(args, budget)
        except VendorUnavailable as exc:
            print(f"gputally probe {vendor}: {exc}", file=sys.stderr)
            return 1
        title = "live"
    if args.record is not None:
        source = VendorRecorder(source, processes, path=args.record, fmt=FORMAT)
        processes = source
    collector = VendorCollector(source, processes, mapper, node_name=node_name_of(args), vendor=vendor, budget_s=budget)
    return await run_collector(args, interval, collector, title=title, probe=vendor)

"""``gputally demo``: registered through the ``gputally.commands`` entry point ``demo``."""

from __future__ import annotations

import argparse
from pathlib import Path

from .run import Options, run_demo

__all__ = ["register"]

_HELP = "replay a recorded H200 through serve + usage: who used, idled and pays (no cluster needed)"


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("demo", help=_HELP, description=_HELP)
    parser.add_argument("--recording", type=Path, default=None, metavar="FILE",
                        help="an NVML recording (default: the shared H200 time series beside a checkout, "
                             "or $GPUTALLY_DEMO_RECORDING)")
    parser.add_argument("--synthetic", action="store_true",
                        help="replay made-up readings of the same workloads instead (the default where no recording is found)")
    parser.add_argument("--readings", type=int, default=None, metavar="N",
                        help="how many readings to replay, at the recording's own pace (default: all of them, once)")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    return run_demo(Options(recording=args.recording, synthetic=args.synthetic, readings=args.readings))

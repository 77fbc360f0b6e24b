"""The report's options and runs for what goes to other people's tools: the FOCUS export
(``--format focus`` / ``focus-parquet``) and the comparison with Slurm's books
(``--compare-sacct``). Kept out of `cli` so that the command's own module stays the table's."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from . import focus, focus_write, periods, queries, sacct
from .errors import UsageError
from .prometheus import Prometheus
from .timerange import Range, parse_days_duration

__all__ = ["FORMATS", "add_arguments", "compare_sacct", "export"]

FORMATS = ("focus", "focus-parquet")
"""``--format`` values this module writes."""

Progress = Callable[[int, int, float], None]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    export = parser.add_argument_group("FOCUS export (--format focus: CSV, focus-parquet: Parquet)")
    export.add_argument("--period", choices=tuple(periods.PERIODS), default="day",
                        help="charge period of a FOCUS row, cut at UTC boundaries (default day)")
    export.add_argument("--output", type=Path, metavar="FILE",
                        help="write there instead of stdout (required for focus-parquet)")
    export.add_argument("--decimals", type=_decimals, default=6, metavar="N",
                        help="decimals of the costs (default 6); rows still add up to the period's total exactly")
    defaults = focus.Identity()
    export.add_argument("--provider", default=defaults.provider, metavar="NAME",
                        help=f"ProviderName, ServiceProviderName, InvoiceIssuerName (default {defaults.provider!r})")
    export.add_argument("--billing-account", default=defaults.billing_account, metavar="ID",
                        help=f"BillingAccountId and Name (default {defaults.billing_account!r})")
    books = parser.add_argument_group("against Slurm's books")
    books.add_argument("--compare-sacct", metavar="FILE",
                       help="compare each job's allocated GPU-seconds with `sacct --json` or "
                            "`sacct -X -P -o JobIDRaw,ElapsedRaw,AllocTRES` output (- for stdin); "
                            "exit 1 past --tolerance")
    books.add_argument("--tolerance", default="15s", metavar="DURATION",
                       help="accepted difference per GPU and per job boundary (default 15s: a 10 s probe "
                            "interval, the slurm processor's refresh, sacct's whole seconds)")


def _decimals(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value <= 12:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 12")
    return value


def whole_seconds(rng: Range) -> Range:
    """FOCUS date/times are to the second: the range widened to whole seconds."""
    return Range(float(math.floor(rng.start)), float(math.ceil(rng.end)))


def export(args: argparse.Namespace, client: Prometheus, rng: Range, *, lookback: float,
           progress: Progress) -> tuple[list[dict[str, object]], str]:
    """The FOCUS rows of the range and, for CSV to stdout, their text (empty when written to
    ``--output``)."""
    if args.format == "focus-parquet" and args.output is None:
        raise UsageError("--format focus-parquet writes a file: add --output FILE.parquet")
    found = periods.fetch(client, whole_seconds(rng), args.period, lookback=lookback, progress=progress)
    rows = focus.rows(found, decimals=args.decimals,
                      identity=focus.Identity(provider=args.provider, billing_account=args.billing_account))
    if args.format == "focus-parquet":
        focus_write.write_parquet(rows, args.output)
        return rows, ""
    text = focus_write.to_csv(rows)
    if args.output is not None:
        try:
            args.output.write_text(text)
        except OSError as exc:
            raise UsageError(f"cannot write {args.output}: {exc.strerror}") from exc
        return rows, ""
    return rows, text


def _read(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read --compare-sacct {source}: {exc.strerror}") from exc


def compare_sacct(args: argparse.Namespace, client: Prometheus, rng: Range, *, chunk: float, lookback: float,
                  progress: Progress, out: TextIO) -> int:
    """Print the comparison; 0 when every job agrees, 1 when one does not."""
    jobs = sacct.parse(_read(args.compare_sacct), args.compare_sacct)
    try:
        tolerance = parse_days_duration(args.tolerance)
    except ValueError as exc:
        raise UsageError(f"--tolerance: {exc}") from exc
    selector = queries.Selector(((queries.OWNER_KIND, "slurm.job"),))
    usage = queries.fetch(client, rng, selector=selector, chunk=chunk, lookback=lookback, progress=progress)
    comparison = sacct.compare(jobs, usage.accounts, tolerance=tolerance)
    out.write(sacct.render(comparison))
    return 0 if comparison.ok else 1

"""``gputally report``: the usage processor's chargeback counters, read back from Prometheus.

    gputally report --prometheus URL [--since 30d | --start T --end T] [--by owner|namespace|...]
    gputally report job JOBID --prometheus URL
    gputally report pod NAMESPACE/NAME|UID --prometheus URL

Errors are one line, ``gputally: ...``, exit 2 for arguments that cannot be honoured and 1
for everything that goes wrong at run time (see `errors`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import TextIO

from gputally.config.types import ClientTLSSettings
from gputally.errors import ConfigError

from . import queries, render, render_served, served, table, workload
from .errors import NoData, ReportError, UsageError
from .prometheus import Prometheus
from .timerange import Range, format_time, parse_days_duration, resolve

__all__ = ["register", "run"]

TOKEN_ENV = "GPUTALLY_PROMETHEUS_TOKEN"
URL_ENV = "GPUTALLY_PROMETHEUS_URL"
_HELP = "Chargeback from the usage counters in Prometheus: a table by owner, namespace, job..., or one job or pod."
_EPILOG = f"""\
examples:
  gputally report --prometheus http://prometheus:9090 --since 30d --by namespace
  gputally report --prometheus https://mimir/prometheus --header X-Scope-OrgID=gpu --by account --format csv
  gputally report job 4242 --prometheus http://prometheus:9090
  gputally report pod ml/trainer-0 --prometheus http://prometheus:9090 --format json

Rows without the --by label are kept: (unallocated) is GPU time nobody held, (unattributed)
work no owner rule named, (no namespace) / (no job) ... accounts of the other kind. The token
comes from --bearer-token-file, else ${TOKEN_ENV}; the URL from --prometheus, else ${URL_ENV}.
"""
NO_USAGE = ("no gputally_usage_* series in Prometheus: enable the usage processor (processors: usage) in a "
            "metrics pipeline and export to this Prometheus")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``report`` command to the top-level parser."""
    parser = commands.add_parser("report", help=_HELP, description=_HELP, epilog=_EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(handler=run)
    # `--since -1h`: a value that starts with a minus and a digit is a value, not an option
    # (argparse takes only plain negative numbers so; no option of report starts with a digit).
    parser._negative_number_matcher = re.compile(r"^-\d[\w.]*$")
    parser.add_argument("view", nargs="?", metavar="job|pod", help="one workload instead of the table")
    parser.add_argument("name", nargs="?", help="the Slurm job id, or the pod as NAMESPACE/NAME or its UID")
    source = parser.add_argument_group("Prometheus")
    source.add_argument("--prometheus", metavar="URL", default=os.environ.get(URL_ENV),
                        help=f"base URL of a Prometheus-compatible query API (default ${URL_ENV})")
    source.add_argument("--bearer-token-file", type=Path, metavar="FILE",
                        help=f"send its content as a bearer token (default: ${TOKEN_ENV}, if set)")
    source.add_argument("--header", action="append", default=[], metavar="K=V",
                        help="another request header, e.g. X-Scope-OrgID=tenant (repeatable)")
    source.add_argument("--ca-file", type=Path, metavar="FILE", help="CA bundle to verify an https server with")
    source.add_argument("--cert-file", type=Path, metavar="FILE", help="client certificate (mutual TLS)")
    source.add_argument("--key-file", type=Path, metavar="FILE", help="key of --cert-file")
    source.add_argument("--insecure-skip-verify", action="store_true", help="accept any server certificate")
    source.add_argument("--timeout", default="2m", metavar="DURATION", help="per query (default 2m)")
    when = parser.add_argument_group("time range")
    when.add_argument("--since", metavar="DURATION", help="the range ends at --end (default now) and is this long "
                                                          "(30d, 12h, 1d12h; default 30d)")
    when.add_argument("--start", metavar="TIME", help="RFC 3339 (2025-06-01T00:00:00Z, 2025-06-01) or unix seconds")
    when.add_argument("--end", metavar="TIME", help="as --start (default now)")
    when.add_argument("--chunk", default="1d", metavar="DURATION",
                      help="query the range in pieces this long (default 1d)")
    when.add_argument("--lookback", default="1d", metavar="DURATION",
                      help="how far before the start a counter's value at the start is looked for (default 1d)")
    output = parser.add_argument_group("output")
    output.add_argument("--by", choices=(*table.BY, "served-model"), default="owner",
                        help="the table's rows (default owner); served-model: tokens and GPU-s, J and cost per 1M "
                             "tokens per owner, served model and GPU model")
    output.add_argument("--format", choices=("table", "csv", "json"), default="table", help="default table")
    notes = parser.add_argument_group("notes of `report job` / `report pod` (defaults: the usage processor's summary)")
    defaults = workload.Thresholds()
    notes.add_argument("--low-utilization", type=_share, default=defaults.low_utilization, metavar="SHARE",
                       help=f"note a mean utilization below this (default {defaults.low_utilization})")
    notes.add_argument("--unused-below", type=_share, default=defaults.unused_below, metavar="SHARE",
                       help=f"a GPU busy less than this share of its allocated time is unused "
                            f"(default {defaults.unused_below})")
    notes.add_argument("--low-memory", type=_share, default=defaults.low_memory, metavar="SHARE",
                       help=f"note a peak memory below this share of the GPU's (default {defaults.low_memory})")


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1")
    return value


def run(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """The command: 0, or the error's exit status after one line on stderr."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        text = _report(args, err)
    except ReportError as exc:
        print(f"gputally: {exc}", file=err)
        return exc.exit_code
    try:
        out.write(text)
        out.flush()
    except BrokenPipeError:  # `gputally report | head`
        return 0
    return 0


def _duration(flag: str, text: str) -> float:
    try:
        seconds = parse_days_duration(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from exc
    if seconds <= 0:
        raise UsageError(f"{flag} must be longer than 0s")
    return seconds


def _client(args: argparse.Namespace) -> Prometheus:
    if not args.prometheus:
        raise UsageError(f"say where Prometheus is: --prometheus URL (or ${URL_ENV})")
    if not args.prometheus.startswith(("http://", "https://")):
        raise UsageError(f"--prometheus {args.prometheus}: the URL must start with http:// or https://")
    token = os.environ.get(TOKEN_ENV) or None
    if args.bearer_token_file is not None:
        try:
            token = args.bearer_token_file.read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read --bearer-token-file {args.bearer_token_file}: {exc.strerror}") from exc
    headers: dict[str, str] = {}
    for item in args.header:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--header {item!r}: expected NAME=VALUE")
        headers[key.strip()] = value.strip()
    context = None
    if args.prometheus.startswith("https://"):
        try:
            tls = ClientTLSSettings(ca_file=args.ca_file, cert_file=args.cert_file, key_file=args.key_file,
                                    insecure_skip_verify=args.insecure_skip_verify)
        except ValueError:
            raise UsageError("--cert-file and --key-file go together") from None
        from gputally.tls.client import client_ssl_context

        try:
            context = client_ssl_context(tls, key="--ca-file/--cert-file")
        except ConfigError as exc:
            raise UsageError(str(exc)) from exc
    return Prometheus(args.prometheus, token=token, headers=headers, context=context,
                      timeout=_duration("--timeout", args.timeout))


class _Progress:
    """``querying chunk 3/30`` on one line of a terminal's stderr, erased when done; silent
    when stderr is not a terminal (cron, CI, a pipe)."""

    def __init__(self, err: TextIO) -> None:
        self.err = err
        self.active = err.isatty()
        self.shown = False

    def __call__(self, done: int, total: int, upto: float) -> None:
        if self.active and total > 1:
            self.err.write(f"\rquerying Prometheus: {done}/{total} chunks (to {format_time(upto)})\x1b[K")
            self.err.flush()
            self.shown = True

    def close(self) -> None:
        if self.shown:
            self.err.write("\r\x1b[K")
            self.err.flush()


def _report(args: argparse.Namespace, err: TextIO) -> str:
    if args.view is not None and args.view not in workload.KINDS:  # `report 4242`: not argparse's choice error
        if args.name is None:
            raise UsageError(f"{args.view!r}: say `report job {args.view}` or `report pod {args.view}`")
        raise UsageError(f"report {args.view} {args.name}: expected `report job JOBID` or `report pod NAMESPACE/NAME`")
    if args.view is not None and not args.name:
        raise UsageError(f"report {args.view} needs a {'job id' if args.view == 'job' else 'NAMESPACE/NAME'}")
    if args.view == "pod" and args.name.count("/") > 1:
        raise UsageError(f"report pod {args.name}: expected NAMESPACE/NAME or the pod's UID")
    if args.view is not None and args.format == "csv":  # before asking Prometheus: a usage error either way
        raise UsageError("report job/pod writes table or json, not csv")
    rng = resolve(since=args.since, start=args.start, end=args.end)
    chunk = _duration("--chunk", args.chunk)
    lookback = _duration("--lookback", args.lookback)
    client = _client(args)
    selector = queries.Selector()
    if args.view is not None:
        kind = workload.KINDS[args.view]
        owner = args.name
        if args.view == "pod" and "/" in owner:  # pods are accounted by uid: find the one of that name
            owner = _pod_uid(client, rng, lookback, owner)
        selector = queries.Selector(((queries.OWNER_KIND, kind), (queries.OWNER_ID, owner)))
    progress = _Progress(err)
    if args.view is None and args.by == "served-model":
        try:
            found = served.fetch(client, rng, chunk=chunk, lookback=lookback, progress=progress)
        finally:
            progress.close()
        if not found.rows:
            raise NoData(f"no served-model counters (gputally_usage_tokens_total) between {rng}: no inference engine "
                         "was read, or the usage processor is older than them")
        return {"table": render_served.served_text, "csv": render_served.served_csv,
                "json": render_served.served_json}[args.format](found, rng)
    try:
        usage = queries.fetch(client, rng, selector=selector, chunk=chunk, lookback=lookback, progress=progress,
                              unattributed=args.view is None)
    finally:
        progress.close()
    if not usage.accounts:
        _nothing(client, rng, lookback, args)
    if args.view is None:
        built = table.build(usage.accounts, args.by)
        built.unattributed = usage.unattributed
        return {"table": render.table_text, "csv": render.table_csv, "json": render.table_json}[args.format](built, rng)
    thresholds = workload.Thresholds(args.low_utilization, args.unused_below, args.low_memory)
    guests = [a.hw_id for a in usage.accounts if a.allocated == 0]
    view = workload.build(kind, args.name, usage, limits=queries.memory_limits(client, usage, lookback=lookback),
                          seen=queries.first_and_last_seen(client, selector, usage), thresholds=thresholds,
                          held=queries.held_by_others(client, rng, guests) if guests else set())
    if args.format == "json":
        return render.workload_json(view, rng)
    return render.workload_text(view, rng)


def _pod_uid(client: Prometheus, rng: Range, lookback: float, name: str) -> str:
    """The owner id (uid) of the pod ``NAMESPACE/NAME`` in the range: its counters carry the
    names once known. A name no uid carries is looked up as an id (a pod nobody knew the uid of)."""
    namespace, pod = name.split("/", 1)
    window = queries.duration_text(rng.end - rng.start + lookback)
    matchers = (f'{queries.OWNER_KIND}="k8s.pod",k8s_namespace_name={queries.promql_string(namespace)},'
                f"k8s_pod_name={queries.promql_string(pod)}")
    found = sorted({s.labels.get(queries.OWNER_ID, "") for s in client.vector(
        f"group by ({queries.OWNER_ID}) (last_over_time({queries.COUNTERS['allocated']}{{{matchers}}}[{window}]))"
        f" or group by ({queries.OWNER_ID}) (last_over_time({queries.COUNTERS['busy']}{{{matchers}}}[{window}]))",
        rng.end)} - {""})
    if len(found) > 1:
        raise UsageError(f"report pod {name}: {len(found)} pods had that name ({', '.join(found)}); "
                         "say `report pod UID`")
    return found[0] if found else name


def _nothing(client: Prometheus, rng: Range, lookback: float, args: argparse.Namespace) -> None:
    """Raise the right `NoData`: no usage counters anywhere, or none in the range (for the workload)."""
    now = max(time.time(), rng.end)
    if not queries.usage_series_exist(client, now, now - rng.start + lookback):
        raise NoData(NO_USAGE)
    if args.view == "job":
        raise NoData(f"no usage counters for Slurm job {args.name} between {rng}")
    if args.view == "pod":
        raise NoData(f"no usage counters for pod {args.name} between {rng}")
    raise NoData(f"no usage counters between {rng}")

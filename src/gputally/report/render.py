"""Text for a terminal (80 columns), CSV and JSON, for the chargeback table and a workload's view.

Terminal figures are rounded per column so that its largest value shows three significant
digits (GPU-hours of a short replay and of a month both read well); CSV and JSON carry the
unrounded figures, for scripts and spreadsheets. Units are in the names: ``*_gpu_hours``,
``energy_kwh``, ``cost`` (with its currency).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from typing import Any

from .table import Figures, Table
from .timerange import Range, format_time
from .workload import GIB, Workload

__all__ = ["WIDTH", "table_csv", "table_json", "table_text", "workload_json", "workload_text"]

WIDTH = 80


def _decimals(values: Sequence[float], *, least: int = 1) -> int:
    """Enough decimals for three significant digits of the largest value, at most 4."""
    largest = max((abs(v) for v in values), default=0.0)
    if largest == 0:
        return least
    return max(least, min(4, 2 - math.floor(math.log10(largest))))


def _number(value: float, decimals: int) -> str:
    return f"{value:,.{decimals}f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _grid(headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int) -> list[str]:
    """Columns two spaces apart, the first ``left`` left-aligned, the rest right-aligned. Names
    and ids are never cut (a uid or a job id cut in the middle names nobody): a long one widens
    the table past 80 columns instead."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.ljust(widths[i]) if i < left else c.rjust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(parts).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def _gib_text(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.1f}"


def _cost_columns(currencies: Sequence[str]) -> list[str]:
    return list(currencies) or ["cost"]


def _costs(figures: Figures, currencies: Sequence[str]) -> list[float]:
    return [figures.cost.get(c, 0.0) for c in currencies] or [0.0]


_UNITS = "GPU-hours allocated, busy, idle; eff = busy / allocated; peak GiB; cost in {}"


def _header(title: str, rng: Range) -> str:
    return f"{title}, {format_time(rng.start)} to {format_time(rng.end)}"


# -- the chargeback table ------------------------------------------------------------------------

def table_text(table: Table, rng: Range) -> str:
    figures = [r.figures for r in table.rows]
    everything = [*figures, table.total]
    hours = _decimals([v for f in everything for v in (f.allocated_hours, f.busy_hours, f.idle_hours)])
    kwh = _decimals([f.energy_kwh for f in everything])
    money = _decimals([c for f in everything for c in _costs(f, table.currencies)], least=2)

    def cells(label: str, f: Figures) -> list[str]:
        return [label, _number(f.allocated_hours, hours), _number(f.busy_hours, hours), _percent(f.efficiency),
                _number(f.idle_hours, hours), _gib_text(f.peak_memory), _number(f.energy_kwh, kwh),
                *(_number(c, money) for c in _costs(f, table.currencies))]

    def shown_sum(values: Sequence[float], decimals: int) -> str:
        """A TOTAL cell that adds like the rows shown (``--format json`` has the exact sum)."""
        return _number(sum(round(v, decimals) for v in values) + 0.0, decimals)

    total = table.total
    total_cells = ["TOTAL", shown_sum([f.allocated_hours for f in figures], hours),
                   shown_sum([f.busy_hours for f in figures], hours), _percent(total.efficiency),
                   shown_sum([f.idle_hours for f in figures], hours), _gib_text(total.peak_memory),
                   shown_sum([f.energy_kwh for f in figures], kwh),
                   *(shown_sum([_costs(f, table.currencies)[i] for f in figures], money)
                     for i in range(len(_costs(total, table.currencies))))]
    headers = [table.by, "alloc h", "busy h", "eff", "idle h", "peak GiB", "kWh", *_cost_columns(table.currencies)]
    rows = [cells(r.label, r.figures) for r in table.rows] + [total_cells]
    lines = _grid(headers, rows, left=1)
    rule = "-" * max(len(line) for line in lines)
    shared = [] if all((f.efficiency or 0.0) <= 1.0 for f in figures) else [
        "", "eff above 100%: a GPU shared by N holders gives each 1/N of its time as allocated, and its",
        "busy time to whoever computed: a holder that did more than its share goes past 100%."]
    return "\n".join([_header(f"GPU usage by {table.by}", rng),
                      _UNITS.format(" and ".join(table.currencies) or "-"), "", lines[0], *lines[1:-1], rule,
                      lines[-1], *shared, *_unattributed_text(table, hours),
                      *_refused_text(table, hours, kwh)]) + "\n"


_REASONS = {"no_cgroup": "no cgroup", "no_metadata": "no metadata"}


def _unattributed_text(table: Table, hours: int) -> list[str]:
    """The line under the table: how much of the GPUs' work no rule attributed, and why."""
    if not table.unattributed:
        return []
    busy = sum(table.unattributed.values())
    if busy <= 0:
        return ["", "unattributed work: none (every busy GPU-hour has an owner)"]
    share = busy / table.total.busy if table.total.busy > 0 else None
    why = ", ".join(f"{_REASONS.get(r, r)} {_number(v / 3600, hours)}" for r, v in sorted(table.unattributed.items())
                    if v > 0)
    return ["", f"unattributed work: {_number(busy / 3600, hours)} GPU-h busy, {_percent(share)} of all busy time",
            f"  {why} (may be the GPUs' owners' own work)"]


def _refused_text(table: Table, hours: int, kwh: int) -> list[str]:
    """The lines under the table: what the GPUs' readings claimed that no GPU can have done (the
    usage processor refused it: it is in no figure above), and why, one reason a line."""
    if not table.refused:
        return []
    seconds = sum(t for t, _ in table.refused.values())
    joules = sum(e for _, e in table.refused.values())
    lines = ["", f"refused as impossible (in no figure above): {_number(seconds / 3600, hours)} GPU-h busy, "
                 f"{_number(joules / 3.6e6, kwh)} kWh"]
    for reason, (t, e) in sorted(table.refused.items()):
        parts = [f"{_number(t / 3600, hours)} GPU-h busy"] if t > 0 else []
        parts += [f"{_number(e / 3.6e6, kwh)} kWh"] if e > 0 else []
        lines.append(f"  {reason.replace('_', ' ')}: {', '.join(parts) or 'seen, nothing refused'}")
    return lines


def _figures_json(f: Figures) -> dict[str, Any]:
    return {"gpus": len(f.gpus), "allocated_gpu_hours": f.allocated_hours, "busy_gpu_hours": f.busy_hours,
            "efficiency": f.efficiency, "idle_gpu_hours": f.idle_hours, "peak_memory_bytes": f.peak_memory,
            "energy_kwh": f.energy_kwh, "cost": dict(sorted(f.cost.items()))}


def table_json(table: Table, rng: Range) -> str:
    body = {
        "start": format_time(rng.start), "end": format_time(rng.end), "by": table.by, "currencies": table.currencies,
        "rows": [{"label": r.label, **r.group, "special": r.special, **_figures_json(r.figures)} for r in table.rows],
        "total": _figures_json(table.total),
    }
    if table.unattributed:
        busy = sum(table.unattributed.values())
        body["unattributed"] = {
            "busy_gpu_hours": busy / 3600,
            "share_of_busy": busy / table.total.busy if table.total.busy > 0 else None,
            "by_reason_gpu_hours": {r: v / 3600 for r, v in sorted(table.unattributed.items())},
        }
    if table.refused:
        body["refused"] = {r: {"busy_gpu_hours": t / 3600, "energy_kwh": e / 3.6e6}
                           for r, (t, e) in sorted(table.refused.items())}
    return json.dumps(body, indent=2) + "\n"


def table_csv(table: Table, rng: Range) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*table.columns, "gpus", "allocated_gpu_hours", "busy_gpu_hours", "efficiency", "idle_gpu_hours",
                     "peak_memory_bytes", "energy_kwh", *(f"cost_{c}" for c in table.currencies)])

    def values(f: Figures) -> list[Any]:
        return [len(f.gpus), repr(f.allocated_hours), repr(f.busy_hours),
                "" if f.efficiency is None else repr(f.efficiency), repr(f.idle_hours),
                "" if f.peak_memory is None else repr(f.peak_memory), repr(f.energy_kwh),
                *(repr(f.cost.get(c, 0.0)) for c in table.currencies)]

    for row in table.rows:
        group = [row.label if row.special and v is None else v for v in row.group.values()]
        writer.writerow([*group, *values(row.figures)])
    writer.writerow(["TOTAL", *([""] * (len(table.columns) - 1)), *values(table.total)])
    return out.getvalue()


# -- one workload --------------------------------------------------------------------------------

def _who(w: Workload) -> list[str]:
    labels = w.labels
    if w.kind == "slurm.job":
        name = f" ({labels['slurm_job_name']})" if labels.get("slurm_job_name") else ""
        cluster = f" on cluster {labels['slurm_cluster_name']}" if labels.get("slurm_cluster_name") else ""
        who = "  ".join(f"{word} {labels[key]}" for word, key in
                        (("user", "slurm_job_user"), ("account", "slurm_job_account"),
                         ("partition", "slurm_job_partition")) if labels.get(key))
        return [f"Slurm job {w.id}{name}{cluster}", *([f"  {who}"] if who else [])]
    owner = ""
    if labels.get("gputally_k8s_owner_kind"):
        owner = f" ({labels['gputally_k8s_owner_kind']} {labels.get('gputally_k8s_owner_name', '?')})"
    uid = f"  uid {labels['k8s_pod_uid']}" if labels.get("k8s_pod_uid") else ""
    return [f"Pod {w.id}{owner}", *([uid] if uid else [])]


def _span(first: float | None, last: float | None) -> str:
    if first is None or last is None:
        return "-"
    seconds = last - first
    length = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"
    return f"{format_time(first)} to {format_time(last)} ({length})"


def workload_text(w: Workload, rng: Range) -> str:
    t = w.total
    everything = [*(g.figures for g in w.gpus), t]
    hours = _decimals([v for f in everything for v in (f.allocated_hours, f.busy_hours, f.idle_hours)])
    kwh = _decimals([f.energy_kwh for f in everything])
    money = _decimals([c for f in everything for c in _costs(f, w.currencies)], least=2)
    costs = ", ".join(f"{_number(c, money)} {cur}" for c, cur in zip(_costs(t, w.currencies), w.currencies, strict=False))
    head = [
        *_who(w),
        f"  hosts {', '.join(w.hosts) or '?'}",
        f"  seen {_span(w.first_seen, w.last_seen)}",
        f"  {len(w.gpus)} GPU{'' if len(w.gpus) == 1 else 's'}: {_number(t.allocated_hours, hours)} GPU-h allocated, "
        f"{_number(t.busy_hours, hours)} busy ({_percent(t.efficiency)}), {_number(t.idle_hours, hours)} idle",
        f"  {_number(t.energy_kwh, kwh)} kWh" + (f", cost {costs}" if costs else ""),
    ]

    def memory(g: Any) -> str:
        peak = "?" if g.peak_memory is None else f"{g.peak_memory / GIB:.1f}"
        limit = "?" if g.memory_limit is None else f"{g.memory_limit / GIB:.1f}"
        return f"{peak}/{limit}"

    rows = [[g.index or "?", g.model or "?", g.host or "?", _number(g.figures.allocated_hours, hours),
             _percent(g.utilization), memory(g), _number(g.figures.energy_kwh, kwh),
             *(_number(c, money) for c in _costs(g.figures, w.currencies))] for g in w.gpus]
    headers = ["GPU", "model", "host", "alloc h", "util", "peak/GPU GiB", "kWh", *_cost_columns(w.currencies)]
    grid = _grid(headers, rows, left=3)
    notes = ["notes:", *(f"  - {n}" for n in w.notes)] if w.notes else ["notes: none"]
    title = _header(f"usage of {w.kind} {w.id}", rng)
    return "\n".join([title, "", *head, "", *grid, "", *notes]) + "\n"


def workload_json(w: Workload, rng: Range) -> str:
    body = {
        "start": format_time(rng.start), "end": format_time(rng.end),
        "owner_kind": w.kind, "owner_id": w.id,
        "labels": dict(sorted(w.labels.items())),
        "first_seen": None if w.first_seen is None else format_time(w.first_seen),
        "last_seen": None if w.last_seen is None else format_time(w.last_seen),
        "hosts": w.hosts,
        "total": _figures_json(w.total),
        "gpus": [{"hw_id": g.hw_id, "index": g.index, "model": g.model, "host": g.host, **_figures_json(g.figures),
                  "utilization": g.utilization, "peak_memory_bytes": g.peak_memory,
                  "memory_limit_bytes": g.memory_limit} for g in w.gpus],
        "notes": w.notes,
    }
    return json.dumps(body, indent=2) + "\n"

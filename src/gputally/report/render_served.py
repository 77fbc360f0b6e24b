"""``report --by served-model`` as text (80 columns where the names allow), CSV and JSON.

Text rounds each column to three significant digits of its largest value (as the chargeback
table does); CSV and JSON carry the unrounded figures, with units in the names:
``gpu_seconds_per_1m_tokens_allocated``, ``joules_per_1m_tokens``, ``cost_per_1m_tokens_busy``...
A figure per 1M tokens is empty (``-``, ``null``) for a row without tokens.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from .render import _decimals, _grid, _header, _number
from .served import Row, Served
from .timerange import Range, format_time

__all__ = ["served_csv", "served_json", "served_text"]

_NOTE = ("GPU-s and J per 1M tokens (input + output); allocated basis: the owner's allocated GPU time\n"
         "that served the model; busy basis: its busy time. Cost per 1M tokens in {}: allocated\n"
         "hours x price + energy cost, and busy hours x price + energy cost.")


def _figures(row: Row, currencies: list[str]) -> list[float | None]:
    return [row.per_million(row.allocated), row.per_million(row.busy), row.per_million(row.energy),
            *(v for c in currencies for v in (row.per_million(row.cost.get(c, 0.0)),
                                              row.per_million(row.busy_cost.get(c, 0.0))))]


def served_text(served: Served, rng: Range) -> str:
    rows = [*served.rows, served.total]
    figures = [_figures(r, served.currencies) for r in rows]
    columns = list(zip(*figures, strict=True)) if figures else []
    decimals = [_decimals([v for v in column if v is not None]) for column in columns]

    def cells(row: Row, values: list[float | None]) -> list[str]:
        shown = ["-" if v is None else _number(v, d) for v, d in zip(values, decimals, strict=True)]
        return [row.label, row.model or "-", row.gpu_model or "-", _number(row.input, 0), _number(row.output, 0), *shown]

    money = [h for c in served.currencies for h in (f"{c}/1M alloc", f"{c}/1M busy")]
    headers = ["owner", "model", "GPU", "in tok", "out tok", "GPU-s/1M alloc", "GPU-s/1M busy", "J/1M", *money]
    lines = _grid(headers, [cells(r, f) for r, f in zip(rows, figures, strict=True)], left=3)
    rule = "-" * max(len(line) for line in lines)
    return "\n".join([_header("Served models by owner", rng), _NOTE.format(" and ".join(served.currencies) or "-"),
                      "", lines[0], *lines[1:-1], rule, lines[-1]]) + "\n"


def _row_json(row: Row) -> dict[str, Any]:
    return {
        "input_tokens": row.input, "output_tokens": row.output, "engines": sorted(row.engines),
        "allocated_gpu_seconds": row.allocated, "busy_gpu_seconds": row.busy, "energy_joules": row.energy,
        "cost": dict(sorted(row.cost.items())), "busy_cost": dict(sorted(row.busy_cost.items())),
        "gpu_seconds_per_1m_tokens_allocated": row.per_million(row.allocated),
        "gpu_seconds_per_1m_tokens_busy": row.per_million(row.busy),
        "joules_per_1m_tokens": row.per_million(row.energy),
        "cost_per_1m_tokens_allocated": {c: row.per_million(v) for c, v in sorted(row.cost.items())},
        "cost_per_1m_tokens_busy": {c: row.per_million(v) for c, v in sorted(row.busy_cost.items())},
    }


def served_json(served: Served, rng: Range) -> str:
    body = {
        "start": format_time(rng.start), "end": format_time(rng.end), "by": "served-model",
        "currencies": served.currencies,
        "rows": [{"label": r.label, "owner_kind": r.kind, "owner_id": r.owner, "model": r.model,
                  "gpu_model": r.gpu_model, **_row_json(r)} for r in served.rows],
        "total": _row_json(served.total),
    }
    return json.dumps(body, indent=2) + "\n"


def served_csv(served: Served, rng: Range) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    money = [h for c in served.currencies for h in (f"cost_per_1m_tokens_allocated_{c}", f"cost_per_1m_tokens_busy_{c}")]
    writer.writerow(["owner_kind", "owner_id", "model", "gpu_model", "input_tokens", "output_tokens",
                     "allocated_gpu_seconds", "busy_gpu_seconds", "energy_joules",
                     "gpu_seconds_per_1m_tokens_allocated", "gpu_seconds_per_1m_tokens_busy", "joules_per_1m_tokens",
                     *money])

    def values(row: Row) -> list[str]:
        return [repr(row.input), repr(row.output), repr(row.allocated), repr(row.busy), repr(row.energy),
                *("" if v is None else repr(v) for v in _figures(row, served.currencies))]

    for row in served.rows:
        writer.writerow([row.kind, row.owner, row.model, row.gpu_model, *values(row)])
    writer.writerow(["TOTAL", "", "", "", *values(served.total)])
    return out.getvalue()

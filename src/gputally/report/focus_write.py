"""Writing FOCUS rows: CSV (standard library) or Parquet (pyarrow, an optional extra).

CSV: a header of the column names, RFC 4180 quoting, an empty field for null, decimals in
plain notation, date/times as ISO 8601 UTC (``2026-12-01T00:00:00Z``), JSON columns as their
serialised text. Parquet: strings, ``decimal128(38, s)`` for the FOCUS decimals (no binary
float in a bill), ``timestamp[s, tz=UTC]``; JSON columns as strings.

pyarrow is imported only here and only for Parquet: ``pip install 'gputally[parquet]'``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from .errors import UsageError
from .focus import COLUMNS, format_datetime

__all__ = ["PARQUET_MISSING", "to_csv", "write_parquet"]

PARQUET_MISSING = ("--format focus-parquet needs pyarrow, which is not installed: pip install 'gputally[parquet]' "
                   "(or pyarrow), or use --format focus for CSV")


def _text(value: Any, kind: str) -> str:
    if value is None:
        return ""
    if kind == "datetime":
        return format_datetime(float(value))
    if isinstance(value, Decimal):
        return format(value, "f")
    return str(value)


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([c.name for c in COLUMNS])
    for row in rows:
        writer.writerow([_text(row.get(c.name), c.type) for c in COLUMNS])
    return out.getvalue()


def _scale(rows: Sequence[dict[str, Any]], name: str) -> int:
    """The most decimals any value of the column has (at least 0, at most 18)."""
    most = 0
    for row in rows:
        value = row.get(name)
        if isinstance(value, Decimal):
            exponent = value.as_tuple().exponent
            if isinstance(exponent, int):
                most = max(most, -exponent)
    return min(most, 18)


def write_parquet(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Write ``rows`` to ``path`` as one Parquet file. Raises `UsageError` without pyarrow."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(PARQUET_MISSING) from None
    fields = []
    arrays = []
    for column in COLUMNS:
        values = [row.get(column.name) for row in rows]
        if column.type == "decimal":
            kind = pa.decimal128(38, _scale(rows, column.name))
        elif column.type == "datetime":
            kind = pa.timestamp("s", tz="UTC")
            values = [None if v is None else int(v) for v in values]
        else:
            kind = pa.string()
        fields.append(pa.field(column.name, kind, nullable=True))
        arrays.append(pa.array(values, type=kind))
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    try:
        pq.write_table(table, str(path))
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc}") from exc

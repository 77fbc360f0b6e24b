"""Parsers of hl-smi's text output: the CSV query, the row-replacement view and the summary's
process table. Pure functions, run the same on a live snapshot and on a recording.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping

from gputally.probes.snapshot.source import number

__all__ = [
    "MEMORY_UNITS", "QUERY_FIELDS", "Row", "cell_bytes", "cell_hz", "cell_number", "cell_text",
    "parse_csv", "parse_processes", "parse_rows",
]

QUERY_FIELDS: tuple[str, ...] = (
    "timestamp", "index", "module_id", "name", "bus_id", "uuid", "serial", "driver_version",
    "memory.total", "memory.used", "memory.free", "power.draw", "power.max",
    "temperature.aip", "utilization.aip", "clocks.current.soc", "clocks.max.soc",
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
)
"""Asked of hl-smi each cycle; ones an hl-smi version rejects are dropped (see :class:`HlSmiSource`)."""


MEMORY_UNITS = {"b": 1, "kib": 1024, "kb": 1024, "mib": 1024**2, "mb": 1024**2, "gib": 1024**3, "gb": 1024**3}
Row = Mapping[str, tuple[str, str | None]]
"""One device's row of the CSV query: ``{field: (raw value, unit)}``."""


def _header(cell: str) -> tuple[str, str | None]:
    cell = cell.strip()
    match = re.match(r"^(.*?)\s*\[(.*)\]\s*$", cell)
    if match:
        return match.group(1).strip(), match.group(2).strip()
    return cell, None


def parse_csv(text: str) -> list[dict[str, tuple[str, str | None]]]:
    """Rows of ``hl-smi -Q ... -f csv``: ``{field: (raw value, unit)}``; the unit comes from the
    header (``memory.used [MiB]``) or the value (``1024 MiB``). Blank lines and rows with too
    few cells are tolerated; a row without a header is read against :data:`QUERY_FIELDS`."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True))
    first = [c.strip() for c in rows[0]]
    has_header = any(_header(c)[0] in QUERY_FIELDS or _header(c)[0] == "name" for c in first)
    if has_header:
        columns = [_header(c) for c in first]
        body = rows[1:]
    else:
        columns = [(f, None) for f in QUERY_FIELDS]
        body = rows
    out = []
    for row in body:
        entry: dict[str, tuple[str, str | None]] = {}
        for (name, unit), cell in zip(columns, row, strict=False):
            value = cell.strip()
            parts = value.split()
            if unit is None and len(parts) == 2 and number(parts[0]) is not None:
                unit = parts[1]
            entry[name] = (value, unit)
        if entry:
            out.append(entry)
    return out


def cell_number(row: Row, key: str) -> float | int | None:
    return number(row[key][0]) if key in row else None


def cell_text(row: Row, key: str) -> str | None:
    value = row[key][0].strip() if key in row else ""
    return None if not value or value.strip("[]").upper() in ("N/A", "NA", "NOT SUPPORTED") else value


def cell_bytes(row: Row, key: str) -> int | None:
    value = cell_number(row, key)
    if value is None:
        return None
    unit = (row[key][1] or "MiB").lower()  # hl-smi reports memory in MiB
    return int(value * MEMORY_UNITS.get(unit, 1024**2))


def cell_hz(row: Row, key: str) -> float | int | None:
    value = cell_number(row, key)
    if value is None:
        return None
    unit = (row[key][1] or "MHz").lower()
    return value * {"hz": 1, "khz": 1_000, "mhz": 1_000_000, "ghz": 1_000_000_000}.get(unit, 1_000_000)


_ROWS_HEADER = re.compile(r"([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F])")


def parse_rows(text: str) -> dict[str, dict[str, int]]:
    """``{bus_id: {"replaced": n, "pending": n}}`` from ``hl-smi -q -d ROW_REPLACEMENT`` (lines
    after a bus id, ``... Replaced ... : N`` and ``... Pending ... : N``)."""
    out: dict[str, dict[str, int]] = {}
    current: str | None = None
    for line in text.splitlines():
        found = _ROWS_HEADER.search(line)
        if found:  # a device's block begins (its PCI address); counter lines carry none
            current = found.group(1).lower()
            continue
        if current is None or ":" not in line:
            continue
        label, _, value = line.rpartition(":")
        amount = number(value)
        if amount is None:
            continue
        lowered = label.lower()
        if "pending" in lowered:
            out.setdefault(current, {})["pending"] = int(amount)
        elif "replaced" in lowered:
            out.setdefault(current, {})["replaced"] = int(amount)
    return out


_PROCESS_ROW = re.compile(
    r"^\|\s*(?P<aip>\d+)\s+(?P<pid>\d+)\s+(?P<type>\S+)\s+(?P<name>.*?)\s+(?P<mem>\d+)\s*(?P<unit>[KMG]i?B)?\s*\|\s*$"
)


def parse_processes(text: str) -> list[tuple[int, int, int | None]]:
    """``(aip, pid, memory_bytes)`` from the "Compute Processes" table of ``hl-smi``'s summary.
    Rows of ``N/A`` (no process) and anything outside that table are ignored."""
    out: list[tuple[int, int, int | None]] = []
    inside = False
    for line in text.splitlines():
        if "Compute Processes" in line or "Processes:" in line:
            inside = True
            continue
        if not inside:
            continue
        match = _PROCESS_ROW.match(line.strip())
        if match:
            unit = (match.group("unit") or "MiB").lower()
            out.append((int(match.group("aip")), int(match.group("pid")),
                        int(match.group("mem")) * MEMORY_UNITS.get(unit, 1024**2)))
    return out

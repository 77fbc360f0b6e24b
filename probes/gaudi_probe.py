"""``gputally probe gaudi``: Intel Gaudi accelerators through ``hl-smi``, on the NVIDIA probe's metric model.

The live source runs ``hl-smi`` as fixed argument lists (never a shell), each with a timeout:

* ``hl-smi -Q <fields> -f csv`` for the device readings; the header row names the columns,
  so a column an older hl-smi lacks is simply absent, and a field it rejects ("invalid field")
  is dropped from the query for the rest of the run;
* ``hl-smi -q -d ROW_REPLACEMENT`` for rows replaced / pending;
* ``hl-smi`` (the summary table) for the compute processes and their memory.

Per-port network counters of the integrated RoCE NIC ports do not come from hl-smi (its NET view
has no documented machine-readable form) but from the kernel's netdev sysfs, a documented ABI
(:mod:`~gputally.probes.gaudi_nic`): each port under a Gaudi's PCI device sends ``hw.gpu.io``
(bytes, receive/transmit), ``gputally.gpu.link.packets``, ``hw.errors`` (error.type receive,
transmit, receive_dropped, transmit_dropped), ``gputally.gpu.link.up`` (1 while operstate is up)
and ``gputally.gpu.link.speed`` (bit/s; absent while unreadable), each with
``gputally.gpu.link`` = ``port<dev_port>`` and ``network.interface.name``.

A snapshot keeps the raw text (and exit status) of each command, and the raw text of each
sysfs file: that is the recording format (``tests/fixtures/gaudi/README.md``), so the parsers
run the same on replay.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gputally.probes import catalog as m
from gputally.probes import gaudi_nic
from gputally.probes.model import AttrValue, Point
from gputally.probes.vendor_common import DeviceReading, ProcessUse, VendorUnavailable, number

__all__ = ["FORMAT", "QUERY_FIELDS", "HlSmiSource", "map_gaudi", "parse_csv", "parse_processes", "parse_rows"]

log = logging.getLogger(__name__)

FORMAT = "gputally-hlsmi-recording/1"
"""Snapshots ``{"query", "rows"?, "processes"?, "nic"?}``; ``nic`` (netdev sysfs records) is an
optional extension, so recordings made before it replay unchanged, without port metrics."""
VENDOR = "Intel"
QUERY_FIELDS: tuple[str, ...] = (
    "timestamp", "index", "module_id", "name", "bus_id", "uuid", "serial", "driver_version",
    "memory.total", "memory.used", "memory.free", "power.draw", "power.max",
    "temperature.aip", "utilization.aip", "clocks.current.soc", "clocks.max.soc",
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
)
"""Asked of hl-smi each cycle; ones an hl-smi version rejects are dropped (see :class:`HlSmiSource`)."""

_MEMORY_UNITS = {"b": 1, "kib": 1024, "kb": 1024, "mib": 1024**2, "mb": 1024**2, "gib": 1024**3, "gb": 1024**3}
Run = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]


def _run(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603


class HlSmiSource:
    """The live source. ``run`` is injectable for tests; it gets the argument list and a timeout.
    ``sys_root`` is where sysfs is mounted (the NIC ports' netdevs are read under it)."""

    def __init__(self, *, binary: str = "hl-smi", timeout_s: float = 4.0, run: Run | None = None,
                 sys_root: str = "/sys") -> None:
        self._binary = binary
        self._timeout = timeout_s
        self._run = run or _run
        self._sys_root = sys_root
        self._path: str | None = None
        self.fields: list[str] = list(QUERY_FIELDS)

    def open(self) -> dict[str, Any]:
        self._path = self._binary if "/" in self._binary else shutil.which(self._binary)
        if self._path is None:
            raise VendorUnavailable(f"{self._binary} not found on PATH: install the Intel Gaudi driver tools (habanalabs)")
        return {}

    def _command(self, argv: list[str]) -> dict[str, Any]:
        try:
            done = self._run(argv, self._timeout)
        except subprocess.TimeoutExpired:
            return {"argv": argv[1:], "error": f"hl-smi timed out after {self._timeout:g} s"}
        except FileNotFoundError:
            return {"argv": argv[1:], "error": f"{argv[0]} not found"}
        except OSError as exc:
            return {"argv": argv[1:], "error": f"cannot run {argv[0]}: {exc}"}
        return {"argv": argv[1:], "returncode": done.returncode, "stdout": done.stdout or "", "stderr": done.stderr or ""}

    def snapshot(self) -> dict[str, Any]:
        assert self._path is not None
        query = self._command([self._path, "-Q", ",".join(self.fields), "-f", "csv"])
        rejected = _rejected_fields(query, self.fields)
        if rejected:
            log.warning("hl-smi does not know the field(s) %s; asking without them", ", ".join(rejected))
            self.fields = [f for f in self.fields if f not in rejected]
            query = self._command([self._path, "-Q", ",".join(self.fields), "-f", "csv"])
        snap: dict[str, Any] = {"query": query}
        if "error" not in query and query.get("returncode") == 0:
            snap["rows"] = self._command([self._path, "-q", "-d", "ROW_REPLACEMENT"])
            snap["processes"] = self._command([self._path])
            snap["nic"] = self._netdevs()
        return snap

    def _netdevs(self) -> dict[str, Any]:
        try:
            return gaudi_nic.read_netdevs(self._sys_root)
        except Exception as exc:  # the NIC ports are extra: a bug here must not lose the hl-smi readings
            return {"error": f"reading netdev sysfs failed: {exc!r}"}

    def close(self) -> None:
        pass


def _rejected_fields(result: Mapping[str, Any], fields: Sequence[str]) -> list[str]:
    if result.get("returncode") in (0, None):
        return []
    text = f"{result.get('stderr', '')}\n{result.get('stdout', '')}".lower()
    if "field" not in text and "invalid" not in text:
        return []
    return [f for f in fields if f.lower() in text and f not in ("timestamp", "name", "bus_id", "uuid")]


# -- parsing ---------------------------------------------------------------------------------

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


def _num(row: Mapping[str, tuple[str, str | None]], key: str) -> float | int | None:
    return number(row[key][0]) if key in row else None


def _text(row: Mapping[str, tuple[str, str | None]], key: str) -> str | None:
    value = row[key][0].strip() if key in row else ""
    return None if not value or value.strip("[]").upper() in ("N/A", "NA", "NOT SUPPORTED") else value


def _bytes(row: Mapping[str, tuple[str, str | None]], key: str) -> int | None:
    value = _num(row, key)
    if value is None:
        return None
    unit = (row[key][1] or "MiB").lower()  # hl-smi reports memory in MiB
    return int(value * _MEMORY_UNITS.get(unit, 1024**2))


def _hz(row: Mapping[str, tuple[str, str | None]], key: str) -> float | int | None:
    value = _num(row, key)
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
    out = []
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
                        int(match.group("mem")) * _MEMORY_UNITS.get(unit, 1024**2)))
    return out


# -- mapping ---------------------------------------------------------------------------------

def _failure(result: Any, what: str) -> str | None:
    if not isinstance(result, Mapping):
        return f"{what}: no output recorded"
    if "error" in result:
        return str(result["error"])
    if result.get("returncode") not in (0, None):
        detail = (result.get("stderr") or result.get("stdout") or "").strip().splitlines()
        return f"{what} exited with status {result['returncode']}" + (f": {detail[0]}" if detail else "")
    return None


def map_gaudi(snapshot: Mapping[str, Any], driver: Mapping[str, Any]) -> list[DeviceReading]:
    """One snapshot -> one device per Gaudi. Raises VendorUnavailable when the query itself failed."""
    query = snapshot.get("query")
    problem = _failure(query, "hl-smi -Q")
    if problem is not None:
        raise VendorUnavailable(problem)
    assert isinstance(query, Mapping)
    rows = parse_csv(query.get("stdout", ""))
    if not rows:
        raise VendorUnavailable("hl-smi lists no Gaudi devices")
    replaced = parse_rows(snapshot["rows"].get("stdout", "")) if _failure(snapshot.get("rows"), "") is None else {}
    processes = parse_processes(snapshot["processes"].get("stdout", "")) if _failure(snapshot.get("processes"), "") is None else []
    ports = gaudi_nic.assign(snapshot.get("nic"), [b for b in (_text(row, "bus_id") for row in rows) if b])
    out = []
    for position, row in enumerate(rows):
        index = _num(row, "index")
        index = int(index) if index is not None else position
        uuid = _text(row, "uuid")
        bus = _text(row, "bus_id")
        serial = _text(row, "serial")
        hw_id = uuid or (f"gaudi-{serial}" if serial else f"gaudi-{bus or index}")
        attributes: dict[str, AttrValue] = {
            "hw.id": hw_id, "hw.type": "gpu", "hw.vendor": VENDOR, "hw.name": f"accel{index}",
            "gputally.gpu.index": index,
        }
        optional = {
            "hw.model": _text(row, "name"),
            "hw.serial_number": serial,
            "hw.driver_version": _text(row, "driver_version"),
            "gputally.gpu.pci.bus_id": bus.lower() if bus else None,
            "gputally.gpu.module_id": int(_num(row, "module_id")) if _num(row, "module_id") is not None else None,  # type: ignore[arg-type]
        }
        attributes.update({k: v for k, v in optional.items() if v is not None})
        points: list[Point] = []

        def add(metric: Any, value: Any, attrs: tuple[tuple[str, AttrValue], ...] = ()) -> None:
            if value is not None:
                points.append(Point(metric, value, attrs))  # noqa: B023 - used in this iteration only

        utilization = _num(row, "utilization.aip")
        add(m.GPU_UTILIZATION, min(max(utilization / 100.0, 0.0), 1.0) if utilization is not None else None,
            (("hw.gpu.task", "general"),))
        used, total = _bytes(row, "memory.used"), _bytes(row, "memory.total")
        add(m.GPU_MEMORY_USAGE, used)
        add(m.GPU_MEMORY_LIMIT, total)
        if used is not None and total:
            add(m.GPU_MEMORY_UTILIZATION, used / total)
        power = _num(row, "power.draw")
        add(m.POWER, float(power) if power is not None else None)
        cap = _num(row, "power.max")
        add(m.POWER_LIMIT, float(cap) if cap is not None else None, (("gputally.gpu.power.limit_type", "enforced"),))
        add(m.TEMPERATURE, _num(row, "temperature.aip"), (("hw.sensor_location", "gpu"),))
        add(m.CLOCK, _hz(row, "clocks.current.soc"), (("gputally.gpu.clock.type", "soc"),))
        add(m.CLOCK_LIMIT, _hz(row, "clocks.max.soc"), (("gputally.gpu.clock.type", "soc"),))
        corrected = _num(row, "ecc.errors.corrected.volatile.total")
        uncorrected = _num(row, "ecc.errors.uncorrected.volatile.total")
        add(m.ERRORS, corrected, (("error.type", "ecc_corrected"),))
        add(m.ERRORS, uncorrected, (("error.type", "ecc_uncorrected"),))
        add(m.PCIE_GENERATION, _num(row, "pcie.link.gen.current"))
        add(m.PCIE_GENERATION_LIMIT, _num(row, "pcie.link.gen.max"))
        add(m.PCIE_WIDTH, _num(row, "pcie.link.width.current"))
        add(m.PCIE_WIDTH_LIMIT, _num(row, "pcie.link.width.max"))
        remap = replaced.get(bus.lower()) if bus else None
        pending = False
        if remap:
            add(m.REMAPPED_ROWS, remap.get("replaced"), (("gputally.gpu.memory.remap_cause", "any"),))
            if "pending" in remap:
                pending = remap["pending"] > 0
                add(m.REMAP_PENDING, int(pending))
        port_points, port_body = gaudi_nic.port_points(ports.get(bus, []) if bus else [])
        points.extend(port_points)
        device = DeviceReading(
            hw_id=hw_id, attributes=attributes, points=points,
            label=f"{index} ({attributes.get('hw.model', hw_id)})",
            processes=[ProcessUse(pid, mem) for aip, pid, mem in processes if aip == index],
            body={"index": index, "uuid": hw_id, "query": {k: v for k, (v, _) in row.items()},
                  "rows": remap or {}, "processes": [{"pid": p, "memory": mb} for a, p, mb in processes if a == index]},
        )
        if port_body:
            device.body["nic"] = port_body
        if (uncorrected or 0) > 0 or pending:
            device.state = "degraded"
        out.append(device)
    for what in ("rows", "processes"):
        issue = _failure(snapshot.get(what), f"hl-smi {what}") if what in snapshot else None
        if issue and out:
            out[0].problems.append(issue)
    nic = snapshot.get("nic")
    if isinstance(nic, Mapping) and nic.get("error") and out:
        out[0].problems.append(f"NIC ports: {nic['error']}")
    return out

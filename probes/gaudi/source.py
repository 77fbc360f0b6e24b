"""The live Gaudi source: ``hl-smi`` run as fixed argument lists (never a shell), each with a timeout.

* ``hl-smi -Q <fields> -f csv`` for the device readings; the header row names the columns,
  so a column an older hl-smi lacks is simply absent, and a field it rejects ("invalid field")
  is dropped from the query for the rest of the run;
* ``hl-smi -q -d ROW_REPLACEMENT`` for rows replaced / pending;
* ``hl-smi`` (the summary table) for the compute processes and their memory;
* the NIC ports' netdev sysfs (:mod:`~gputally.probes.gaudi.nic`).

A snapshot keeps the raw text (and exit status) of each command, and the raw text of each
sysfs file: that is the recording format (``tests/fixtures/gaudi/README.md``), so the parsers
(:mod:`~gputally.probes.gaudi.parse`) run the same on replay.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gputally.probes.gaudi import nic as gaudi_nic
from gputally.probes.gaudi.parse import QUERY_FIELDS
from gputally.probes.snapshot.source import VendorUnavailable

__all__ = ["FORMAT", "HlSmiSource"]

log = logging.getLogger(__name__)

FORMAT = "gputally-hlsmi-recording/1"
"""Snapshots ``{"query", "rows"?, "processes"?, "nic"?}``; ``nic`` (netdev sysfs records) is an
optional extension, so recordings made before it replay unchanged, without port metrics."""
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
        self.sys_root = sys_root
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
            return gaudi_nic.read_netdevs(self.sys_root)
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

"""Cgroups of processes the probe sent without a cgroup hint, read from ``/proc`` in the background.

``process`` never touches the file system: a pid it has not seen is queued and answered
as pending; a background task reads ``<proc_root>/<pid>/cgroup`` and ``stat`` in a thread,
and the next batch finds the answer. Answers are cached per (pid, start time), so a reused
pid never inherits the previous owner: the start time comes from the probe's
``process.creation.time`` when sent, else from ``stat`` (then checked again on every
refresh, since a lookup by pid alone cannot tell a reused pid apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gputally.cgroup.parse import CgroupInfo, parse_cgroup
from gputally.kubelet.health import Problems

__all__ = ["PENDING", "ProcCgroups", "read_process"]

log = logging.getLogger(__name__)

PENDING: Final = "pending"
"""Answer of :meth:`ProcCgroups.lookup` while the read is queued."""

Key = tuple[int, str | None]


@dataclass(slots=True)
class _Entry:
    info: CgroupInfo | None
    """None: the process could not be read (gone, or not visible from here)."""
    start_ticks: int | None
    used: float


def read_process(root: Path, pid: int) -> tuple[str, int | None] | None:
    """``(cgroup text, start time in clock ticks)`` of ``pid``, or None when it cannot be read. Blocking."""
    base = root / str(pid)
    try:
        cgroup = (base / "cgroup").read_text()
        stat = (base / "stat").read_text()
    except OSError:
        return None
    close = stat.rfind(")")
    fields = stat[close + 2 :].split() if close >= 0 else []
    try:
        start = int(fields[19])  # field 22; fields[0] is field 3
    except (IndexError, ValueError):
        start = None
    return cgroup, start


class ProcCgroups:
    """(pid, start time) -> what the process's cgroup says, filled by :meth:`run`."""

    def __init__(
        self,
        root: Path,
        *,
        problems: Problems,
        refresh_interval: float = 5.0,
        ttl: float = 600.0,
        max_entries: int = 65536,
        clock: Callable[[], float] = time.monotonic,
        read: Callable[[Path, int], tuple[str, int | None] | None] = read_process,
    ) -> None:
        self.root = root
        self._problems = problems
        self._refresh = refresh_interval
        self._ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._read = read
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self._pending: set[Key] = set()
        self._wake = asyncio.Event()

    def lookup(self, pid: int, start: str | None) -> CgroupInfo | str | None:
        """The cached answer, None (unreadable), or :data:`PENDING` (queued for the next read)."""
        key = (pid, start)
        entry = self._entries.get(key)
        if entry is not None:
            entry.used = self._clock()
            return entry.info
        if key not in self._pending and len(self._pending) < self._max:
            self._pending.add(key)
            self._wake.set()
        return PENDING

    def __len__(self) -> int:
        return len(self._entries)

    async def run(self) -> None:
        """Read queued pids at once, re-check start-time-less entries every refresh, until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancel
                async with asyncio.timeout(self._refresh):
                    await self._wake.wait()
            self._wake.clear()
            await self.read_once()

    async def read_once(self) -> None:
        """One pass: read queued pids, drop answers whose pid was reused, forget unused ones."""
        pending, self._pending = self._pending, set()
        recheck = [key for key, entry in self._entries.items() if key[1] is None and entry.info is not None]
        keys = [*pending, *recheck]
        if keys:
            results = await asyncio.to_thread(self._read_all, keys)
            if all(info is None for info, _ in results.values()) and not self.root.joinpath("self").exists():
                self._problems.report(
                    "proc", "missing", f"proc_root {self.root} is not a /proc mount; no cgroups for pid-only processes"
                )
            else:
                self._problems.clear("proc")
            now = self._clock()
            for key, (info, start) in results.items():
                entry = self._entries.get(key)
                if entry is not None and start != entry.start_ticks:
                    del self._entries[key]  # the pid was reused: read afresh when next seen
                elif key in pending:
                    self._entries[key] = _Entry(info, start, now)
        self._expire(self._clock())

    def _read_all(self, keys: list[Key]) -> dict[Key, tuple[CgroupInfo | None, int | None]]:
        results: dict[Key, tuple[CgroupInfo | None, int | None]] = {}
        for key in keys:
            found = self._read(self.root, key[0])
            results[key] = (None, None) if found is None else (parse_cgroup(found[0]), found[1])
        return results

    def _expire(self, now: float) -> None:
        stale = [key for key, entry in self._entries.items() if now - entry.used > self._ttl]
        for key in stale:
            del self._entries[key]
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

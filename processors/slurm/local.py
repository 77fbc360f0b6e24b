"""PID -> job on the node itself, for processes whose resource carries no cgroup hint (or a
non-Slurm one, as under ``proctrack/linuxproc``): ``/proc/PID/cgroup`` first, then
``SLURM_JOB_ID`` from ``/proc/PID/environ``.

Reads happen in a background task (in a thread), never in ``process``: the first batch of a
new process goes out unattributed, the next ones carry the answer. Answers are kept per
``(pid, start time)``, so a reused PID is not mistaken for the old process.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gputally.cgroup.parse import parse_cgroup

from .environ import read_slurm_environ

__all__ = ["Found", "LocalProcesses"]

Source = Literal["cgroup", "environ", "gres"]


@dataclass(frozen=True, slots=True)
class Found:
    """How a resource was tied to a job."""

    job_id: int
    step: str | None
    uid: int | None
    source: Source


Key = tuple[int, str | None]


class LocalProcesses:
    """Answers from this node's /proc, looked up in the background; see the module docstring."""

    def __init__(
        self,
        proc_root: Path,
        *,
        ttl: float,
        max_entries: int,
        on_found: Callable[[int], object] = lambda job_id: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = proc_root
        self._on_found = on_found
        self._ttl = ttl
        self._max_entries = max_entries
        self._clock = clock
        self._answers: OrderedDict[Key, tuple[Found | None, float]] = OrderedDict()
        self._pending: dict[Key, None] = {}
        self._wake = asyncio.Event()
        self._busy = False
        self.generation = 0
        """Grows whenever answers arrive (see :attr:`JobCache.generation`)."""

    def lookup(self, pid: int, start: str | None) -> Found | None:
        """The job of process ``pid`` (started at ``start``), if known; queues a read if not."""
        key = (pid, start)
        answer = self._answers.get(key)
        if answer is not None and self._clock() - answer[1] < self._ttl:
            return answer[0]
        if key not in self._pending and len(self._pending) < self._max_entries:
            self._pending[key] = None
            self._wake.set()
        return answer[0] if answer is not None else None

    async def run(self) -> None:
        while True:
            self._wake.clear()
            if not self._pending:
                await self._wake.wait()
            keys = list(self._pending)
            self._busy = True
            try:
                answers = await asyncio.to_thread(self._read_all, keys)
                now = self._clock()
                self.generation += 1
                for key, found in zip(keys, answers, strict=True):
                    self._pending.pop(key, None)
                    self._answers[key] = (found, now)
                    self._answers.move_to_end(key)
                    if found is not None:
                        self._on_found(found.job_id)  # start the job's lookup before the next batch asks
                while len(self._answers) > self._max_entries:
                    self._answers.popitem(last=False)
            finally:
                self._busy = False

    async def settle(self) -> None:
        """Return once every read asked for so far is done (for tests)."""
        while self._pending or self._busy:
            await asyncio.sleep(0.005)

    def _read_all(self, keys: list[Key]) -> list[Found | None]:
        return [self.read(pid) for pid, _ in keys]

    def read(self, pid: int) -> Found | None:
        """Look ``pid`` up now (blocking file reads)."""
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text()
        except OSError:
            text = ""
        info = parse_cgroup(text)
        if info.kind == "slurm" and info.slurm_job_id is not None:
            return Found(info.slurm_job_id, info.slurm_step, info.slurm_uid, "cgroup")
        from_environ = read_slurm_environ(self.proc_root, pid)
        if from_environ is not None:
            return Found(from_environ[0], from_environ[1], None, "environ")
        return None

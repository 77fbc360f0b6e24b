"""The bounded sending queue in memory: batches wait here while the backend is slow or away.

The bound counts batches waiting, not those being sent. ``put`` refuses instead of waiting,
so a full queue turns into backpressure on the sender (``Refused``), never into unbounded
memory. A consumer takes the oldest batch (``get``) and, to send several as one request,
the batches of the same signal queued right behind it (``following``), within a count and a
byte size. :class:`~gputally.exporterhelper.persistent_queue.PersistentQueue` keeps the same queue
on disk.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gputally.otlp.batch import Batch, Signal

__all__ = ["Entry", "MemoryQueue"]


@dataclass(eq=False)
class Entry:
    """One queued batch. A batch found on disk at start is read back only when it is sent."""

    signal: Signal
    items: int
    batch: Batch | None = None
    path: Path | None = None
    size: int | None = None
    """The encoding's bytes when known without encoding (a file's size); else from ``batch``."""

    def request_bytes(self) -> int:
        """The size of the batch's encoding: what it adds to a request."""
        if self.size is None:
            assert self.batch is not None
            self.size = len(self.batch.serialize())
        return self.size


class MemoryQueue:
    """FIFO of at most ``capacity`` waiting batches, shared by several consumers."""

    def __init__(self, capacity: int, *, on_size: Callable[[int], None] = lambda size: None) -> None:
        self.capacity = capacity
        self._entries: deque[Entry] = deque()
        self._reserved = 0
        self._closed = False
        self._changed = asyncio.Condition()
        self._on_size = on_size

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def location(self) -> str:
        """Where the queue lives, for log lines."""
        return "memory"

    async def open(self) -> None:
        """Prepare storage (nothing to do in memory)."""

    async def put(self, batch: Batch) -> bool:
        """Queue ``batch``; False when the queue is full or closed."""
        if self._closed or len(self._entries) + self._reserved >= self.capacity:
            return False
        self._reserved += 1
        try:
            entry = await self._store(batch)
        finally:
            self._reserved -= 1
        async with self._changed:
            self._entries.append(entry)
            self._changed.notify()
        self._on_size(len(self._entries))
        return True

    async def get(self) -> Entry | None:
        """The oldest waiting batch; None once the queue is closed and empty."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._entries) or self._closed)
            if not self._entries:
                return None
            entry = self._entries.popleft()
        self._on_size(len(self._entries))
        return entry

    def following(self, first: Entry, *, count: int, size: int) -> list[Entry]:
        """Take the batches waiting right behind ``first`` (already taken) that share its signal,
        oldest first, at most ``count`` of them and ``size`` bytes of encoding together; never
        waits. The first batch of another signal ends the run, so each signal stays in order."""
        taken: list[Entry] = []
        entries = self._entries
        while entries and len(taken) < count:
            head = entries[0]
            if head.signal is not first.signal:
                break
            size -= head.request_bytes()
            if size < 0:
                break
            taken.append(entries.popleft())
        if taken:
            self._on_size(len(entries))
        return taken

    async def read(self, entry: Entry) -> Batch:
        """The entry's batch, loaded from storage if need be."""
        assert entry.batch is not None
        return entry.batch

    async def done(self, entry: Entry) -> None:
        """The entry was sent or given up: forget it for good."""

    async def close(self) -> None:
        """Take no more batches; consumers drain what is left and then get None."""
        self._closed = True
        async with self._changed:
            self._changed.notify_all()

    def remaining(self) -> list[Entry]:
        """Take whatever still waits (at shutdown, after the consumers stopped)."""
        left = list(self._entries)
        self._entries.clear()
        self._on_size(0)
        return left

    async def release(self) -> None:
        """Give up storage held while open (nothing in memory)."""

    async def _store(self, batch: Batch) -> Entry:
        return Entry(batch.signal, batch.items, batch)

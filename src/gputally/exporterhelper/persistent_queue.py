"""The sending queue on disk (``sending_queue.storage``): a restart or crash loses nothing queued.

Each batch is one file, written to a temporary name, fsynced and renamed (and the directory
fsynced) before ``put`` returns, so the sender is only acknowledged once the data would
survive a power cut. The file name records order, signal and item count
(``00000000000000000042.metrics.336.otlp``) so a restart rebuilds the queue from a directory
listing and reads each body only when it is sent. A file is removed once its batch was sent or
refused for good; files of batches being sent when the process died are sent again
(at-least-once). A lock file keeps two exporters from sharing one directory.
All file I/O runs in threads.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from gputally.errors import ConfigError
from gputally.exporterhelper.queue import Entry, MemoryQueue
from gputally.otlp.batch import Batch, Signal

__all__ = ["PersistentQueue", "queue_directory"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(\d{20})\.(metrics|logs|traces)\.(\d+)\.otlp$")
_TEMP_SUFFIX = ".tmp"
_LOCK = ".lock"


def queue_directory(storage: Path, exporter_id: str) -> Path:
    """Directory of one exporter's queue: ``otlp/gpu`` becomes ``otlp%2Fgpu``, unambiguously."""
    return storage / quote(exporter_id, safe="")


def _write_durably(directory: Path, name: str, raw: bytes) -> Path:
    final = directory / name
    temp = directory / f".{name}{_TEMP_SUFFIX}"
    with open(temp, "wb") as file:
        file.write(raw)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp, final)
    _fsync_directory(directory)
    return final


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _scan(directory: Path) -> tuple[list[Entry], int]:
    """Entries found on disk, oldest first, and the next sequence number. Temporary files go."""
    found: list[tuple[int, Entry]] = []
    for path in directory.iterdir():
        if path.name.endswith(_TEMP_SUFFIX):
            # Written by a put that never returned: its sender was not acknowledged.
            path.unlink(missing_ok=True)
            continue
        match = _NAME.match(path.name)
        if match is None:
            if path.name != _LOCK:
                log.warning("sending queue %s: ignoring unexpected file %s", directory, path.name)
            continue
        seq, signal, items = match.groups()
        found.append((int(seq), Entry(Signal(signal), int(items), path=path, size=path.stat().st_size)))
    found.sort(key=lambda pair: pair[0])
    next_seq = found[-1][0] + 1 if found else 0
    return [entry for _, entry in found], next_seq


def _lock(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    return fd


class PersistentQueue(MemoryQueue):
    """A :class:`MemoryQueue` whose entries are files in ``directory``."""

    def __init__(
        self, capacity: int, directory: Path, *, on_size: Callable[[int], None] = lambda size: None
    ) -> None:
        super().__init__(capacity, on_size=on_size)
        self.directory = directory
        self._next_seq = 0
        self._lock_fd: int | None = None

    @property
    def location(self) -> str:
        return str(self.directory)

    async def open(self) -> None:
        """Lock the directory and queue what a previous run left in it, oldest first.

        Everything found is queued even beyond ``capacity`` (a smaller queue_size after a
        restart must not lose data); new batches are refused until the queue is below it.
        """
        try:
            self._lock_fd = await asyncio.to_thread(_lock, self.directory)
            entries, self._next_seq = await asyncio.to_thread(_scan, self.directory)
        except BlockingIOError:
            raise ConfigError(f"sending_queue.storage: {self.directory} is in use by another exporter") from None
        except OSError as exc:
            raise ConfigError(f"sending_queue.storage: cannot use {self.directory}: {exc.strerror}") from exc
        if entries:
            log.info(
                "sending queue %s: %d batches (%d items) left by the previous run will be sent",
                self.directory, len(entries), sum(e.items for e in entries),
            )
        self._entries.extend(entries)
        self._on_size(len(self._entries))

    async def read(self, entry: Entry) -> Batch:
        if entry.batch is None:
            assert entry.path is not None
            raw = await asyncio.to_thread(entry.path.read_bytes)
            entry.batch = Batch(entry.signal, raw=raw, items=entry.items)
        return entry.batch

    async def done(self, entry: Entry) -> None:
        if entry.path is not None:
            await asyncio.to_thread(entry.path.unlink, missing_ok=True)

    async def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def _store(self, batch: Batch) -> Entry:
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        name = f"{seq:020d}.{batch.signal.value}.{batch.items}.otlp"
        raw = batch.serialize()
        path = await asyncio.to_thread(_write_durably, self.directory, name, raw)
        return Entry(batch.signal, batch.items, batch, path, len(raw))

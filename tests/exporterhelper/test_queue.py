"""The sending queue in memory and on disk."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gputally.errors import ConfigError
from gputally.exporterhelper.persistent_queue import PersistentQueue, queue_directory
from gputally.exporterhelper.queue import MemoryQueue
from gputally.otlp.batch import Signal

M, L, T = Signal.METRICS, Signal.LOGS, Signal.TRACES


async def test_memory_queue_is_bounded_fifo_and_drains_after_close(make_batch) -> None:
    sizes: list[int] = []
    queue = MemoryQueue(2, on_size=sizes.append)
    first, second = make_batch(tag="1"), make_batch(tag="2")
    assert await queue.put(first) and await queue.put(second)
    assert not await queue.put(make_batch(tag="3"))
    await queue.close()
    assert not await queue.put(make_batch(tag="4"))
    got = [await queue.get(), await queue.get()]
    assert [e.batch for e in got if e] == [first, second]
    assert await queue.get() is None
    assert sizes == [1, 2, 1, 0]


async def test_memory_queue_get_waits_for_put(make_batch) -> None:
    queue = MemoryQueue(5)
    waiter = asyncio.create_task(queue.get())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    batch = make_batch()
    await queue.put(batch)
    entry = await asyncio.wait_for(waiter, 1)
    assert entry is not None and entry.batch is batch


def test_queue_directory_names_are_unambiguous(tmp_path: Path) -> None:
    assert queue_directory(tmp_path, "otlp/gpu") == tmp_path / "otlp%2Fgpu"
    assert queue_directory(tmp_path, "otlp_a/b") != queue_directory(tmp_path, "otlp/a_b")


async def test_persistent_queue_writes_before_put_returns_and_reloads_in_order(tmp_path: Path, make_batch) -> None:
    queue = PersistentQueue(10, tmp_path / "q")
    await queue.open()
    batches = [make_batch(M, items=2, tag="m"), make_batch(L, items=3, tag="l"), make_batch(T, items=1, tag="t")]
    for batch in batches:
        assert await queue.put(batch)
    names = sorted(p.name for p in (tmp_path / "q").glob("*.otlp"))
    assert names == [
        "00000000000000000000.metrics.2.otlp",
        "00000000000000000001.logs.3.otlp",
        "00000000000000000002.traces.1.otlp",
    ]
    assert (tmp_path / "q" / names[1]).read_bytes() == batches[1].serialize()
    sent = await queue.get()
    assert sent is not None
    await queue.done(sent)
    await queue.release()

    # A "restart": a stray temp file from a crashed write is discarded; the rest come back in order.
    (tmp_path / "q" / ".00000000000000000009.metrics.1.otlp.tmp").write_bytes(b"partial")
    (tmp_path / "q" / "README").write_text("not a batch")
    again = PersistentQueue(10, tmp_path / "q")
    await again.open()
    assert len(again) == 2
    reloaded = [await again.get(), await again.get()]
    assert [(e.signal, e.items) for e in reloaded if e] == [(L, 3), (T, 1)]
    assert [(await again.read(e)).serialize() for e in reloaded if e] == [b.serialize() for b in batches[1:]]
    assert not (tmp_path / "q" / ".00000000000000000009.metrics.1.otlp.tmp").exists()
    assert await again.put(make_batch(tag="new"))
    assert (tmp_path / "q" / "00000000000000000003.metrics.3.otlp").exists()  # numbering continues
    await again.release()


async def test_persistent_queue_keeps_everything_found_even_beyond_capacity(tmp_path: Path, make_batch) -> None:
    big = PersistentQueue(5, tmp_path)
    await big.open()
    for _ in range(4):
        await big.put(make_batch())
    await big.release()
    small = PersistentQueue(2, tmp_path)
    await small.open()
    assert len(small) == 4
    assert not await small.put(make_batch())
    await small.release()


async def test_persistent_queue_directory_is_locked(tmp_path: Path) -> None:
    first = PersistentQueue(5, tmp_path)
    await first.open()
    with pytest.raises(ConfigError, match="in use"):
        await PersistentQueue(5, tmp_path).open()
    await first.release()
    second = PersistentQueue(5, tmp_path)
    await second.open()
    await second.release()


async def test_unusable_storage_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="cannot use"):
        await PersistentQueue(5, tmp_path / "file" / "q").open()

"""The batch processor: size trigger, timeout flush, max-size split, bounds, lifecycle."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gputally.errors import Refused
from gputally.otlp.batch import Batch, Signal
from gputally.otlp.census import census_logs, census_metrics
from gputally.processors.batch import BatchConfig, BatchProcessor, factory
from tests.processors.builders import (
    attributes,
    context,
    logs_batch,
    metric,
    metrics_batch,
    resource_logs,
    resource_metrics,
    resources,
)

TESTDATA = Path(__file__).parent / "testdata"


def processor(signal: Signal = Signal.METRICS, **section: Any) -> BatchProcessor:
    created = factory.create(factory.parse(section), context("batch"), signal)
    assert isinstance(created, BatchProcessor)
    return created


class Requests:
    """Metrics requests whose resources carry a running ``id`` and a chosen number of points."""

    def __init__(self) -> None:
        self._ids = itertools.count()

    def __call__(self, *sizes: int) -> Batch:
        return metrics_batch(
            *(
                resource_metrics({"id": next(self._ids)}, [metric("sum", "s", [{"p": i} for i in range(n)])])
                for n in sizes
            )
        )


def ids(batch: Batch) -> list[int]:
    return [attributes(r)["id"] for r in resources(Batch.decode(batch.signal, batch.serialize()))]


def counted(batch: Batch) -> int:
    """Items by an independent count of the encoding, not the batch's own claim."""
    return census_metrics(batch.serialize()).items


async def drain(proc: BatchProcessor) -> list[Batch]:
    out = []
    while (batch := await proc.flush()) is not None:
        out.append(batch)
    return out


async def test_sends_once_send_batch_size_items_are_held() -> None:
    proc = processor(send_batch_size=10)
    request = Requests()
    first, second, third = request(4), request(2, 2), request(1, 3)
    assert await proc.process(first) is None
    assert await proc.process(second) is None
    assert proc.held_items == 8
    out = await proc.process(third)
    assert out is not None
    assert out.items == counted(out) == 12
    # Untouched batches are joined as they arrived: the bytes are the concatenation.
    assert out.serialize() == first.serialize() + second.serialize() + third.serialize()
    assert ids(out) == [0, 1, 2, 3, 4]
    assert proc.held_items == 0
    assert await proc.flush() is None


async def test_timeout_is_the_flush_interval_and_flush_sends_what_is_held() -> None:
    proc = processor(send_batch_size=100, timeout="1s")
    assert proc.flush_interval == 1.0
    assert await proc.flush() is None
    request = Requests()
    assert await proc.process(request(3)) is None
    assert await proc.process(request(4)) is None
    out = await proc.flush()
    assert out is not None and out.items == counted(out) == 7
    assert ids(out) == [0, 1]
    assert await proc.flush() is None


async def test_the_default_timeout_is_200ms() -> None:
    assert processor().flush_interval == pytest.approx(0.2)


@pytest.mark.parametrize("section", [{"timeout": 0}, {"send_batch_size": 0}])
async def test_zero_timeout_or_size_sends_every_request_at_once(section: dict[str, Any]) -> None:
    proc = processor(**section)
    request = Requests()
    for _ in range(3):
        batch = request(2)
        assert await proc.process(batch) is batch
    assert proc.flush_interval == (None if section.get("timeout") == 0 else pytest.approx(0.2))
    assert proc.held_items == 0


async def test_a_large_request_is_split_between_resources() -> None:
    proc = processor(send_batch_size=10, send_batch_max_size=10)
    request = Requests()
    # ids 0..5 with 4, 4, 3, 12 (more than the max: alone), 5, 5 points.
    big, small, medium = request(4, 4, 3, 12, 5, 5), request(1), request(2, 2)
    first = await proc.process(big)
    assert first is not None
    sent = [first]
    assert proc.held_items == 25  # more than a full batch waits: each call hands on one
    with pytest.raises(Refused) as refused:  # 4 items in for 3 out would grow the hold
        await proc.process(medium)
    assert refused.value.retry_after == pytest.approx(0.2)
    assert proc.held_items == 25
    for request_in in (small, medium):  # each taken in exchange for a waiting batch
        out = await proc.process(request_in)
        assert out is not None and out.items >= request_in.items
        sent.append(out)
    sent += await drain(proc)
    assert [ids(b) for b in sent] == [[0, 1], [2], [3], [4, 5], [6, 7, 8]]
    assert [b.items for b in sent] == [counted(b) for b in sent] == [8, 3, 12, 10, 5]


async def test_with_timeout_0_a_timer_still_drains_cut_requests() -> None:
    proc = processor(timeout=0, send_batch_size=5, send_batch_max_size=5)
    assert proc.flush_interval == pytest.approx(0.2)
    request = Requests()
    out = await proc.process(request(3, 3, 3))
    assert out is not None and ids(out) == [0]
    assert [ids(b) for b in await drain(proc)] == [[1], [2]]


async def test_a_send_is_filled_up_to_the_max_from_the_next_request() -> None:
    proc = processor(send_batch_size=10, send_batch_max_size=10)
    request = Requests()
    assert await proc.process(request(3, 3)) is None
    out = await proc.process(request(3, 3))
    assert out is not None
    assert ids(out) == [0, 1, 2] and out.items == counted(out) == 9
    assert proc.held_items == 3
    rest = await proc.flush()
    assert rest is not None and ids(rest) == [3] and rest.items == 3


async def test_a_batch_that_overstates_its_items_is_still_sent_whole() -> None:
    # A count from upstream that disagrees with the encoding must not strand or repeat data.
    proc = processor(send_batch_size=10, send_batch_max_size=10)
    request = Requests()
    assert await proc.process(request(6)) is None
    honest = request(2, 2)
    inflated = Batch(Signal.METRICS, raw=honest.serialize(), items=9)
    out = await proc.process(inflated)
    assert out is not None and ids(out) == [0, 1, 2]
    assert proc.held_items == 0
    assert await proc.flush() is None


async def test_logs_are_batched_too() -> None:
    proc = processor(Signal.LOGS, send_batch_size=3, send_batch_max_size=3)
    first = logs_batch(resource_logs({"id": 0}, [{}, {}]))
    second = logs_batch(resource_logs({"id": 1}, [{}]), resource_logs({"id": 2}, [{}, {}]))
    assert await proc.process(first) is None
    out = await proc.process(second)
    assert out is not None and census_logs(out.serialize()).items == out.items == 3
    rest = await proc.flush()
    assert rest is not None and rest.items == 2 and rest.signal is Signal.LOGS


@settings(max_examples=100, deadline=None)
@given(
    requests=st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=5), min_size=1, max_size=12),
    send_batch_size=st.integers(0, 20),
    extra=st.integers(0, 10),
    limited=st.booleans(),
    flush_every=st.integers(1, 4),
)
async def test_nothing_is_lost_duplicated_reordered_or_oversized(
    requests: list[list[int]], send_batch_size: int, extra: int, limited: bool, flush_every: int
) -> None:
    maximum = max(send_batch_size, 1) + extra if limited else 0
    proc = processor(send_batch_size=send_batch_size, send_batch_max_size=maximum)
    request = Requests()
    sizes: list[int] = []
    sent: list[Batch] = []
    largest = 0
    for n, resource_sizes in enumerate(requests):
        batch = request(*resource_sizes)
        sizes += resource_sizes
        while True:
            try:
                out = await proc.process(batch)
                break
            except Refused:  # the timer flushes, then the sender retries
                assert maximum and proc.held_items >= max(send_batch_size, maximum)
                sent += [b for b in [await proc.flush()] if b is not None]
        if out is not None:
            sent.append(out)
        # Bounded: less than one full batch plus one request.
        largest = max(largest, batch.items)
        assert proc.held_items < max(send_batch_size, maximum, 1) + largest
        if n % flush_every == 0:
            sent += [b for b in [await proc.flush()] if b is not None]
    sent += await drain(proc)
    assert proc.held_items == 0
    assert [i for b in sent for i in ids(b)] == list(range(len(sizes)))
    assert [b.items for b in sent] == [counted(b) for b in sent]
    assert sum(b.items for b in sent) == sum(sizes)
    for b in sent:
        if maximum and b.items > maximum:
            assert len(ids(b)) == 1  # only a single resource may exceed the max


# --- config and lifecycle ---------------------------------------------------------------


def test_config_from_yaml() -> None:
    config = factory.parse(yaml.safe_load((TESTDATA / "batch.yaml").read_text()))
    assert config == BatchConfig(send_batch_size=1000, timeout=0.5, send_batch_max_size=2000)


def test_defaults() -> None:
    assert factory.parse(None) == BatchConfig(send_batch_size=8192, timeout=0.2, send_batch_max_size=0)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {"send_batch_size": 100, "send_batch_max_size": 50},
            "send_batch_max_size must be 0 or at least send_batch_size",
        ),
        ({"send_batch_size": -1}, "greater than or equal to 0"),
        ({"timeout": "soon"}, "is not a duration"),
        ({"timout": "1s"}, "Extra inputs are not permitted"),
    ],
)
def test_invalid_config(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        factory.parse(section)


async def test_shutdown_is_safe_before_start_and_twice() -> None:
    proc = processor()
    await proc.shutdown()
    await proc.shutdown()
    assert await proc.flush() is None


async def test_after_shutdown_requests_pass_at_once_and_held_data_stays_for_flush() -> None:
    proc = processor(send_batch_size=100)
    request = Requests()
    await proc.start()
    assert await proc.process(request(2)) is None
    await proc.shutdown()
    assert proc.held_items == 2  # nothing dropped: the pipeline flushes it
    await proc.shutdown()
    out = await proc.process(request(3))
    assert out is not None and out.items == 5 and ids(out) == [0, 1]
    assert await proc.flush() is None

"""The queued exporter over an in-process transport: queue bound, drain, inline mode, counting."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time

import pytest

from gputally.errors import PermanentExportError, Refused, TransientExportError
from gputally.exporterhelper.settings import QueueSettings, RetrySettings
from gputally.exporterhelper.transport import Receipt
from gputally.otlp.batch import Signal
from gputally.telemetry import SelfTelemetry

M, L = Signal.METRICS, Signal.LOGS
FAST_RETRY = RetrySettings(initial_interval=0.01, max_interval=0.02, randomization_factor=0, max_elapsed_time=5)
SLOW_RETRY = RetrySettings(initial_interval=60, max_interval=60, max_elapsed_time=0)


def gauge(telemetry: SelfTelemetry, name: str) -> float | None:
    return telemetry.registry.get_sample_value(name, {"exporter": "otlp/test"})


async def test_full_queue_refuses_and_counts(make_exporter, transport, make_batch, counted, telemetry, eventually,
                                             caplog: pytest.LogCaptureFixture) -> None:
    transport.gate = asyncio.Event()
    exporter = make_exporter(queue=QueueSettings(num_consumers=1, queue_size=2))
    await exporter.start()
    assert gauge(telemetry, "gputally_exporter_queue_capacity") == 2
    await exporter.export(make_batch(items=1))
    await eventually(lambda: transport.attempts == 1)  # taken by the consumer, held in send
    await exporter.export(make_batch(items=2))
    await exporter.export(make_batch(items=3))
    assert gauge(telemetry, "gputally_exporter_queue_size") == 2
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            with pytest.raises(Refused) as refused:
                await exporter.export(make_batch(L, items=5))
    assert refused.value.retry_after == FAST_RETRY.initial_interval
    assert counted("enqueue_failed", "otlp/test", L) == 15
    assert caplog.text.count("sending queue is full") == 1  # logged once a minute, not per batch
    transport.gate.set()
    await eventually(lambda: counted("sent", "otlp/test", M) == 6)
    assert [b.items for b in transport.sent] == [1, 5]  # the two that waited went as one request
    assert gauge(telemetry, "gputally_exporter_queue_size") == 0
    await exporter.shutdown()


async def test_shutdown_drains_the_queue(make_exporter, transport, make_batch, counted) -> None:
    transport.gate = asyncio.Event()
    exporter = make_exporter(queue=QueueSettings(num_consumers=1, queue_size=50), max_request_batches=6)
    await exporter.start()
    batches = [make_batch(items=1, tag=str(n)) for n in range(20)]
    for batch in batches:
        await exporter.export(batch)
    asyncio.get_running_loop().call_later(0.05, transport.gate.set)
    await exporter.shutdown()
    assert [b.items for b in transport.sent] == [6, 6, 6, 2]
    assert b"".join(b.serialize() for b in transport.sent) == b"".join(b.serialize() for b in batches)
    assert counted("sent", "otlp/test", M) == 20
    assert counted("send_failed", "otlp/test", M) == 0
    assert transport.closed and transport.draining


async def test_shutdown_interrupts_retry_and_counts_what_is_left(
    make_exporter, transport, make_batch, counted, eventually, caplog: pytest.LogCaptureFixture
) -> None:
    transport.always = TransientExportError("connection refused")
    exporter = make_exporter(retry=SLOW_RETRY, queue=QueueSettings(num_consumers=2, queue_size=50))
    await exporter.start()
    for _ in range(5):
        await exporter.export(make_batch(items=2))
    await exporter.export(make_batch(L, items=7))
    await eventually(lambda: transport.attempts >= 2)  # both consumers now wait out a 60 s backoff
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        await exporter.shutdown()
    assert time.monotonic() - started < 1.0
    assert counted("send_failed", "otlp/test", M) == 10
    assert counted("send_failed", "otlp/test", L) == 7
    assert "dropped 6 unsent batches (17 items)" in caplog.text
    # After the first failed drain attempt nothing more was tried: 2 waiting + at most 2 drain attempts.
    assert transport.attempts <= 4


async def test_shutdown_is_bounded_by_its_timeout(make_exporter, transport, make_batch, counted, eventually) -> None:
    transport.gate = asyncio.Event()  # the backend never answers
    exporter = make_exporter(queue=QueueSettings(num_consumers=1, queue_size=5), shutdown_timeout=0.2)
    await exporter.start()
    await exporter.export(make_batch(items=4))
    await exporter.export(make_batch(items=4))
    await eventually(lambda: transport.attempts == 1)
    started = time.monotonic()
    await exporter.shutdown()
    assert 0.15 < time.monotonic() - started < 1.0
    assert counted("send_failed", "otlp/test", M) == 8  # in flight and queued


async def test_lifecycle_edges(make_exporter, transport, make_batch) -> None:
    idle = make_exporter()
    await idle.shutdown()  # before start
    await idle.shutdown()
    assert transport.closed and transport.draining

    exporter = make_exporter()
    with pytest.raises(Refused):
        await exporter.export(make_batch())  # not started
    await exporter.start()
    assert exporter.ready
    await exporter.shutdown()
    await exporter.shutdown()
    with pytest.raises(Refused):
        await exporter.export(make_batch())


async def test_concurrent_shutdowns_both_wait_for_the_drain(make_exporter, transport, make_batch) -> None:
    transport.gate = asyncio.Event()
    exporter = make_exporter()
    await exporter.start()
    await exporter.export(make_batch())
    asyncio.get_running_loop().call_later(0.05, transport.gate.set)
    await asyncio.gather(exporter.shutdown(), exporter.shutdown())
    assert len(transport.sent) == 1


async def test_permanent_error_is_dropped_at_once(make_exporter, transport, make_batch, counted, eventually) -> None:
    transport.errors = [PermanentExportError("INVALID_ARGUMENT: bad")]
    exporter = make_exporter(retry=SLOW_RETRY)
    await exporter.start()
    await exporter.export(make_batch(items=3))
    await eventually(lambda: counted("send_failed", "otlp/test", M) == 3)
    assert transport.attempts == 1
    await exporter.export(make_batch(items=2))
    await eventually(lambda: counted("sent", "otlp/test", M) == 2)
    await exporter.shutdown()


async def test_retries_exhausted_are_counted(make_exporter, transport, make_batch, counted, eventually) -> None:
    transport.always = TransientExportError("down")
    retry = RetrySettings(initial_interval=0.01, max_interval=0.01, max_elapsed_time=0.05)
    exporter = make_exporter(retry=retry)
    await exporter.start()
    await exporter.export(make_batch(items=3))
    await eventually(lambda: counted("send_failed", "otlp/test", M) == 3)
    assert transport.attempts > 1
    await exporter.shutdown()


async def test_partial_success_counts_rejected_items(
    make_exporter, transport, make_batch, counted, eventually, caplog: pytest.LogCaptureFixture
) -> None:
    transport.receipt = Receipt(rejected=2, message="2 points had no name")
    exporter = make_exporter()
    await exporter.start()
    with caplog.at_level(logging.WARNING):
        await exporter.export(make_batch(items=5))
        await eventually(lambda: counted("sent", "otlp/test", M) == 3)
        await exporter.export(make_batch(items=5))  # a request of its own: the backend rejects 2 again
        await eventually(lambda: counted("sent", "otlp/test", M) == 6)
    assert counted("send_failed", "otlp/test", M) == 4
    assert caplog.text.count("2 points had no name") == 1
    await exporter.shutdown()


async def test_unreachable_and_back_logged_once_each(
    make_exporter, transport, make_batch, eventually, caplog: pytest.LogCaptureFixture
) -> None:
    transport.errors = [TransientExportError("refused") for _ in range(4)]
    exporter = make_exporter()
    with caplog.at_level(logging.INFO, logger="gputally.exporterhelper.sender"):
        await exporter.start()
        await exporter.export(make_batch())
        await eventually(lambda: len(transport.sent) == 1)
        await exporter.shutdown()
    assert caplog.text.count("fake-backend is unavailable") == 1
    assert caplog.text.count("fake-backend is available again") == 1


async def test_a_bug_in_the_transport_does_not_kill_the_consumer(
    make_exporter, transport, make_batch, counted, eventually
) -> None:
    """A batch the transport trips on is dropped, alone when it went out with others."""
    bad = make_batch(items=3, tag="bad")
    transport.fails_on = lambda request: RuntimeError("bug") if bad.serialize() in request.serialize() else None
    exporter = make_exporter(queue=QueueSettings(num_consumers=1, queue_size=5))
    await exporter.start()
    await exporter.export(bad)
    await eventually(lambda: counted("send_failed", "otlp/test", M) == 3)
    transport.gate = asyncio.Event()
    await exporter.export(make_batch(items=4, tag="held"))  # taken alone, held
    await eventually(lambda: transport.attempts == 2)
    for batch in (make_batch(items=1, tag="x"), bad, make_batch(items=2, tag="y")):
        await exporter.export(batch)  # will go as one request, which raises
    transport.gate.set()
    await eventually(lambda: counted("sent", "otlp/test", M) == 7)
    assert counted("send_failed", "otlp/test", M) == 6
    assert [b.items for b in transport.sent] == [4, 1, 2]
    assert transport.attempts == 6  # bad; held; the three together; each alone
    await exporter.shutdown()


async def test_inline_mode_sends_before_returning(make_exporter, transport, make_batch, counted) -> None:
    exporter = make_exporter(queue=QueueSettings(enabled=False))
    await exporter.start()
    transport.errors = [TransientExportError("blip")]
    await exporter.export(make_batch(items=3))
    assert len(transport.sent) == 1 and counted("sent", "otlp/test", M) == 3

    transport.errors = [PermanentExportError("bad")]
    await exporter.export(make_batch(items=2))  # dropped and counted, not pushed back
    assert counted("send_failed", "otlp/test", M) == 2
    await exporter.shutdown()


async def test_inline_mode_refuses_when_retries_run_out(make_exporter, transport, make_batch, counted) -> None:
    transport.always = TransientExportError("throttled", retry_after=0.01)
    retry = RetrySettings(initial_interval=0.01, max_elapsed_time=0.1)
    exporter = make_exporter(retry=retry, queue=QueueSettings(enabled=False))
    await exporter.start()
    with pytest.raises(Refused) as refused:
        await exporter.export(make_batch(items=3))
    assert refused.value.retry_after == 0.01
    assert transport.attempts > 1
    assert counted("send_failed", "otlp/test", M) == 0  # the sender keeps it and retries
    await exporter.shutdown()


async def test_storage_failure_pushes_back(make_exporter, transport, make_batch, counted, tmp_path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    exporter = make_exporter(queue=QueueSettings(storage="file_storage"), storage=tmp_path / "store")
    await exporter.start()
    await exporter.export(make_batch(items=1))
    shutil.rmtree(tmp_path / "store")  # the volume went away
    with pytest.raises(Refused, match="cannot store"):
        await exporter.export(make_batch(items=3))
    assert counted("enqueue_failed", "otlp/test", M) == 3
    assert "cannot store a batch" in caplog.text
    await exporter.shutdown()

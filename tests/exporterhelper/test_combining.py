"""Queued batches of one signal sent as one request: when, within which limits, and each
batch's own outcome (counted, told to listeners, deleted from disk) as if it went alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gputally.errors import PermanentExportError, TransientExportError
from gputally.exporterhelper.settings import QueueSettings, RetrySettings
from gputally.exporterhelper.transport import Receipt
from gputally.otlp.batch import Batch, Signal

M, L = Signal.METRICS, Signal.LOGS
SLOW_RETRY = RetrySettings(initial_interval=60, max_interval=60, max_elapsed_time=0)


class Tally:
    """A DeliveryListener: (signal, sent, failed, error) per settled batch."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[Signal, int, int, BaseException | None]] = []
        self.attempts_failed = 0

    def attempt_failed(self, signal: Signal, error: TransientExportError) -> None:
        self.attempts_failed += 1

    def settled(self, signal: Signal, sent: int, failed: int, error: BaseException | None) -> None:
        self.outcomes.append((signal, sent, failed, error))


async def held_then_queued(exporter, transport, eventually, batches: list[Batch]) -> None:
    """One batch taken by the only consumer and held in send, then ``batches`` queued behind it."""
    transport.gate = asyncio.Event()
    await exporter.export(Batch(M, raw=b"", items=0))
    await eventually(lambda: transport.attempts == 1)
    for batch in batches:
        await exporter.export(batch)


ONE_CONSUMER = QueueSettings(num_consumers=1, queue_size=100)


async def test_batches_waiting_together_go_as_one_request(make_exporter, transport, make_batch, counted,
                                                         eventually) -> None:
    exporter = make_exporter(queue=ONE_CONSUMER)
    tally = Tally()
    exporter.add_listener(tally)
    await exporter.start()
    batches = [make_batch(items=n + 1, tag=str(n)) for n in range(5)]
    await held_then_queued(exporter, transport, eventually, batches)
    transport.gate.set()
    await eventually(lambda: counted("sent", "otlp/test", M) == 15)
    assert [b.items for b in transport.sent] == [0, 15]
    assert transport.sent[1].serialize() == b"".join(b.serialize() for b in batches)  # in order, undecoded
    assert tally.outcomes[1:] == [(M, n + 1, 0, None) for n in range(5)]  # one per batch, not per request
    assert exporter.queued == 0
    await exporter.shutdown()


async def test_a_lone_batch_is_sent_as_it_is(make_exporter, transport, make_batch, eventually) -> None:
    exporter = make_exporter()
    await exporter.start()
    batch = make_batch(items=4)
    await exporter.export(batch)
    await eventually(lambda: len(transport.sent) == 1)
    assert transport.sent[0] is batch  # no copy, no concatenation
    await exporter.shutdown()


@pytest.mark.parametrize(("max_batches", "max_bytes"), [(3, 10**9), (64, 700), (3, 250)])
async def test_requests_never_exceed_the_limits(make_exporter, transport, make_batch, entries, counted, eventually,
                                                max_batches: int, max_bytes: int) -> None:
    exporter = make_exporter(queue=ONE_CONSUMER, max_request_batches=max_batches, max_request_bytes=max_bytes)
    await exporter.start()
    sizes = [1, 4, 2, 9, 1, 1, 3, 2, 5, 1, 1, 1]
    batches = [make_batch(items=n, tag=f"b{i}") for i, n in enumerate(sizes)]
    await held_then_queued(exporter, transport, eventually, batches)
    transport.gate.set()
    await eventually(lambda: counted("sent", "otlp/test", M) == sum(sizes))
    requests = transport.sent[1:]
    assert b"".join(r.serialize() for r in requests) == b"".join(b.serialize() for b in batches)
    for request in requests:
        parts = entries(M, request.serialize())
        assert len(parts) <= max_batches
        assert len(request.serialize()) <= max_bytes or len(parts) == 1  # a batch over the limit goes alone
    assert len(requests) < len(batches)  # and the limits still let some combine
    await exporter.shutdown()


async def test_signals_are_not_mixed_and_stay_in_order(make_exporter, transport, make_batch, eventually,
                                                       counted) -> None:
    exporter = make_exporter(queue=ONE_CONSUMER)
    await exporter.start()
    batches = [make_batch(M, tag="m1"), make_batch(M, tag="m2"), make_batch(L, tag="l1"),
               make_batch(L, tag="l2"), make_batch(M, tag="m3")]
    await held_then_queued(exporter, transport, eventually, batches)
    transport.gate.set()
    await eventually(lambda: counted("sent", "otlp/test", M) == 9 and counted("sent", "otlp/test", L) == 6)
    assert [(r.signal, r.serialize()) for r in transport.sent[1:]] == [
        (M, batches[0].serialize() + batches[1].serialize()),
        (L, batches[2].serialize() + batches[3].serialize()),
        (M, batches[4].serialize()),
    ]
    await exporter.shutdown()


@pytest.mark.parametrize(("rejected", "told"), [
    (3, [(2, 0), (1, 1), (0, 2)]),  # charged to the request's batches in order
    (99, [(2, 0), (2, 0), (2, 0)]),  # more than the request held: all of it, no more
])
async def test_partial_success_of_a_combined_request(make_exporter, transport, make_batch, counted, eventually,
                                                     rejected: int, told: list[tuple[int, int]]) -> None:
    exporter = make_exporter(queue=ONE_CONSUMER)
    tally = Tally()
    exporter.add_listener(tally)
    await exporter.start()
    await held_then_queued(exporter, transport, eventually, [make_batch(items=2, tag=str(n)) for n in range(3)])
    transport.receipt = Receipt(rejected=rejected, message="too old")
    transport.gate.set()
    await eventually(lambda: len(tally.outcomes) == 4)
    failed = min(rejected, 6)
    assert counted("sent", "otlp/test", M) == 6 - failed
    assert counted("send_failed", "otlp/test", M) == failed
    assert [(sent, failed_) for _, failed_, sent, _ in tally.outcomes[1:]] == told
    await exporter.shutdown()


async def test_a_refused_request_is_sent_again_batch_by_batch(make_exporter, transport, make_batch, counted,
                                                              eventually) -> None:
    """The backend refuses the request for one bad batch: only that batch is lost."""
    bad = make_batch(items=3, tag="bad")
    transport.fails_on = (lambda request: PermanentExportError("INVALID_ARGUMENT: bad point")
                          if bad.serialize() in request.serialize() else None)
    exporter = make_exporter(queue=ONE_CONSUMER, retry=SLOW_RETRY)
    tally = Tally()
    exporter.add_listener(tally)
    await exporter.start()
    good = [make_batch(items=1, tag="a"), make_batch(items=2, tag="b")]
    await held_then_queued(exporter, transport, eventually, [good[0], bad, good[1]])
    transport.gate.set()
    await eventually(lambda: len(tally.outcomes) == 4)
    assert [b.serialize() for b in transport.sent[1:]] == [g.serialize() for g in good]
    assert transport.attempts == 1 + 1 + 3  # held; together; each alone
    assert counted("sent", "otlp/test", M) == 3 and counted("send_failed", "otlp/test", M) == 3
    outcomes = tally.outcomes[1:]
    assert [(sent, failed) for _, sent, failed, _ in outcomes] == [(1, 0), (0, 3), (2, 0)]
    assert isinstance(outcomes[1][3], PermanentExportError)
    await exporter.shutdown()


async def test_a_backend_refusing_everything_counts_each_batch_once(make_exporter, transport, make_batch,
                                                                    counted, eventually) -> None:
    exporter = make_exporter(queue=ONE_CONSUMER, retry=SLOW_RETRY)
    tally = Tally()
    exporter.add_listener(tally)
    await exporter.start()
    await held_then_queued(exporter, transport, eventually, [make_batch(items=2, tag=str(n)) for n in range(3)])
    transport.always = PermanentExportError("UNAUTHENTICATED")
    transport.gate.set()
    await eventually(lambda: len(tally.outcomes) == 4)
    await asyncio.sleep(0.05)
    assert counted("send_failed", "otlp/test", M) == 6 and counted("sent", "otlp/test", M) == 0
    assert [(sent, failed) for _, sent, failed, _ in tally.outcomes] == [(0, 0)] + [(0, 2)] * 3
    assert transport.attempts == 1 + 1 + 3
    await exporter.shutdown()


async def test_a_combined_request_is_retried_whole(make_exporter, transport, make_batch, counted, eventually) -> None:
    exporter = make_exporter(queue=ONE_CONSUMER)
    tally = Tally()
    exporter.add_listener(tally)
    await exporter.start()
    batches = [make_batch(items=2, tag=str(n)) for n in range(3)]
    await held_then_queued(exporter, transport, eventually, batches)
    transport.errors = [TransientExportError("UNAVAILABLE")] * 3  # the held one's attempt, then the request's two
    transport.gate.set()
    await eventually(lambda: counted("sent", "otlp/test", M) == 6)
    assert [b.serialize() for b in transport.sent] == [b"", b"".join(b.serialize() for b in batches)]
    assert transport.attempts == 2 + 3
    assert tally.attempts_failed == 3
    assert counted("send_failed", "otlp/test", M) == 0
    assert [(sent, failed) for _, sent, failed, _ in tally.outcomes] == [(0, 0)] + [(2, 0)] * 3
    await exporter.shutdown()


async def test_retries_exhausted_fail_each_batch_once(make_exporter, transport, make_batch, counted,
                                                      eventually) -> None:
    exporter = make_exporter(queue=ONE_CONSUMER, retry=RetrySettings(
        initial_interval=0.01, max_interval=0.01, randomization_factor=0, max_elapsed_time=0.05))
    tally = Tally()
    exporter.add_listener(tally)
    await exporter.start()
    await held_then_queued(exporter, transport, eventually, [make_batch(items=n, tag=str(n)) for n in (1, 2, 3)])
    transport.always = TransientExportError("UNAVAILABLE")
    transport.gate.set()
    await eventually(lambda: len(tally.outcomes) == 4)
    assert counted("send_failed", "otlp/test", M) == 6
    outcomes = tally.outcomes[1:]
    assert [(sent, failed) for _, sent, failed, _ in outcomes] == [(0, 1), (0, 2), (0, 3)]
    assert all(isinstance(error, TransientExportError) for *_, error in outcomes)
    await exporter.shutdown()


async def test_shutdown_with_the_backend_down_counts_each_batch_once(make_exporter, transport, make_batch, counted,
                                                                     eventually) -> None:
    transport.always = TransientExportError("UNAVAILABLE")
    exporter = make_exporter(queue=ONE_CONSUMER, retry=SLOW_RETRY)
    await exporter.start()
    for n in range(4):
        await exporter.export(make_batch(items=2, tag=str(n)))
    await eventually(lambda: transport.attempts == 1)  # all four in one request, now waiting out 60 s
    await exporter.shutdown()
    assert counted("send_failed", "otlp/test", M) == 8 and counted("sent", "otlp/test", M) == 0
    assert transport.attempts == 2  # one last attempt of the request at shutdown


def stored(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.otlp"))


async def test_files_are_deleted_only_after_their_request_is_delivered(
    make_exporter, transport, make_batch, counted, eventually, tmp_path: Path
) -> None:
    queue = QueueSettings(num_consumers=1, queue_size=100, storage="file_storage")
    directory = tmp_path / "otlp%2Ftest"
    exporter = make_exporter(queue=queue, storage=tmp_path)
    await exporter.start()
    batches = [make_batch(items=2, tag=str(n)) for n in range(3)]
    await held_then_queued(exporter, transport, eventually, batches)
    files = stored(directory)
    assert len(files) == 4
    held_request = transport.gate
    transport.gate = asyncio.Event()  # the next request, the three together, is held in its turn
    held_request.set()
    await eventually(lambda: transport.attempts == 2 and exporter.queued == 0)
    assert stored(directory) == files[1:]  # taken and being sent: still on disk
    transport.gate.set()
    await eventually(lambda: counted("sent", "otlp/test", M) == 6)
    await eventually(lambda: stored(directory) == [])
    assert transport.sent[1].serialize() == b"".join(b.serialize() for b in batches)
    await exporter.shutdown()


async def test_files_left_by_a_previous_run_go_out_together_and_are_kept_until_sent(
    make_exporter, transport, make_batch, counted, eventually, tmp_path: Path
) -> None:
    queue = QueueSettings(num_consumers=2, queue_size=100, storage="file_storage")
    directory = tmp_path / "otlp%2Ftest"
    transport.always = TransientExportError("UNAVAILABLE")
    first = make_exporter(queue=queue, storage=tmp_path, retry=SLOW_RETRY, shutdown_timeout=0.5)
    await first.start()
    batches = [make_batch(items=2, tag=str(n)) for n in range(5)]
    for batch in batches:
        await first.export(batch)
    await eventually(lambda: transport.attempts >= 1)
    await first.shutdown()
    assert len(stored(directory)) == 5  # the backend was down: every file kept, the request's too
    assert counted("send_failed", "otlp/test", M) == 0

    transport.always = None
    transport.sent.clear()
    second = make_exporter(queue=queue, storage=tmp_path)
    await second.start()
    await eventually(lambda: counted("sent", "otlp/test", M) == 10)
    await eventually(lambda: stored(directory) == [])
    assert len(transport.sent) == 1  # read back from disk and sent as one request
    assert transport.sent[0].serialize() == b"".join(b.serialize() for b in batches)
    await second.shutdown()


async def test_an_unreadable_file_is_dropped_alone(make_exporter, transport, make_batch, counted, eventually,
                                                   tmp_path: Path) -> None:
    queue = QueueSettings(num_consumers=1, queue_size=100, storage="file_storage")
    directory = tmp_path / "otlp%2Ftest"
    transport.always = TransientExportError("UNAVAILABLE")
    first = make_exporter(queue=queue, storage=tmp_path, retry=SLOW_RETRY, shutdown_timeout=0.5)
    await first.start()
    await first.export(make_batch(items=9, tag="head"))
    await eventually(lambda: transport.attempts >= 1)  # taken alone; the next three queue behind it
    batches = [make_batch(items=n, tag=str(n)) for n in (1, 2, 3)]
    for batch in batches:
        await first.export(batch)
    await first.shutdown()
    names = stored(directory)
    assert len(names) == 4
    (directory / names[2]).unlink()  # the batch of 2 items vanished from under the queue
    (directory / names[2]).mkdir()  # and is now something that cannot be read

    transport.always = None
    transport.sent.clear()
    second = make_exporter(queue=queue, storage=tmp_path)
    await second.start()
    await eventually(lambda: counted("sent", "otlp/test", M) == 9 + 1 + 3)
    assert counted("send_failed", "otlp/test", M) == 2
    assert b"".join(b.serialize() for b in transport.sent).endswith(
        batches[0].serialize() + batches[2].serialize())
    await second.shutdown()

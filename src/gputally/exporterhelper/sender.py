"""The queued exporter both OTLP exporters are made of: queue -> retry -> transport.

``export`` only enqueues (or, with ``sending_queue.enabled: false``, sends inline), so a slow
backend turns into a full queue and then into ``Refused`` backpressure, never into a stalled
receiver. ``num_consumers`` tasks take batches from the queue and send them with retry; when
batches of one signal wait behind the one a consumer takes, it sends them with it as one
request (their encodings concatenated: no decoding), up to ``max_request_batches`` batches
and ``max_request_bytes``, so a backlog costs one call per several batches. Each batch keeps
its own outcome: it is counted, told to listeners and (on disk) deleted as if sent alone. A
combined request the backend refuses for good (or that trips a bug) is sent again batch by
batch, so one bad batch, or a request over the backend's size limit, loses only itself. A
partial success's rejected items are the request's: the counters are exact per signal, and
listeners hear them charged to the request's batches in order (the backend does not say
which batch held them).

Shutdown stops intake, then stops retry (waking every backoff), then lets the consumers drain
the queue with one attempt per request until the queue is empty, the backend fails (no point
trying the rest) or ``shutdown_timeout`` passes. What is left stays on disk with persistent
storage, and is counted as ``send_failed`` in memory.
"""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path
from collections.abc import Iterable
from typing import Protocol

from gputally.errors import Refused, TransientExportError
from gputally.exporterhelper.persistent_queue import PersistentQueue, queue_directory
from gputally.exporterhelper.queue import Entry, MemoryQueue
from gputally.exporterhelper.retry import Clock, Outcome, Result, Retrier
from gputally.exporterhelper.settings import QueueSettings, RetrySettings
from gputally.exporterhelper.transport import Receipt, Transport
from gputally.logthrottle.throttle import LogThrottle
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext, Exporter
from gputally.telemetry import ExporterMetrics

__all__ = ["MAX_REQUEST_BATCHES", "MAX_REQUEST_BYTES", "DeliveryListener", "QueuedExporter"]

log = logging.getLogger(__name__)

MAX_REQUEST_BATCHES = 64
"""Most queued batches sent as one request."""
MAX_REQUEST_BYTES = 4 * 2**20
"""Most bytes of encoding in a request of several batches: gRPC's default receive limit
(the Collector's OTLP receiver keeps it), so a combined request is never one a default
backend refuses where its batches alone would pass. A larger batch is still sent, alone."""


class _Reachability:
    """Logs when the backend stops answering and when it answers again, not every failure."""

    def __init__(self, exporter_id: str, description: str) -> None:
        self._id = exporter_id
        self._description = description
        self._up: bool | None = None

    def failed(self, error: TransientExportError) -> None:
        if self._up is not False:
            log.warning("%s: %s is unavailable (%s); retrying", self._id, self._description, error)
        self._up = False

    def succeeded(self) -> None:
        if self._up is False:
            log.info("%s: %s is available again", self._id, self._description)
        self._up = True


class DeliveryListener(Protocol):
    """Told what became of each batch, for a caller that reports on its own deliveries (the
    probe) without reading the exporter's metrics back by name."""

    def attempt_failed(self, signal: Signal, error: TransientExportError) -> None:
        """One try failed and will be retried (the backend unreachable, the handshake refused)."""

    def settled(self, signal: Signal, sent: int, failed: int, error: BaseException | None) -> None:
        """A batch is done with: ``sent`` items arrived, ``failed`` never will (``error`` says why)."""


class QueuedExporter(Exporter):
    """An exporter that serves every signal through one bounded queue and one transport."""

    @classmethod
    def from_config(
        cls, transport: Transport, *, retry: RetrySettings, queue: QueueSettings, context: ComponentContext
    ) -> QueuedExporter:
        """The exporter for a component, with its metrics and the service's shutdown deadline."""
        return cls(
            exporter_id=context.id,
            transport=transport,
            retry=retry,
            queue=queue,
            storage=None if queue.storage is None else context.storage_directory(queue.storage),
            metrics=context.telemetry.for_exporter(context.id),
            shutdown_timeout=context.shutdown_timeout,
        )

    def __init__(
        self,
        *,
        exporter_id: str,
        transport: Transport,
        retry: RetrySettings,
        queue: QueueSettings,
        metrics: ExporterMetrics,
        shutdown_timeout: float,
        storage: Path | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        max_request_batches: int = MAX_REQUEST_BATCHES,
        max_request_bytes: int = MAX_REQUEST_BYTES,
    ) -> None:
        if max_request_batches < 1:
            raise ValueError("max_request_batches must be at least 1")
        self._id = exporter_id
        self._transport = transport
        self._retry_settings = retry
        self._queue_settings = queue
        self._metrics = metrics
        self._shutdown_timeout = shutdown_timeout
        self._max_request_batches = max_request_batches
        self._max_request_bytes = max_request_bytes
        self._retrier = Retrier(retry, clock=clock, rng=rng)
        self._throttle = LogThrottle(log)
        self._reachability = _Reachability(exporter_id, transport.description)
        self._queue: MemoryQueue
        if queue.storage is not None:
            if storage is None:
                raise ValueError(f"{exporter_id}: sending_queue.storage names {queue.storage!r}, but no directory was given")
            directory = queue_directory(storage, exporter_id)
            self._queue = PersistentQueue(queue.queue_size, directory, on_size=metrics.queue_size.set)
        else:
            self._queue = MemoryQueue(queue.queue_size, on_size=metrics.queue_size.set)
        metrics.queue_capacity.set(queue.queue_size if queue.enabled else 0)
        self._consumers: list[asyncio.Task[None]] = []
        self._in_flight: set[Entry] = set()
        self._stranded: list[Entry] = []
        self._started = False
        self._closing = False
        self._closed = asyncio.Event()
        self._listeners: list[DeliveryListener] = []

    def add_listener(self, listener: DeliveryListener) -> None:
        """Tell ``listener`` about every failed attempt and every settled batch from now on."""
        self._listeners.append(listener)

    @property
    def destination(self) -> str:
        """Where batches go, as the transport describes it (``host:port`` or a URL)."""
        return self._transport.description

    @property
    def queued(self) -> int:
        """Batches waiting in the queue now (not counting those being sent)."""
        return len(self._queue)

    @property
    def capacity(self) -> int:
        """The most batches the queue holds."""
        return self._queue.capacity

    def _settled(self, signal: Signal, sent: int, failed: int, error: BaseException | None) -> None:
        for listener in self._listeners:
            listener.settled(signal, sent, failed, error)

    @property
    def ready(self) -> bool:
        return self._transport.ready

    @property
    def durable(self) -> bool:
        """On disk (``sending_queue.storage``) or sent inline (queue off): either way ``export``
        returns only once a crash can no longer lose the batch."""
        return self._queue_settings.durable

    async def start(self) -> None:
        if self._started or self._closing:
            return
        await self._transport.start()
        if self._queue_settings.enabled:
            await self._queue.open()
            self._consumers = [
                asyncio.create_task(self._consume(), name=f"{self._id} sender {n}")
                for n in range(self._queue_settings.num_consumers)
            ]
        self._started = True
        log.info("%s: exporting to %s (queue: %s)", self._id, self._transport.description,
                 self._queue.location if self._queue_settings.enabled else "off")

    async def export(self, batch: Batch) -> None:
        if self._closing or not self._started:
            raise Refused(f"{self._id} is not running", retry_after=self._backoff_hint())
        if not self._queue_settings.enabled:
            await self._export_inline(batch)
            return
        try:
            accepted = await self._queue.put(batch)
        except OSError as exc:  # disk full, storage gone: push back, the sender still has the data
            self._metrics.enqueue_failed[batch.signal].inc(batch.items)
            self._throttle.log("store", logging.ERROR, "%s: cannot store a batch in %s: %s; refusing data",
                               self._id, self._queue.location, exc)
            raise Refused(f"{self._id}: cannot store the batch", retry_after=self._backoff_hint()) from exc
        if not accepted:
            self._metrics.enqueue_failed[batch.signal].inc(batch.items)
            self._throttle.log("full", logging.WARNING, "%s: sending queue is full (%d batches); refusing data",
                               self._id, self._queue.capacity)
            raise Refused(f"{self._id}: sending queue is full", retry_after=self._backoff_hint())

    async def shutdown(self) -> None:
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        self._transport.drain()
        self._retrier.stop()
        await self._queue.close()
        if self._consumers:
            _, pending = await asyncio.wait(self._consumers, timeout=self._shutdown_timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*self._consumers, return_exceptions=True)
        self._account_unsent([*self._stranded, *self._in_flight, *self._queue.remaining()])
        await self._queue.release()
        await self._transport.close()
        self._closed.set()
        if self._started:
            log.info("%s: stopped", self._id)

    def _backoff_hint(self) -> float:
        """How long a refused sender should wait: about one retry interval of ours."""
        return self._retry_settings.initial_interval or 1.0

    async def _export_inline(self, batch: Batch) -> None:
        result = await self._deliver([batch])
        assert result is not None
        if result.outcome in (Outcome.EXHAUSTED, Outcome.STOPPED):
            # Not counted as failed: the sender is told to retry, so the data is not lost yet.
            hint = result.retry_after if result.retry_after is not None else self._backoff_hint()
            raise Refused(f"{self._id}: backend unavailable: {result.error}", retry_after=hint)

    async def _consume(self) -> None:
        """Send queued batches until the queue is closed and drained."""
        while True:
            if self._closing and self._stranded:
                return  # the backend failed during the drain: keep the rest for later
            entry = await self._queue.get()
            if entry is None:
                return
            group = [entry, *self._queue.following(entry, count=self._max_request_batches - 1,
                                                   size=self._max_request_bytes - entry.request_bytes())]
            self._in_flight.update(group)
            await self._send_group(group)

    async def _send_group(self, entries: list[Entry]) -> None:
        """Send ``entries`` (one signal) as one request, or alone when the backend refused them
        together; each entry is finished as soon as its outcome is known."""
        loaded: list[tuple[Entry, Batch]] = []
        for entry in entries:
            batch = await self._load(entry)
            if batch is None:
                await self._finish([entry], Outcome.PERMANENT)
            else:
                loaded.append((entry, batch))
        if len(loaded) > 1:
            outcome = await self._send([batch for _, batch in loaded], split_refused=True)
            if outcome is not None:
                await self._finish([entry for entry, _ in loaded], outcome)
                return
            log.debug("%s: backend refused %d %s batches sent together; sending each alone",
                      self._id, len(loaded), loaded[0][0].signal)
        for entry, batch in loaded:
            outcome = await self._send([batch])
            assert outcome is not None
            await self._finish([entry], outcome)

    async def _load(self, entry: Entry) -> Batch | None:
        """The entry's batch; None (counted, told) when its file cannot be read."""
        try:
            return await self._queue.read(entry)
        except OSError as exc:
            log.error("%s: cannot read queued batch %s: %s; dropping it", self._id, entry.path, exc)
            self._metrics.send_failed[entry.signal].inc(entry.items)
            self._settled(entry.signal, 0, entry.items, exc)
            return None

    async def _finish(self, entries: list[Entry], outcome: Outcome) -> None:
        """Entries whose batches were settled: kept for later when shutdown stopped them, else
        removed from the queue (their files deleted)."""
        for entry in entries:
            self._in_flight.discard(entry)
        if outcome is Outcome.STOPPED:
            self._stranded.extend(entries)
            return
        for entry in entries:
            try:
                await self._queue.done(entry)
            except OSError as exc:
                self._throttle.log("remove", logging.ERROR, "%s: cannot remove finished batch %s (%s); "
                                   "it will be sent again after a restart", self._id, entry.path, exc)

    async def _send(self, batches: list[Batch], *, split_refused: bool = False) -> Outcome | None:
        """Send ``batches`` as one request with retry and account for each; None when
        ``split_refused`` and the request was refused for good or raised (nothing counted)."""
        signal, items = batches[0].signal, sum(b.items for b in batches)
        try:
            result = await self._deliver(batches, split_refused=split_refused)
        except Exception:
            if split_refused:  # perhaps one batch's doing (an encoding a transport trips on): each alone
                log.debug("%s: unexpected error sending %d %s batches together", self._id, len(batches), signal,
                          exc_info=True)
                return None
            # A bug, not a backend failure: count the batch as lost and keep consuming.
            log.exception("%s: unexpected error sending %d %s items; dropping them", self._id, items, signal)
            self._metrics.send_failed[signal].inc(items)
            for batch in batches:
                self._settled(signal, 0, batch.items, None)
            return Outcome.PERMANENT
        if result is None:
            return None
        if result.outcome is Outcome.EXHAUSTED:
            self._metrics.send_failed[signal].inc(items)
            for batch in batches:
                self._settled(signal, 0, batch.items, result.error)
            self._throttle.log("exhausted", logging.ERROR, "%s: giving up on %d %s items: %s",
                               self._id, items, signal, result.error)
        return result.outcome

    async def _deliver(self, batches: list[Batch], *, split_refused: bool = False) -> Result[Receipt] | None:
        """Send ``batches`` (one signal) as one request with retry; count what was sent and what
        was refused for good. None, with nothing counted, when ``split_refused`` and the
        backend refused the request for good."""
        request = Batch.concat(batches)
        result = await self._retrier.run(lambda: self._attempt(request))
        signal, items = request.signal, request.items
        if result.outcome is Outcome.SENT:
            receipt = result.value or Receipt()
            rejected = min(max(receipt.rejected, 0), items)
            self._metrics.sent[signal].inc(items - rejected)
            unassigned = rejected
            for batch in batches:
                mine = min(unassigned, batch.items)
                unassigned -= mine
                self._settled(signal, batch.items - mine, mine, None)
            if rejected:
                self._metrics.send_failed[signal].inc(rejected)
                self._throttle.log("partial", logging.WARNING, "%s: backend rejected %d of %d %s items: %s",
                                   self._id, rejected, items, signal, receipt.message)
        elif result.outcome is Outcome.PERMANENT:
            if split_refused:
                return None
            self._metrics.send_failed[signal].inc(items)
            for batch in batches:
                self._settled(signal, 0, batch.items, result.error)
            self._throttle.log("permanent", logging.ERROR, "%s: backend refused %d %s items: %s",
                               self._id, items, signal, result.error)
        return result

    async def _attempt(self, batch: Batch) -> Receipt:
        try:
            receipt = await self._transport.send(batch)
        except TransientExportError as exc:
            self._reachability.failed(exc)
            for listener in self._listeners:
                listener.attempt_failed(batch.signal, exc)
            raise
        self._reachability.succeeded()
        return receipt

    def _account_unsent(self, entries: Iterable[Entry]) -> None:
        entries = list(entries)
        if not entries:
            return
        items = sum(e.items for e in entries)
        if isinstance(self._queue, PersistentQueue):
            log.warning("%s: %d unsent batches (%d items) stay in %s for the next start",
                        self._id, len(entries), items, self._queue.location)
            return
        by_signal: dict[Signal, int] = {}
        for entry in entries:
            by_signal[entry.signal] = by_signal.get(entry.signal, 0) + entry.items
        for signal, count in by_signal.items():
            self._metrics.send_failed[signal].inc(count)
            self._settled(signal, 0, count, None)
        log.warning("%s: dropped %d unsent batches (%d items) at shutdown", self._id, len(entries), items)

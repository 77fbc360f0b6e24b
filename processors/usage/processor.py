"""The ``usage`` processor at run time: reads GPU data as it passes, sends counters and events.

One :class:`UsageRuntime` (ledger, observer, state file) per processor ID and service, shared
by the processor's instances in several pipelines, as the Collector's ``sharedcomponent``
does: in a metrics pipeline the instance reads every batch (passing it on untouched) and
sends the counters every ``emit_interval``; in a logs pipeline it passes logs through and
sends the idle and summary events. Listing ``usage`` in a logs pipeline is how events are
switched on.
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from collections import Counter
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext, RuntimeProcessor

from .config import UsageConfig
from .emit import MetricsEmitter, logs_request
from .emit_serving import ServingEmitter
from .ledger import Event, Ledger
from .observe import Observer
from .owners import OwnerRules
from .storage import LedgerFile

__all__ = ["UsageProcessor", "UsageRuntime", "create"]

log = logging.getLogger(__name__)

_NEEDLE = b"hw.id"
"""Every GPU and GPU-process resource carries it; a request without these bytes has nothing
to account but engines (`_ENGINE_NEEDLE`)."""
_ENGINE_NEEDLE = b"gputally.inference.engine"
_MAX_EVENTS = 10_000
_BATCH_REQUESTS = 64
_BATCH_BYTES = 4 << 20
"""Requests queued before they are accounted together (see :meth:`UsageRuntime.observe`)."""


class UsageRuntime:
    """The ledger of one processor ID, fed by the metrics instance, read by both instances."""

    def __init__(
        self,
        config: UsageConfig,
        *,
        name: str,
        storage: Path | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.config = config
        self.name = name
        self.monotonic = monotonic
        self.wall_ns = wall_ns
        self._ledger = Ledger(config, start_ns=wall_ns(), instance=config.instance_id or socket.gethostname())
        self.observer = Observer(OwnerRules(config.owners), layout_budget=config.layout_cache_mib << 20)
        self.file = LedgerFile(storage, name) if storage is not None else None
        """The counters on disk: ``storage`` is the directory of the extension ``config.storage`` names."""
        self.events: list[Event] = []
        self.event_counts: Counter[str] = Counter()
        self.events_dropped = 0
        self.sends_events = False
        """True when an instance runs in a logs pipeline; else events are counted and dropped."""
        self._emitter = MetricsEmitter()
        self._serving = ServingEmitter()
        self._outgoing: list[Batch] = []
        """The rest of the last emit, one request each, handed on by the following flushes."""
        self._users = 0
        self._last_emit = monotonic()
        self._queue: list[tuple[bytes, float]] = []
        """Requests observed and not yet accounted, with their arrival times."""
        self._queued_bytes = 0

    @property
    def ledger(self) -> Ledger:
        """The ledger, with every request observed so far accounted in it."""
        self.account()
        return self._ledger

    async def acquire(self) -> None:
        self._users += 1
        if self._users == 1 and self.file is not None and self.file.load(self._ledger):
            log.info("%s: usage counters restored from %s (%d GPUs, %d owners)",
                     self.name, self.file.path, len(self._ledger.devices), len(self._ledger.owners))

    async def release(self) -> None:
        self._users = max(0, self._users - 1)
        if self._users == 0:
            self.save()

    def degraded(self) -> str | None:
        return None

    def observe(self, raw: bytes) -> None:
        """Queue a request to be accounted with the ones around it.

        Requests are read and integrated in batches (64 requests or 4 MiB, and whatever is
        queued before an emit, a save or any read of :attr:`ledger`): between two requests a
        server runs the whole rest of its pipeline, which leaves the reading and integrating
        code and the ledger's objects cold in the CPU's caches, and one request at a time they
        cost about three times what they cost back to back. Nothing waits on the result: a
        sample is held ``settle`` seconds before it counts anyway, and counters go out every
        ``emit_interval``. The queue holds references to bytes the pipeline already made.
        """
        self._queue.append((raw, self.monotonic()))
        self._queued_bytes += len(raw)
        if len(self._queue) >= _BATCH_REQUESTS or self._queued_bytes >= _BATCH_BYTES:
            self.account()

    def account(self) -> None:
        """Read and integrate the queued requests (samples that have settled count now)."""
        if not self._queue:
            return
        queue, self._queue, self._queued_bytes = self._queue, [], 0
        ledger, observe = self._ledger, self.observer.observe
        at_once = not self.config.settle
        for raw, arrived in queue:
            ledger.add_all(observe(raw), arrived=arrived)
            ledger.add_engines(self.observer.take_engines(), arrived=arrived)
            if at_once:  # nothing is held: integrated now, a request's samples never pile up as garbage to trace
                ledger.settle(arrived)
        ledger.settle(self.monotonic())
        self._collect_events()

    def emit(self, *, final: bool = False) -> Batch | None:
        """The next request of counters: a new emit when ``emit_interval`` has passed since the
        last (or ``final``), else what is left of the last one, else None."""
        self.account()
        now = self.monotonic()
        ledger = self._ledger
        if not final and (self._outgoing or now - self._last_emit < self.config.emit_interval):
            ledger.settle(now)
            self._collect_events()
            return self._outgoing.pop(0) if self._outgoing else None
        self._last_emit = now
        ledger.settle(now, everything=final)
        now_ns = self.wall_ns()
        requests = self._emitter.requests(ledger, now_ns)
        self._serving.fill(ledger, now_ns, requests)
        ledger.end_owners()  # after the emit: an ended owner's last counters went out above
        self._collect_events()
        self.save()
        self._outgoing = [Batch(Signal.METRICS, message=r) for r in requests]
        return self._outgoing.pop(0) if self._outgoing else None

    def take_events(self) -> Batch | None:
        self.account()
        events, self.events = self.events, []
        if not events:
            return None
        return Batch(Signal.LOGS, message=logs_request(events, self.wall_ns()))

    def save(self) -> None:
        if self.file is None:
            return
        try:
            self.file.save(self.ledger)  # with the queued requests accounted
        except OSError as exc:
            log.error("%s: cannot save usage state to %s: %s", self.name, self.file.path, exc)

    def _collect_events(self) -> None:
        events = self._ledger.drain_events()
        if not events:
            return
        self.event_counts.update(e.name for e in events)
        if not self.sends_events:
            self.events_dropped += len(events)
            return
        room = _MAX_EVENTS - len(self.events)
        if room < len(events):
            self.events_dropped += len(events) - max(room, 0)
            events = events[: max(room, 0)]
        self.events.extend(events)


class UsageProcessor(RuntimeProcessor[UsageRuntime]):
    """Accounts GPU usage per owner from the data passing through; never changes that data."""

    def __init__(self, runtime: UsageRuntime, *, signal: Signal) -> None:
        super().__init__(runtime)
        self.signal = signal
        self.flush_interval = runtime.config.flush_interval

    async def start(self) -> None:
        started = self._started
        await super().start()
        if not started and self.signal is Signal.METRICS and not self.runtime.sends_events:
            log.info("%s: in no logs pipeline: its idle and summary events are counted, not sent "
                     "(list it in a logs pipeline to send them)", self.runtime.name)

    async def process(self, batch: Batch) -> Batch | None:
        if self.signal is Signal.METRICS:
            raw = batch.serialize()
            if _NEEDLE in raw or _ENGINE_NEEDLE in raw:
                self.runtime.observe(raw)
        return batch

    async def flush(self) -> Batch | None:
        if self.signal is Signal.METRICS:
            return self.runtime.emit()
        return self.runtime.take_events()

    async def drain(self) -> Batch | None:
        if self.signal is Signal.METRICS:
            return self.runtime.emit(final=True)
        return self.runtime.take_events()


_FAMILIES: tuple[tuple[str, type[GaugeMetricFamily] | type[CounterMetricFamily], str, tuple[str, ...]], ...] = (
    ("owners", GaugeMetricFamily, "Owners with counters.", ()),
    ("gpus", GaugeMetricFamily, "GPUs being integrated.", ()),
    ("samples_ignored", CounterMetricFamily,
     "Samples not integrated: late (their GPU was integrated past them, or duplicates), incomplete "
     "(no GPU reading came), gap (further than max_gap from the one before).", ("reason",)),
    ("owners_evicted", CounterMetricFamily, "Owners dropped to stay within max_owners.", ()),
    ("events", CounterMetricFamily, "Events raised, by name.", ("event",)),
    ("events_dropped", CounterMetricFamily,
     "Events not sent: no logs pipeline lists the processor, or the queue was full.", ()),
    ("requests_read", CounterMetricFamily,
     "Requests read for usage: through a cached layout (numbers at known offsets), or the general way "
     "(a parse; a new or changing request shape, or no room left for layouts).", ("way",)),
    ("layout_bytes", GaugeMetricFamily, "Bytes held by cached request layouts.", ()),
    ("engines", GaugeMetricFamily, "Inference engine endpoints whose series are kept.", ()),
    ("engine_resets", CounterMetricFamily, "Engine counter series that reset (an engine restart).", ()),
    ("engine_readings_ignored", CounterMetricFamily,
     "Engine readings not integrated: late (the endpoint was integrated past them, or duplicates).", ("reason",)),
)


class UsageCollector(Collector):
    """``gputally_usage_*`` self-metrics for every usage runtime of a service, read at scrape time."""

    def __init__(self, runtimes: Mapping[str, UsageRuntime]) -> None:
        self._runtimes = runtimes

    def collect(self) -> Iterator[Metric]:
        families = {name: kind(f"gputally_usage_{name}", text, labels=["processor", *labels])
                    for name, kind, text, labels in _FAMILIES}
        for processor, runtime in sorted(self._runtimes.items()):
            for name, labels, value in _samples(runtime):
                families[name].add_metric([processor, *labels], value)
        yield from families.values()


def _samples(runtime: UsageRuntime) -> Iterator[tuple[str, tuple[str, ...], float]]:
    """``(family, label values, value)`` of one runtime's self-metrics."""
    ledger, layouts = runtime.ledger, runtime.observer.layouts
    yield "owners", (), len(ledger.owners)
    yield "gpus", (), len(ledger.devices)
    for reason, count in (("late", ledger.late), ("incomplete", ledger.incomplete), ("gap", ledger.gaps)):
        yield "samples_ignored", (reason,), count
    yield "owners_evicted", (), ledger.evicted
    for event, count in sorted(runtime.event_counts.items()):
        yield "events", (event,), count
    yield "events_dropped", (), runtime.events_dropped
    yield "requests_read", ("layout",), layouts.hits
    yield "requests_read", ("general",), layouts.requests - layouts.hits
    yield "layout_bytes", (), layouts.held
    yield "engines", (), len(ledger.serving.engines)
    yield "engine_resets", (), ledger.serving.resets
    yield "engine_readings_ignored", ("late",), ledger.serving.late


class _Share:
    """The usage runtimes of one service, and their collector."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.runtimes: dict[str, UsageRuntime] = {}
        registry.register(UsageCollector(self.runtimes))


def create(config: UsageConfig, context: ComponentContext, signal: Signal) -> UsageProcessor:
    """Factory hook: one instance per pipeline (metrics: accounting; logs: events), one runtime per ID."""
    if signal is Signal.TRACES:
        raise ValueError("the usage processor goes in metrics pipelines (and logs pipelines, for its events)")
    share = context.shared.get(__name__, "", lambda: _Share(context.telemetry.registry))
    runtime = context.shared.get(__name__, context.id, lambda: UsageRuntime(
        config, name=context.id, storage=None if config.storage is None else context.storage_directory(config.storage)),
                                 reuse=lambda held: held.config == config)
    share.runtimes[context.id] = runtime
    if signal is Signal.LOGS:
        runtime.sends_events = True
    return UsageProcessor(runtime, signal=signal)

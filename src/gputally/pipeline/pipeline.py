"""One pipeline: its processors in order, then a fan-out to its exporters.

Data flows one way. A processor returns the batch to pass on; the pipeline, not the
processor, carries it to the next stage, and the pipeline's own timers collect what
processors hold (``flush_interval``) and carry it on from there.

Acknowledgement: a request is acknowledged when :meth:`Pipeline.consume` returns. When an
exporter of the pipeline is durable (its queue is on disk), processors that hold requests
are asked to defer acknowledgements; ``consume`` then also waits for the receipt of what a
processor held, which completes once that data has been exported (or fails with the
refusal that stopped it), so an acknowledged request is one a ``kill -9`` cannot lose.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from gputally.errors import Refused
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import Exporter, FailurePolicy, Processor, ProcessorFailed
from gputally.telemetry import ProcessorMetrics
from gputally.util.once import Once
from gputally.util.tasks import supervised

__all__ = ["FanOut", "Pipeline", "Stage", "failures_counter"]

log = logging.getLogger(__name__)

_OUTCOMES = {FailurePolicy.PASS: "passed", FailurePolicy.DROP: "dropped", FailurePolicy.REFUSE: "refused"}
_FAILURES: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def failures_counter(registry: CollectorRegistry) -> Counter:
    """``gputally_processor_failed_items_total{processor, signal, outcome}`` in ``registry``
    (one family per registry, shared by its pipelines)."""
    family = _FAILURES.get(registry)
    if family is None:
        family = Counter(
            "gputally_processor_failed_items",
            "Items of batches a processor raised on, by what its failure policy did with them.",
            ["processor", "signal", "outcome"],
            registry=registry,
        )
        _FAILURES[registry] = family
    return family


@dataclass(frozen=True)
class Stage:
    """A processor in a pipeline, with its ID and bound self-metrics."""

    id: str
    processor: Processor
    metrics: ProcessorMetrics
    mutates_data: bool = True
    """Whether the processor changes the batches it is given in place (its factory says;
    without one, assume it does: a needless copy is slow, a missing one corrupts data)."""
    annotates: bool = False
    """Whether it changes only resource attributes (its factory's ``annotates``)."""


class Pipeline:
    """Runs batches of one signal through processors and hands them to exporters."""

    def __init__(
        self,
        pipeline_id: str,
        signal: Signal,
        stages: list[Stage],
        exporters: list[tuple[str, Exporter]],
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """``registry``: where ``gputally_processor_failed_items_total`` is counted (the service's)."""
        self.id = pipeline_id
        self._failures = failures_counter(registry or CollectorRegistry())
        self.signal = signal
        self.stages = stages
        self._exporters = [exporter for _, exporter in exporters]
        self._flushers: list[asyncio.Task[None]] = []
        self._failure_logged: Once[str] = Once()
        self.durable = any(exporter.durable for exporter in self._exporters)
        """Whether acknowledged data survives a crash: processors that hold data then defer
        acknowledgements until it reached the exporters."""
        self._deferring = frozenset(
            index for index, stage in enumerate(stages) if self.durable and stage.processor.defer_acknowledgements()
        )
        self.annotates = all(stage.annotates for stage in stages)
        """Whether what comes out of :meth:`process` differs from what went in only in
        resource attributes: the bridge may then answer with what changed."""
        self.mutates_data = any(stage.mutates_data for stage in stages)
        """Whether a batch given to :meth:`consume` may be changed in place: a read-only
        pipeline hands on (and its exporters queue) the very batch it was given."""

    async def consume(self, batch: Batch) -> None:
        """Process and export ``batch``; raises Refused when a stage pushes back."""
        await self._run(batch, 0)

    async def process(self, batch: Batch) -> Batch | None:
        """What the processors make of ``batch``, exported nowhere: an in-line receiver
        (``bridge``) answers its caller with it. None when a stage dropped all of it; raises
        Refused when a stage pushes back. Data the processors create later (``usage``'s
        counters and events, from their flush timers) still goes to the pipeline's exporters.

        Config validation keeps processors that hold requests out of these pipelines, so what
        a stage returns is all there is of the request."""
        for stage in self.stages:
            result = await self._process(stage, batch)
            if result is None:
                return None
            stage.metrics.outgoing[self.signal].inc(result.items)
            batch = result
        return batch

    async def _process(self, stage: Stage, batch: Batch) -> Batch | None:
        """One stage's ``process``, counted and timed, its failure policy applied."""
        stage.metrics.incoming[self.signal].inc(batch.items)
        started = time.perf_counter()
        try:
            return await stage.processor.process(batch)
        except Refused:
            raise
        except Exception:
            return self._failed(stage, batch)  # the processor's policy: pass, drop or refuse
        finally:
            stage.metrics.seconds.inc(time.perf_counter() - started)

    async def _run(self, batch: Batch, first: int) -> None:
        for index in range(first, len(self.stages)):
            stage = self.stages[index]
            result = await self._process(stage, batch)
            deferring = index in self._deferring
            receipt = stage.processor.receipt(batch) if deferring else None
            if result is not None:
                stage.metrics.outgoing[self.signal].inc(result.items)
                if deferring:
                    # The batch carries other senders' held data too: finish carrying it even
                    # if this sender goes away (gRPC cancels the handler of a cancelled call).
                    carry = asyncio.ensure_future(self._carry(index, result))
                    carry.add_done_callback(_retrieve)
                    await asyncio.shield(carry)
                    result = None
            if receipt is not None:
                await receipt  # what the stage held of this request has been exported
            if result is None:
                return
            batch = result
        await self._export(batch)

    async def _carry(self, index: int, batch: Batch) -> None:
        """Run ``batch`` through the stages after ``index`` and tell that stage the outcome."""
        processor = self.stages[index].processor
        try:
            await self._run(batch, index + 1)
        except BaseException as exc:
            processor.settle(batch, exc)
            raise
        processor.settle(batch, None)

    async def _export(self, batch: Batch) -> None:
        if len(self._exporters) == 1:
            await self._exporters[0].export(batch)
            return
        # Every exporter gets the batch; if any refuses, the sender retries the whole request
        # (at-least-once: a backend that took it may see it twice, none loses it).
        results = await asyncio.gather(*(e.export(batch) for e in self._exporters), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def _failed(self, stage: Stage, batch: Batch) -> Batch | None:
        """Apply the failed processor's :class:`FailurePolicy` to ``batch`` (called in ``except``)."""
        policy = FailurePolicy(stage.processor.on_failure)
        outcome = _OUTCOMES[policy]
        self._failures.labels(processor=stage.id, signal=self.signal.value, outcome=outcome).inc(batch.items)
        if self._failure_logged.first(stage.id):  # the traceback once; every batch is counted
            log.exception("processor %s failed in pipeline %s; its policy is %r: data %s (logged once, counted in "
                          "gputally_processor_failed_items_total)", stage.id, self.id, policy.value, outcome)
        if policy is FailurePolicy.PASS:
            return batch
        if policy is FailurePolicy.DROP:
            return None
        raise ProcessorFailed(f"processor {stage.id} failed; the data was not taken")

    async def start(self) -> None:
        """Start the flush timers of processors that hold data."""
        for index, stage in enumerate(self.stages):
            interval = stage.processor.flush_interval
            if interval:
                name = f"flush {self.id}/{stage.id}"
                self._flushers.append(supervised(self._flush_every(index, interval), name=name))

    async def _flush_every(self, index: int, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self._flush_stage(index)

    async def _flush_stage(self, index: int, *, final: bool = False) -> None:
        """Carry on everything the stage holds (a split request can leave several batches);
        ``final`` (at shutdown) asks the processor to drain first."""
        stage = self.stages[index]
        held = await stage.processor.drain() if final else await stage.processor.flush()
        while held is not None:
            stage.metrics.outgoing[self.signal].inc(held.items)
            try:
                if index in self._deferring:
                    await self._carry(index, held)
                else:
                    await self._run(held, index + 1)
            except Refused as exc:
                # Deferred: the senders waiting on this data are refused and retry it. Otherwise
                # nobody upstream can retry held data; the exporter has counted what it dropped.
                log.debug("flushed data from %s refused downstream: %s", stage.id, exc)
            held = await stage.processor.flush()

    async def shutdown(self) -> None:
        """Stop the timers, then push everything processors still hold down the pipeline."""
        for task in self._flushers:
            task.cancel()
        await asyncio.gather(*self._flushers, return_exceptions=True)
        self._flushers.clear()
        for index in range(len(self.stages)):
            await self._flush_stage(index, final=True)


def _retrieve(task: asyncio.Future[None]) -> None:
    """Mark a shielded task's outcome as seen (its awaiter may have been cancelled)."""
    if not task.cancelled():
        task.exception()


class FanOut:
    """Hands a receiver's batch to every pipeline of its signal that lists the receiver.

    Pipelines that only read share the batch as received; each pipeline that changes data
    gets a copy of its own, so no pipeline sees another's changes (the pipelines run
    concurrently, and exporters queue what they are given). A pipeline that nobody shares
    the batch with takes it as it is: a single pipeline, or the first of several that all
    change data.
    """

    def __init__(self, pipelines: list[Pipeline]) -> None:
        self._pipelines = pipelines
        self._private = [pipeline.mutates_data for pipeline in pipelines]
        """Per pipeline: whether it gets a copy."""
        if all(self._private):
            self._private[0] = False

    async def consume(self, batch: Batch) -> None:
        if len(self._pipelines) == 1:
            await self._pipelines[0].consume(batch)
            return
        batches = [batch.copy() if private else batch for private in self._private]
        results = await asyncio.gather(
            *(p.consume(b) for p, b in zip(self._pipelines, batches, strict=True)), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

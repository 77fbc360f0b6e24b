"""The probe's loop: collect every interval, print (``--debug``) and/or export, stop on SIGTERM.

Delivery goes through the server's own exporters (:mod:`gputally.exporters`): the same bounded
queue (optionally on disk), retry with backoff and OTLP status handling, so a receiver restart
costs nothing but a delay. A full queue refuses the cycle's data, which is logged (once until
delivery recovers) and counted by the exporter; the loop never waits on the network.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from gputally.errors import Refused
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import Exporter
from gputally.probes.collector import Collector
from gputally.probes.debug import render
from gputally.probes.model import Cycle
from gputally.telemetry import SelfTelemetry

if TYPE_CHECKING:
    from gputally.probes.allocations import PodAllocations
    from gputally.probes.otlp_shape import OtlpEncoder

__all__ = ["ProbeOptions", "Runner"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ProbeOptions:
    interval_s: float = 10.0
    """Time between collections (cycles start on a fixed grid; a late cycle skips ticks)."""
    once: bool = False
    """Collect once, deliver, and return."""
    debug: bool = False
    """Print each collection to the output stream."""
    drain_timeout_s: float = 30.0
    """With ``once``: how long to keep retrying delivery before giving up."""
    title: str = ""
    """Shown in the debug dump's first line (the source: ``live`` or the replay file)."""
    probe: str = "nvml"
    """Which probe this is (``nvml``, ``amd``, ``gaudi``): the debug dump's first line and the
    instrumentation scope ``gputally.probes.<probe>``."""


@dataclass
class _Delivery:
    exporter_id: str
    telemetry: SelfTelemetry
    expected: dict[Signal, int]

    def settled(self) -> bool:
        """True once the exporter has sent (or given up on) every item handed to it."""
        for kind, items in self.expected.items():
            labels = {"exporter": self.exporter_id, "signal": kind.value}
            registry = self.telemetry.registry
            sent = registry.get_sample_value("gputally_exporter_sent_items_total", labels) or 0.0
            failed = registry.get_sample_value("gputally_exporter_send_failed_items_total", labels) or 0.0
            if sent + failed < items:
                return False
        return True

    def failed(self) -> bool:
        return any(
            (self.telemetry.registry.get_sample_value(
                "gputally_exporter_send_failed_items_total", {"exporter": self.exporter_id, "signal": s.value}
            ) or 0.0) > 0
            for s in self.expected
        )


class Runner:
    """Drives a :class:`Collector` and hands what it collects to an exporter and/or the screen."""

    def __init__(
        self,
        collector: Collector,
        *,
        options: ProbeOptions,
        exporter: Exporter | None = None,
        exporter_id: str = "otlp",
        telemetry: SelfTelemetry | None = None,
        out: TextIO | None = None,
        on_cycle: Callable[[Cycle], None] | None = None,
        allocations: PodAllocations | None = None,
    ) -> None:
        """``allocations``: the kubelet's PodResources on this node; each cycle's GPUs then carry
        their holders (asked beside the collection, before the debug print and the export)."""
        self._collector = collector
        self._allocations = allocations
        self._options = options
        self._exporter = exporter
        self._out = out or sys.stdout
        self._on_cycle = on_cycle
        self._stop = asyncio.Event()
        self._refusing = False
        self._failing = False
        self._delivery = _Delivery(exporter_id, telemetry or SelfTelemetry(), {Signal.METRICS: 0, Signal.LOGS: 0})
        self._encoder: OtlpEncoder | None = None
        self.cycles = 0

    def stop(self) -> None:
        """Finish the current cycle and return (what SIGTERM and SIGINT call)."""
        self._stop.set()

    async def run(self) -> int:
        """0 when the run ended normally; 1 when ``once`` could not read NVML or deliver."""
        loop = asyncio.get_running_loop()
        installed = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, self.stop)
                installed.append(signum)
        if self._exporter is not None:
            await self._exporter.start()
        code = 0
        try:
            code = await self._loop()
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)
            await self._collector.close()
            if self._allocations is not None:
                await self._allocations.close()
            if self._exporter is not None:
                code = max(code, await self._finish_delivery())
        return code

    async def _loop(self) -> int:
        interval = self._options.interval_s
        next_tick = time.monotonic()
        while True:
            cycle = await self._collect()
            self.cycles += 1
            if self._options.debug:
                self._out.write(render(cycle, title=self._options.title, probe=self._options.probe))
                self._out.flush()
            if self._on_cycle is not None:
                self._on_cycle(cycle)
            if self._exporter is not None:
                await self._export(cycle)
            if self._options.once:
                return 1 if not cycle.entities and cycle.problems else 0
            next_tick += interval
            now = time.monotonic()
            if next_tick < now:  # the cycle overran: skip the ticks it missed
                next_tick += ((now - next_tick) // interval + 1) * interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=next_tick - now)
            if self._stop.is_set():
                return 0

    async def _collect(self) -> Cycle:
        """One collection; a bug in it is logged (once per spell) and the loop goes on."""
        try:
            if self._allocations is None:
                cycle = await self._collector.collect()
            else:
                cycle, _ = await asyncio.gather(self._collector.collect(), self._allocations.refresh())
                self._allocations.decorate(cycle.entities)
        except Exception:
            if not self._failing:
                log.exception("a collection failed; trying again next cycle")
            self._failing = True
            return Cycle(time_ns=time.time_ns(), duration_s=0.0, entities=[], logs=[],
                         problems=["the collection failed (see the log)"])
        if self._failing:
            log.info("collections work again")
            self._failing = False
        return cycle

    async def _export(self, cycle: Cycle) -> None:
        if self._encoder is None:
            from gputally.probes.otlp_shape import OtlpEncoder

            self._encoder = OtlpEncoder(scope_name=f"gputally.probes.{self._options.probe}")
        batches = []
        if cycle.entities:
            batches.append(Batch(Signal.METRICS, message=self._encoder.metrics(cycle.entities, cycle.time_ns)))
        if cycle.logs:
            batches.append(Batch(Signal.LOGS, message=self._encoder.logs(cycle.logs, time.time_ns())))
        assert self._exporter is not None
        for batch in batches:
            try:
                await self._exporter.export(batch)
            except Refused as exc:
                if not self._refusing:
                    log.warning("the exporter refused a collection (%s); data is dropped until it accepts again", exc)
                self._refusing = True
                continue
            self._delivery.expected[batch.signal] += batch.items
            if self._refusing:
                log.info("the exporter accepts data again")
                self._refusing = False

    async def _finish_delivery(self) -> int:
        """With ``once``, keep retrying until everything is sent or the drain timeout passes."""
        assert self._exporter is not None
        code = 0
        if self._options.once:
            deadline = time.monotonic() + self._options.drain_timeout_s
            while not self._delivery.settled() and time.monotonic() < deadline and not self._stop.is_set():
                await asyncio.sleep(0.05)
            if self._refusing or not self._delivery.settled() or self._delivery.failed():
                log.error("the collection was not delivered within %g s", self._options.drain_timeout_s)
                code = 1
        await self._exporter.shutdown()
        return code

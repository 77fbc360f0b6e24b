"""The probe's loop: collect every interval, print (``--debug``) and/or export, stop on SIGTERM.

Delivery goes through the server's own ``otlp``/``otlphttp`` exporter, found by type in the
registry (:mod:`gputally.probes.delivery`): the same bounded
queue (optionally on disk), retry with backoff and OTLP status handling, so a receiver restart
costs nothing but a delay. A full queue refuses the cycle's data, which is logged (once until
delivery recovers) and counted by the exporter; the loop never waits on the network. What
became of each accepted batch the exporter tells a :class:`~gputally.probes.delivery.exporter.DeliveryTally`;
with ``once`` the runner awaits it (or the drain timeout) before it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from gputally.errors import Refused
from gputally.otlp.batch import Batch, Signal
from gputally.probes.core.collector import Collector
from gputally.probes.core.debug import render
from gputally.probes.core.model import Cycle
from gputally.probes.delivery.exporter import DeliveryTally, ProbeExporter, counted

if TYPE_CHECKING:
    from gputally.probes.core.allocations import PodAllocations
    from gputally.probes.core.otlp_shape import OtlpEncoder

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
    metrics_only: bool = False
    """Send no logs (events), for a server without a logs pipeline."""
    summary_interval_s: float = 300.0
    """Seconds between two summary lines at info (cycles, GPUs, points sent, failures, queue);
    0: only the final one."""


class Runner:
    """Drives a :class:`Collector` and hands what it collects to an exporter and/or the screen."""

    def __init__(
        self,
        collector: Collector,
        *,
        options: ProbeOptions,
        exporter: ProbeExporter | None = None,
        out: TextIO | None = None,
        on_cycle: Callable[[Cycle], None] | None = None,
        allocations: PodAllocations | None = None,
        diagnose: Callable[[], Awaitable[str | None]] | None = None,
    ) -> None:
        """``allocations``: the kubelet's PodResources on this node; each cycle's GPUs then carry
        their holders (asked beside the collection, before the debug print and the export).
        ``diagnose``: asked once, after the first failed attempt, why the server cannot be
        reached when that is a setting of ours (TLS against plaintext); its answer is logged."""
        self._collector = collector
        self._allocations = allocations
        self._options = options
        self._exporter = exporter
        self._out = out or sys.stdout
        self._on_cycle = on_cycle
        self._stop = asyncio.Event()
        self._refusing = False
        self._failing = False
        self._delivery = DeliveryTally(self._attempt_failed)
        if exporter is not None:
            exporter.add_listener(self._delivery)
        self._diagnose = diagnose
        self._diagnosis: asyncio.Task[str | None] | None = None
        self._mismatch: str | None = None
        self._mismatch_found = asyncio.Event()
        self._send_logs = not options.metrics_only
        self._encoder: OtlpEncoder | None = None
        self.cycles = 0
        self._gpus = 0
        self._processes = 0
        self._engines = 0
        self._last_summary = time.monotonic()

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
            if self._diagnosis is not None and not self._diagnosis.done():
                self._diagnosis.cancel()
            if not self._options.once:
                log.info("%s (final)", self.summary())
        return code

    def summary(self) -> str:
        """One line: cycles, GPUs and processes in the last one, what was sent, the queue."""
        line = (f"probe {self._options.probe}: {counted(self.cycles, 'cycle')}, {counted(self._gpus, 'GPU')}, "
                f"{counted(self._processes, 'process', 'processes')}")
        if self._engines:
            line += f", {counted(self._engines, 'engine')}"
        if self._exporter is None:
            return line
        return (f"{line}; {self._delivery.summary()}; "
                f"queue {self._exporter.queued}/{self._exporter.capacity} batches")

    def _attempt_failed(self, signal: Signal, error: Exception) -> None:
        del signal, error
        if self._diagnose is not None and self._diagnosis is None:
            self._diagnosis = asyncio.get_running_loop().create_task(self._run_diagnosis(), name="probe TLS check")

    async def _run_diagnosis(self) -> str | None:
        assert self._diagnose is not None
        try:
            found = await self._diagnose()
        except Exception:  # a diagnosis is a courtesy: never a reason to stop
            log.debug("the connection check failed", exc_info=True)
            return None
        if found:
            self._mismatch = found
            self._mismatch_found.set()
            log.error("%s", found)
        return found

    async def _loop(self) -> int:
        interval = self._options.interval_s
        next_tick = time.monotonic()
        while True:
            cycle = await self._collect()
            self.cycles += 1
            self._gpus = sum(1 for e in cycle.entities if e.kind == "gpu")
            self._processes = sum(1 for e in cycle.entities if e.kind == "process")
            self._engines = sum(1 for e in cycle.entities if e.kind == "engine")
            if self._options.debug:
                self._out.write(render(cycle, title=self._options.title, probe=self._options.probe))
                self._out.flush()
            if self._on_cycle is not None:
                self._on_cycle(cycle)
            if self._exporter is not None:
                await self._export(cycle)
            if self._options.once:
                devices = [e for e in cycle.entities if e.kind != "engine"]  # engines alone are no collection
                return 1 if not devices and cycle.problems else 0
            every = self._options.summary_interval_s
            if every > 0 and time.monotonic() - self._last_summary >= every:
                self._last_summary = time.monotonic()
                log.info("%s", self.summary())
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
            from gputally.probes.core.otlp_shape import OtlpEncoder

            self._encoder = OtlpEncoder(scope_name=f"gputally.probes.{self._options.probe}")
        batches = []
        if cycle.entities:
            batches.append(Batch(Signal.METRICS, message=self._encoder.metrics(cycle.entities, cycle.time_ns)))
        self._note_logs_unimplemented()
        if cycle.logs and self._send_logs:
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
            self._delivery.handed(batch)
            if self._refusing:
                log.info("the exporter accepts data again")
                self._refusing = False

    def _note_logs_unimplemented(self) -> None:
        """Said once: the server refused logs for want of a logs pipeline; send none from now on."""
        if self._send_logs and self._delivery.logs_unimplemented:
            self._send_logs = False
            log.warning("the server has no logs pipeline (it answers UNIMPLEMENTED for logs): the probe's "
                        "events (XID errors, throttling, processes starting and ending) are not kept there; "
                        "sending metrics only from now on (--metrics-only does so from the start)")

    async def _finish_delivery(self) -> int:
        """With ``once``, keep retrying until everything is sent or the drain timeout passes."""
        assert self._exporter is not None
        code = 0
        if self._options.once:
            await _first_of(self._delivery.wait_settled(), self._stop.wait(), self._mismatch_found.wait(),
                            timeout=self._options.drain_timeout_s)
            self._note_logs_unimplemented()
            if self._mismatch is not None:
                log.error("the collection was not delivered (the TLS setting, above)")
                code = 1
            elif self._refusing or not self._delivery.is_settled() or self._delivery.failed():
                log.error("the collection was not delivered within %g s (%s)", self._options.drain_timeout_s,
                          self._delivery.summary())
                code = 1
            else:
                log.info("delivered: %s", self.summary())
        await self._exporter.shutdown()
        return code


async def _first_of(*waits: Coroutine[Any, Any, Any], timeout: float) -> None:
    """Return when the first of ``waits`` is done, or after ``timeout`` seconds."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

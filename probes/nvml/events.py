"""NVML events (XID, ECC, GPU unavailable) without blocking the collection loop.

A daemon thread waits on the NVML event set in short slices (``nvmlEventSetWait`` with a
timeout, so it notices a stop within one slice) and puts what arrives on a queue; each cycle
drains the queue without waiting. Events become OTLP log records, and XIDs are also counted
in ``hw.errors`` with their code.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter

from gputally.probes.core.model import AttrValue, Entity, LogEntry, Severity
from gputally.probes.nvml.errors import NvmlCallFailed
from gputally.probes.nvml.source import EventWatch, GpuEvent

__all__ = ["XID_MEANINGS", "EventPump", "XidCounts", "event_log"]

log = logging.getLogger(__name__)

XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
"""What the common XIDs mean (NVIDIA's XID catalog), for the log line."""

_SEVERITY = {"xid": Severity.ERROR, "ecc_uncorrected": Severity.ERROR, "gpu_unavailable": Severity.ERROR}


def event_log(event: GpuEvent, entity: Entity) -> LogEntry:
    """The log record for one event, on its GPU's resource."""
    attributes: dict[str, AttrValue] = {"gputally.gpu.event.kind": event.kind}
    if event.kind == "xid":
        meaning = XID_MEANINGS.get(event.data, "see NVIDIA's XID catalog")
        body = f"XID {event.data} on GPU {entity.label}: {meaning}"
        attributes["gputally.gpu.xid"] = event.data
    else:
        body = f"{event.kind} on GPU {entity.label} (data {event.data})"
        attributes["gputally.gpu.event.data"] = event.data
    if event.gpu_instance_id is not None:
        attributes["gputally.gpu.mig.gpu_instance_id"] = event.gpu_instance_id
    return LogEntry(
        entity=entity,
        time_ns=event.time_ns,
        severity=_SEVERITY.get(event.kind, Severity.WARN),
        event_name=f"gputally.gpu.{event.kind}",
        body=body,
        attributes=attributes,
    )


class XidCounts:
    """XIDs seen since the probe started, by GPU and code (the ``hw.errors`` xid counter)."""

    def __init__(self) -> None:
        self._counts: dict[str, Counter[int]] = {}

    def add(self, event: GpuEvent) -> None:
        if event.kind == "xid":
            self._counts.setdefault(event.gpu_uuid, Counter())[event.data] += 1

    def of(self, gpu_uuid: str) -> dict[int, int]:
        return dict(self._counts.get(gpu_uuid, {}))


class EventPump:
    """Runs ``watch.wait`` in a thread and queues the events for the loop to drain."""

    def __init__(self, watch: EventWatch, *, slice_ms: int = 500) -> None:
        self._watch = watch
        self._slice_ms = slice_ms
        self._queue: queue.SimpleQueue[GpuEvent] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        failures = 0
        try:
            while not self._stop.is_set():
                try:
                    events = self._watch.wait(self._slice_ms)
                    failures = 0
                except NvmlCallFailed as exc:
                    failures += 1
                    if failures == 1:
                        log.warning("waiting for NVML events failed: %s; retrying", exc)
                    self._stop.wait(min(failures * self._slice_ms / 1000, 30.0))
                    continue
                except Exception:
                    log.exception("the NVML event thread failed; no more events this run")
                    return
                for event in events:
                    self._queue.put(event)
        finally:
            self._watch.close()

    def drain(self) -> list[GpuEvent]:
        """Every event queued so far; never waits."""
        events = []
        while True:
            try:
                events.append(self._queue.get_nowait())
            except queue.Empty:
                return events

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

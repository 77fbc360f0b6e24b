"""Node probes: read GPUs on a node and send raw telemetry as OTLP to ``gputally serve``.

NVIDIA (``gputally probe nvml``), in layers::

    DeviceSource   nvml_source (live, pynvml) | replay_source (recordings) | record (wraps either)
    ProcessInfoSource   hints.ProcFs (a host /proc) | replay_source (recorded proc_facts)
        -> collector   one cycle: NVML initialised once, GPUs read concurrently in worker threads
        -> entities    readings -> entities with points and log entries, through the pure mapping
                       modules device_metrics, process_metrics, gpm, events (catalog names them)
        -> allocations the kubelet's PodResources on the node: each GPU's and MIG device's holders
                       (``gputally.k8s.podresources.holders``), for every vendor's probe
        -> otlp_shape  entities -> OTLP requests (one Resource per GPU, MIG device, GPU process)
        -> runner      the interval loop: debug print and/or the server's exporter (queue, retry)

Names are re-exported lazily, so ``import gputally.probes`` (which every ``gputally`` command
does through the CLI) costs nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Collector",
    "NvmlCallFailed",
    "NvmlError",
    "NvmlSource",
    "NvmlUnavailable",
    "OtlpEncoder",
    "ProbeOptions",
    "ProcFs",
    "RecordingSource",
    "ReplaySource",
    "Runner",
]

_HOMES = {
    "Collector": "collector",
    "NvmlCallFailed": "errors",
    "NvmlError": "errors",
    "NvmlSource": "nvml_source",
    "NvmlUnavailable": "errors",
    "OtlpEncoder": "otlp_shape",
    "ProbeOptions": "runner",
    "ProcFs": "hints",
    "RecordingSource": "record",
    "ReplaySource": "replay_source",
    "Runner": "runner",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gputally.probes' has no attribute {name!r}")
    return getattr(importlib.import_module(f"gputally.probes.{home}"), name)

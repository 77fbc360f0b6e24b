"""Node probes: read GPUs on a node and send raw telemetry as OTLP to ``gputally serve``.

A vendor-neutral core here, one subpackage per vendor::

    nvml/    NVIDIA (``gputally probe nvml``): NVML read field by field; live, replay, record
    amd/     AMD (``gputally probe amd``): amdsmi snapshots
    gaudi/   Intel Gaudi (``gputally probe gaudi``): hl-smi and NIC-port sysfs snapshots

    model, catalog, status   entities, points and log entries; every metric's name; hw.status
    procfacts, hints         what /proc says about a GPU process -> attribution hints
    counters                 start times of cumulative points
    snapshot*                what the AMD and Gaudi probes share: the snapshot source, its
                             replay and recording, and the collector
    collector                the Collector protocol every vendor's collector satisfies
    allocations              the kubelet's PodResources: each GPU's holders, for every vendor
    otlp_shape, debug        entities -> OTLP requests; the ``--debug`` view
    runner, delivery         the interval loop; the server's exporter (queue, retry) from flags
    cli, command             ``gputally probe`` dispatch; the options every probe shares

Nothing here imports a vendor subpackage except :mod:`~gputally.probes.cli`, the dispatch.
Names are re-exported lazily, so ``import gputally.probes`` (which every ``gputally`` command
does through the CLI) costs nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Collector", "OtlpEncoder", "ProbeOptions", "ProcFacts", "ProcFs", "Runner"]

_HOMES = {
    "Collector": "collector",
    "OtlpEncoder": "otlp_shape",
    "ProbeOptions": "runner",
    "ProcFacts": "procfacts",
    "ProcFs": "hints",
    "Runner": "runner",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gputally.probes' has no attribute {name!r}")
    return getattr(importlib.import_module(f"gputally.probes.{home}"), name)

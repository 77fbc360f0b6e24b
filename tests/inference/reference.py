"""The served models' GPU accounts computed again, outside gputally, from the probe's own
requests: what the end-to-end test holds ``usage``'s model counters to (issue 33, "GPU-s, J
and cost per 1M tokens equal an independent calculation from the same recording").

Per GPU interval (two consecutive readings the probe sent), each owner's allocated time, busy
time and energy follow the split rules of ``processors/usage/README.md`` as
``tests/processors/usage/series.expected`` writes them down, with each process named by the
cgroup the probe sent for it in that reading (a pod's uid; ``unattributed`` for none). That
owner's increase goes to its served model when its engine counts on the GPU: the engine's
latest successful read (one with token counters), up to this reading, listed the GPU and is
within ``max_gap`` of it. Each owner here runs one engine with one model, so the share is 1.
Cost: allocated hours x price + kWh x energy price; busy basis: busy hours x price + kWh x
energy price.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from tests.processors.usage.series import expected, readings

__all__ = ["Cycle", "cycles", "model_accounts"]

ENGINE = "gputally.inference.engine"
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
UNATTRIBUTED = "unattributed"


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return getattr(value, kind) if kind else None


def _attributes(message: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in message.attributes}


def pod_of(cgroup: object) -> str:
    """The pod uid a cgroup path names, as the kubelet writes it (``pod<uid>``, ``_`` for ``-``
    under systemd); ``unattributed`` for none."""
    found = _POD_UID.search(cgroup) if isinstance(cgroup, str) else None
    return found.group(1).replace("_", "-") if found else UNATTRIBUTED


@dataclass
class Cycle:
    """One request of the probe: its GPU and process resources, and what its engines said."""

    gpu: ExportMetricsServiceRequest
    """The request without its engine resources (the usage reference reads it)."""
    owners: dict[int, str] = field(default_factory=dict)
    """pid -> the pod its cgroup names, for each GPU process."""
    engines: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)
    """Owner -> (time, GPUs listed) of each engine read with token counters in this cycle."""


def cycles(requests: Sequence[ExportMetricsServiceRequest]) -> list[Cycle]:
    out = []
    for request in requests:
        cycle = Cycle(ExportMetricsServiceRequest())
        for rm in request.resource_metrics:
            resource = _attributes(rm.resource)
            if ENGINE not in resource:
                cycle.gpu.resource_metrics.append(rm)
                if "process.pid" in resource:
                    cycle.owners[int(resource["process.pid"])] = pod_of(resource.get("process.linux.cgroup"))
                continue
            tokens = [m for sm in rm.scope_metrics for m in sm.metrics if m.name == "gputally.inference.tokens"]
            if tokens and tokens[0].sum.data_points:
                time_ns = tokens[0].sum.data_points[0].time_unix_nano
                gpus = resource.get("gputally.inference.gpu.ids") or ()
                cycle.engines[pod_of(resource.get("process.linux.cgroup"))] = (time_ns, tuple(gpus))
        out.append(cycle)
    return out


def model_accounts(requests: Sequence[ExportMetricsServiceRequest], *, gpu: str, holders: Sequence[str],
                   price: float, energy_price: float, max_gap_s: float = 120.0) -> dict[str, dict[str, float]]:
    """Owner -> its served model's allocated, busy (s), energy (J), cost and busy cost on ``gpu``."""
    found = cycles(requests)
    series = readings([c.gpu for c in found])
    latest: dict[str, tuple[int, tuple[str, ...]]] = {}
    out: dict[str, dict[str, float]] = {}
    for n, cycle in enumerate(found):
        latest.update(cycle.engines)
        if n == 0:
            continue
        owners = cycle.owners
        increase = expected(series[n - 1:n + 1], owner_of=lambda pid: owners.get(pid, UNATTRIBUTED), holders=holders)
        for owner, (time_ns, gpus) in latest.items():
            if gpu not in gpus or abs(series[n].time_ns - time_ns) > max_gap_s * 1e9 or owner not in increase:
                continue
            row = out.setdefault(owner, {"allocated": 0.0, "busy": 0.0, "energy": 0.0})
            for name in row:
                row[name] += increase[owner][name]
    for row in out.values():
        row["cost"] = row["allocated"] / 3600 * price + row["energy"] / 3.6e6 * energy_price
        row["busy_cost"] = row["busy"] / 3600 * price + row["energy"] / 3.6e6 * energy_price
    return out


def observed_seconds(requests: Sequence[ExportMetricsServiceRequest]) -> float:
    """The GPU's observed time: from its first reading to its last."""
    series = readings([c.gpu for c in cycles(requests)])
    return (series[-1].time_ns - series[0].time_ns) / 1e9

"""The three-workload H200 time series as the probe sends it, and the expected usage computed
straight from it.

``../shared/fixtures/nvml/h200-three-workloads-timeseries.json`` is ten real readings of one
H200 about 2 s apart: pid 448 a trainer in a guaranteed pod, pid 449 a notebook in a burstable
pod (gone before the seventh reading), pid 450 a Slurm job's process that holds memory and
never computes. `probe_requests` replays it through the NVIDIA probe with the recording's own
sample times (shifted to ``base_ns``), `readings` reads back what the probe said, and
`expected` applies the README's split rules to those readings in the plainest way, as the
reference the processor's counters must equal.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue

from gputally.probes.core.otlp_shape import OtlpEncoder
from gputally.probes.nvml.collector import NvmlCollector
from gputally.probes.nvml.replay import ReplaySource, load_recording

TIMESERIES = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "nvml" / "h200-three-workloads-timeseries.json"
GPU = load_recording(TIMESERIES)["device"]["uuid"]
TRAINER_PID, NOTEBOOK_PID, HOLDER_PID = 448, 449, 450
RECORDED_JOB = 90210


def recorded_uid(pid: int) -> str:
    """The pod uid in the recorded cgroup of ``pid`` (systemd driver: underscores in the slice)."""
    data = load_recording(TIMESERIES)
    cgroup = data["snapshots"][0]["proc_facts"][str(pid)]["cgroup"]
    part = next(p for p in cgroup.split("/") if "-pod" in p and p.endswith(".slice"))
    return part.rsplit("-pod", 1)[1].removesuffix(".slice").replace("_", "-")


def recording(*, uids: Mapping[str, str] | None = None, job: int | None = None) -> dict[str, Any]:
    """The time series with recorded pod uids replaced by ``uids`` and the job id by ``job``
    (the API server and slurmctld choose those)."""
    data = copy.deepcopy(load_recording(TIMESERIES))
    for snapshot in data["snapshots"]:
        for facts in snapshot.get("proc_facts", {}).values():
            cgroup = facts.get("cgroup") or ""
            for old, new in (uids or {}).items():
                cgroup = cgroup.replace(old.replace("-", "_"), new.replace("-", "_"))
            if job is not None:
                cgroup = cgroup.replace(f"/job_{RECORDED_JOB}/", f"/job_{job}/")
                env = facts.get("env_selected", {})
                if env.get("SLURM_JOB_ID") == str(RECORDED_JOB):
                    env["SLURM_JOB_ID"] = str(job)
            if cgroup:
                facts["cgroup"] = cgroup
    return data


async def probe_requests(data: Mapping[str, Any], *, base_ns: int, node: str = "gpu-node-7",
                         cycles: int | None = None, allocations: Any = None) -> list[ExportMetricsServiceRequest]:
    """What the probe sends for each reading, stamped with the reading's own time (moved so the
    first reading is at ``base_ns``); with ``allocations`` (a `PodAllocations`), its holders
    and uids hints on the GPU, as the probe asks the kubelet and the runtime beside each cycle."""
    snapshots = data["snapshots"]
    first = float(snapshots[0]["time"])
    times = iter([base_ns - 10**9] + [base_ns + round((float(s["time"]) - first) * 1e9) for s in snapshots])
    source = ReplaySource(copy.deepcopy(dict(data)))
    probe = NvmlCollector(source, source, node_name=node, events=False, clock=lambda: next(times))
    encoder = OtlpEncoder()
    try:
        requests = []
        for _ in range(cycles or len(snapshots)):
            cycle = await probe.collect()
            if allocations is not None:
                await allocations.refresh()
                allocations.decorate(cycle.entities)
            requests.append(encoder.metrics(cycle.entities, cycle.time_ns))
        return requests
    finally:
        await probe.close()


@dataclass
class Reading:
    """What one request says about the GPU: the reference's input."""

    time_ns: int
    utilization: float
    energy_j: float
    memory_limit: float
    processes: dict[int, tuple[float, float]] = field(default_factory=dict)
    """pid -> (utilization, memory)."""


def _attrs(message: Any) -> dict[str, Any]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in message.attributes}


def readings(requests: Sequence[ExportMetricsServiceRequest]) -> list[Reading]:
    out = []
    for request in requests:
        gpu: dict[str, float] = {}
        processes: dict[int, dict[str, float]] = {}
        time_ns = 0
        for rm in request.resource_metrics:
            resource = _attrs(rm.resource)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for point in getattr(metric, metric.WhichOneof("data")).data_points:
                        if _attrs(point).get("hw.gpu.task", "general") != "general":
                            continue
                        value = point.as_double if point.WhichOneof("value") == "as_double" else float(point.as_int)
                        if "process.pid" in resource:
                            processes.setdefault(resource["process.pid"], {})[metric.name] = value
                        else:
                            gpu[metric.name] = value
                            time_ns = point.time_unix_nano
        out.append(Reading(
            time_ns=time_ns, utilization=gpu["hw.gpu.utilization"], energy_j=gpu["hw.energy"],
            memory_limit=gpu["hw.gpu.memory.limit"],
            processes={pid: (v.get("gputally.gpu.process.utilization", 0.0), v["gputally.gpu.process.memory.usage"])
                       for pid, v in processes.items()},
        ))
    return out


Counters = dict[str, dict[str, float]]


def expected(series: Sequence[Reading], *, owner_of: Callable[[int], str], holders: Sequence[str],
             idle_below: float = 0.05) -> Counters:
    """allocated / busy / idle / energy (J) / peak memory per owner, from the split rules."""
    holders = list(holders) or ["unallocated"]
    out: Counters = {}

    def add(owner: str, counter: str, value: float) -> None:
        out.setdefault(owner, {"allocated": 0.0, "busy": 0.0, "idle": 0.0, "energy": 0.0, "peak": 0.0})
        out[owner][counter] += value

    for reading in series:
        memory: dict[str, float] = {}
        for pid, (_, used) in reading.processes.items():
            memory[owner_of(pid)] = memory.get(owner_of(pid), 0.0) + used
        for owner, used in memory.items():
            add(owner, "peak", 0.0)
            out[owner]["peak"] = max(out[owner]["peak"], used)
    for before, now in zip(series, series[1:], strict=False):
        dt = (now.time_ns - before.time_ns) / 1e9
        busy = now.utilization * dt
        weights: dict[str, float] = {}
        for pid, (utilization, _) in now.processes.items():
            weights[owner_of(pid)] = weights.get(owner_of(pid), 0.0) + utilization
        weights = {o: w for o, w in weights.items() if w > 0}
        if busy > 0 and weights:
            shares = {o: w / sum(weights.values()) for o, w in weights.items()}
        elif busy > 0:
            present = sorted({owner_of(pid) for pid in now.processes}) or holders
            shares = {o: 1 / len(present) for o in present}
        else:
            shares = {}
        energy = now.energy_j - before.energy_j
        for owner, share in (shares or {h: 1 / len(holders) for h in holders}).items():
            add(owner, "energy", energy * share)
        for owner, share in shares.items():
            add(owner, "busy", busy * share)
        for holder in holders:
            add(holder, "allocated", dt / len(holders))
            utilization = now.utilization if holder == "unallocated" else busy * shares.get(holder, 0) / (dt / len(holders))
            if utilization < idle_below:
                add(holder, "idle", dt / len(holders))
    return out


def with_attributes(request: ExportMetricsServiceRequest, *, processes: Mapping[int, Mapping[str, Any]],
                    gpu: Mapping[str, Any]) -> ExportMetricsServiceRequest:
    """A copy of ``request`` with attributes added to process resources (by pid) and to GPU
    resources: what ``k8s`` and ``slurm`` would have written, for tests without them."""
    out = ExportMetricsServiceRequest.FromString(request.SerializeToString())
    for rm in out.resource_metrics:
        resource = _attrs(rm.resource)
        added = processes.get(resource["process.pid"], {}) if "process.pid" in resource else gpu
        for key, value in added.items():
            if isinstance(value, list | tuple):
                any_value = AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=v) for v in value]))
            elif isinstance(value, int):
                any_value = AnyValue(int_value=value)
            else:
                any_value = AnyValue(string_value=value)
            rm.resource.attributes.append(KeyValue(key=key, value=any_value))
    return out

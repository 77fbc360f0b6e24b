"""A realistic OTLP request from one 8-GPU node: what the NVML probe sends each cycle.

8 GPU resources x 30 metrics (one point each, a few with a sensor/task attribute) plus 10
GPU-process resources x 10 metrics: 340 data points, about 40 KB encoded.
"""

from __future__ import annotations

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

GPUS = 8
GPU_METRICS = 30
PROCESSES = 10
PROCESS_METRICS = 10


def _attr(target, key: str, value: str | int) -> None:  # type: ignore[no-untyped-def]
    kv = target.add()
    kv.key = key
    if isinstance(value, int):
        kv.value.int_value = value
    else:
        kv.value.string_value = value


def gpu_node_request(node: str = "gpu-node-001", now_ns: int = 1_795_977_093_000_000_000) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    for gpu in range(GPUS):
        resource = request.resource_metrics.add()
        attrs = resource.resource.attributes
        _attr(attrs, "hw.id", f"GPU-1e061ec2-3930-fe87-1e34-cb91101c1b{gpu:02d}")
        _attr(attrs, "hw.type", "gpu")
        _attr(attrs, "hw.name", "NVIDIA H200")
        _attr(attrs, "hw.vendor", "NVIDIA")
        _attr(attrs, "hw.gpu.index", gpu)
        _attr(attrs, "hw.gpu.pci_bus_id", f"00000000:{0x18 + gpu:02X}:00.0")
        _attr(attrs, "host.name", node)
        _attr(attrs, "hw.driver_version", "580.159.04")
        scope = resource.scope_metrics.add()
        scope.scope.name = "gputally.probes.nvml"
        scope.scope.version = "0.1.0"
        for index in range(GPU_METRICS):
            metric = scope.metrics.add()
            metric.name = f"hw.gpu.metric_{index:02d}"
            metric.unit = "1"
            if index % 3 == 0:
                point = metric.sum.data_points.add()
                metric.sum.is_monotonic = True
                metric.sum.aggregation_temporality = 2
                point.as_int = 38_410_753 + index
            else:
                point = metric.gauge.data_points.add()
                point.as_double = 0.25 * index
            point.time_unix_nano = now_ns
            point.start_time_unix_nano = now_ns - 10_000_000_000
            if index % 5 == 0:
                _attr(point.attributes, "hw.gpu.task", "general")
    for pid in range(PROCESSES):
        resource = request.resource_metrics.add()
        attrs = resource.resource.attributes
        _attr(attrs, "hw.id", f"GPU-1e061ec2-3930-fe87-1e34-cb91101c1b{pid % GPUS:02d}")
        _attr(attrs, "process.pid", 4000 + pid)
        _attr(
            attrs,
            "process.linux.cgroup",
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6ee8558e_a273_417d_9a57_"
            f"57f3c7773b{pid:02d}.slice/cri-containerd-2cbbbe2a{pid:056d}.scope",
        )
        _attr(attrs, "process.executable.name", "python3")
        _attr(attrs, "host.name", node)
        scope = resource.scope_metrics.add()
        scope.scope.name = "gputally.probes.nvml"
        for index in range(PROCESS_METRICS):
            metric = scope.metrics.add()
            metric.name = f"hw.gpu.process.metric_{index:02d}"
            metric.unit = "By" if index == 0 else "1"
            point = metric.gauge.data_points.add()
            point.as_double = 0.1 * index
            point.time_unix_nano = now_ns
    return request

"""The Prometheus harness against a real server: OTLP in, PromQL out.

These tests pin what Prometheus (the version build.sh builds) makes of gputally's OTLP
shapes, which the alert rules in collector-config/alerts/ and any dashboard depend on; the
observed translation is written up in tests/harness/prometheus/README.md.
"""

from __future__ import annotations

import time

from harness.prometheus import otlp
from harness.prometheus.server import Prometheus

GPU = {
    "service.name": "gputally",
    "hw.id": "GPU-1e061ec2-3930-fe87-1e34-cb91101c1bd9",
    "hw.model": "NVIDIA H200",
    "hw.vendor": "NVIDIA",  # not promoted: only on target_info
    "host.name": "gpu-node-7",
    "gputally.gpu.index": 0,
}


def wait_for(prom: Prometheus, promql: str, timeout: float = 10.0) -> list[dict]:
    """The query's result once it is non-empty (ingestion is synchronous, but be patient)."""
    deadline = time.monotonic() + timeout
    while True:
        result = prom.query(promql)
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


def test_usage_counter_is_queryable_by_its_promoted_owner_labels(prometheus: Prometheus) -> None:
    owner = {
        "gputally.usage.owner.kind": "slurm.job",
        "gputally.usage.owner.id": "4242",
        "slurm.job.id": "4242",
        "slurm.job.user": "alice",
        "slurm.job.partition": "gpu",
    }
    busy = otlp.counter("gputally.usage.busy.time", "s", [otlp.point(1234.5)])
    assert prometheus.post_otlp(otlp.request(otlp.resource({**GPU, **owner}, busy))) // 100 == 2

    result = wait_for(prometheus, 'gputally_usage_busy_time_seconds_total{gputally_usage_owner_id="4242"}')
    assert len(result) == 1, result
    labels, value = result[0]["metric"], float(result[0]["value"][1])
    assert value == 1234.5
    assert labels["__name__"] == "gputally_usage_busy_time_seconds_total"
    # Promoted resource attributes: dots become underscores in the name, values are kept as sent.
    assert labels["gputally_usage_owner_kind"] == "slurm.job"
    assert labels["slurm_job_user"] == "alice"
    assert labels["hw_id"] == GPU["hw.id"]
    assert labels["host_name"] == "gpu-node-7"
    assert labels["gputally_gpu_index"] == "0"
    assert labels["job"] == "gputally"  # service.name
    assert "hw_vendor" not in labels and "hw.vendor" not in labels
    # The rest of the resource lives on target_info, joined by job/instance.
    info = prometheus.query('target_info{job="gputally"}')
    assert [r["metric"].get("hw_vendor") for r in info] == ["NVIDIA"], info


# (OTLP name, unit, kind) -> the Prometheus name observed with build.sh's Prometheus and the
# default translation strategy (UnderscoreEscapingWithSuffixes).
TRANSLATION = [
    ("hw.gpu.utilization", "1", "gauge", "hw_gpu_utilization_ratio"),
    ("hw.status", "1", "updowncounter", "hw_status"),
    ("hw.errors", "{error}", "counter", "hw_errors_total"),
    ("hw.energy", "J", "counter", "hw_energy_joules_total"),
    ("hw.power", "W", "gauge", "hw_power_watts"),
    ("hw.temperature", "Cel", "gauge", "hw_temperature_celsius"),
    ("hw.gpu.memory.usage", "By", "updowncounter", "hw_gpu_memory_usage_bytes"),
    ("hw.gpu.io", "By", "counter", "hw_gpu_io_bytes_total"),
    ("gputally.gpu.clock.frequency", "Hz", "gauge", "gputally_gpu_clock_frequency_hertz"),
    ("gputally.gpu.clock.throttled", "1", "gauge", "gputally_gpu_clock_throttled_ratio"),
    ("gputally.gpu.clock.throttle.time", "s", "counter", "gputally_gpu_clock_throttle_time_seconds_total"),
    ("gputally.gpu.memory.remap.pending", "1", "gauge", "gputally_gpu_memory_remap_pending_ratio"),
    ("gputally.gpu.memory.remapped_rows", "{row}", "gauge", "gputally_gpu_memory_remapped_rows"),
    ("gputally.gpu.performance_state", "{pstate}", "gauge", "gputally_gpu_performance_state"),
    ("gputally.gpu.link.throughput", "By/s", "gauge", "gputally_gpu_link_throughput_bytes_per_second"),
    ("gputally.gpu.collection.duration", "s", "gauge", "gputally_gpu_collection_duration_seconds"),
    ("gputally.usage.idle.time", "s", "counter", "gputally_usage_idle_time_seconds_total"),
    ("gputally.usage.allocated.time", "s", "counter", "gputally_usage_allocated_time_seconds_total"),
]
MAKERS = {"gauge": otlp.gauge, "counter": otlp.counter, "updowncounter": otlp.updowncounter}


def test_otlp_names_translate_with_unit_and_type_suffixes(prometheus: Prometheus) -> None:
    metrics = [MAKERS[kind](name, unit, [otlp.point(1)]) for name, unit, kind, _ in TRANSLATION]
    prometheus.post_otlp(otlp.request(otlp.resource(GPU, *metrics)))
    wait_for(prometheus, "hw_power_watts")

    names = set(prometheus.api("label/__name__/values")) - {"target_info"}
    assert names == {expected for *_, expected in TRANSLATION}


def test_point_attribute_names_get_underscores_and_values_stay(prometheus: Prometheus) -> None:
    errors = otlp.counter("hw.errors", "{error}", [
        otlp.point(2, {"error.type": "xid", "gputally.gpu.xid": "79"}),
        otlp.point(5, {"error.type": "ecc_uncorrected"}),
    ])
    status = otlp.updowncounter("hw.status", "1", [
        otlp.point(v, {"hw.state": s}) for s, v in (("ok", 0), ("degraded", 0), ("failed", 1))
    ])
    throttled = otlp.gauge("gputally.gpu.clock.throttled", "1", [
        otlp.point(1, {"gputally.gpu.clock.event_reason": "hw_thermal_slowdown"}),
    ])
    prometheus.post_otlp(otlp.request(otlp.resource(GPU, errors, status, throttled)))

    xid = wait_for(prometheus, 'hw_errors_total{error_type="xid", gputally_gpu_xid="79"}')
    assert [float(r["value"][1]) for r in xid] == [2.0]
    assert [r["metric"]["hw_state"] for r in prometheus.query("hw_status == 1")] == ["failed"]
    reason = prometheus.query('gputally_gpu_clock_throttled_ratio{gputally_gpu_clock_event_reason="hw_thermal_slowdown"}')
    assert len(reason) == 1


def test_out_of_order_samples_inside_the_window_are_accepted(prometheus: Prometheus) -> None:
    now = time.time()
    gauge = otlp.gauge("gputally.gpu.collection.duration", "s", [otlp.point(0.02, at=now)])
    prometheus.post_otlp(otlp.request(otlp.resource(GPU, gauge)))
    wait_for(prometheus, "gputally_gpu_collection_duration_seconds")
    # A replayed sample 20 minutes older than the newest one (inside the 1h window).
    late = otlp.gauge("gputally.gpu.collection.duration", "s", [otlp.point(0.05, at=now - 1200)])
    prometheus.post_otlp(otlp.request(otlp.resource(GPU, late)))

    result = prometheus.query("gputally_gpu_collection_duration_seconds", time=now - 1200)
    assert [float(r["value"][1]) for r in result] == [0.05]


def test_without_service_name_there_is_no_job_and_no_target_info(prometheus: Prometheus) -> None:
    # The probe's resources carry no service.name: only promoted attributes survive.
    anonymous = {k: v for k, v in GPU.items() if k != "service.name"}
    prometheus.post_otlp(otlp.request(otlp.resource(anonymous, otlp.gauge("hw.power", "W", [otlp.point(700)]))))

    result = wait_for(prometheus, "hw_power_watts")
    assert result[0]["metric"] == {
        "__name__": "hw_power_watts", "hw_id": GPU["hw.id"], "hw_model": "NVIDIA H200",
        "host_name": "gpu-node-7", "gputally_gpu_index": "0",
    }
    assert prometheus.query("target_info") == []

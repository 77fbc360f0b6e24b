"""``gputally probe amd --replay`` -> its exporter -> a real ``gputally serve`` -> an OTLP sink."""

from __future__ import annotations

from support.otlp import OtlpSink

from tests.probes.amd.helpers import GPU0, GPU1, TWO_GPUS
from tests.probes.test_end_to_end import LOGS, attributes, vendor_replay_through_serve


async def test_one_amd_collection_reaches_the_backend_through_serve(otlp_sink: OtlpSink) -> None:
    message = await vendor_replay_through_serve(otlp_sink, "amd", TWO_GPUS)
    resources = [attributes(rm.resource.attributes) for rm in message.resource_metrics]
    assert {rm.scope_metrics[0].scope.name for rm in message.resource_metrics} == {"gputally.probes.amd"}
    processes = {r["process.pid"]: r for r in resources if "process.pid" in r}
    assert {pid: r["hw.id"] for pid, r in processes.items()} == {4242: GPU0, 4243: GPU0, 5150: GPU1}
    assert processes[5150]["process.linux.cgroup"] == "0::/system.slice/slurmstepd.scope/job_5150/step_0/user/task_0"
    assert all(r["host.name"] == "mi-1" for r in resources)
    metrics = {m.name: m for m in message.resource_metrics[0].scope_metrics[0].metrics}
    assert (metrics["hw.power"].unit, metrics["hw.power"].gauge.data_points[0].as_double) == ("W", 611.0)
    assert metrics["hw.energy"].unit == "J" and metrics["hw.energy"].sum.is_monotonic
    assert metrics["hw.gpu.utilization"].gauge.data_points[0].as_double == 0.97
    (logs,) = otlp_sink.messages(LOGS)
    assert logs.resource_logs[0].scope_logs[0].log_records[0].event_name == "gputally.gpu.snapshot"

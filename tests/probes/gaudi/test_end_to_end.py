"""``gputally probe gaudi --replay`` -> its exporter -> a real ``gputally serve`` -> an OTLP sink."""

from __future__ import annotations

from support.otlp import OtlpSink

from tests.probes.gaudi.test_gaudi import ACCEL0, FIXTURE
from tests.probes.test_end_to_end import LOGS, attributes, vendor_replay_through_serve


async def test_one_gaudi_collection_reaches_the_backend_through_serve(otlp_sink: OtlpSink) -> None:
    message = await vendor_replay_through_serve(otlp_sink, "gaudi", FIXTURE)
    resources = [attributes(rm.resource.attributes) for rm in message.resource_metrics]
    assert {rm.scope_metrics[0].scope.name for rm in message.resource_metrics} == {"gputally.probes.gaudi"}
    processes = {r["process.pid"]: r for r in resources if "process.pid" in r}
    assert {pid: r["hw.id"] for pid, r in processes.items()} == {31337: ACCEL0, 31338: ACCEL0}
    assert processes[31338]["process.linux.cgroup"] == "0::/system.slice/slurmstepd.scope/job_777/step_0/user/task_0"
    assert all(r["host.name"] == "mi-1" for r in resources)
    metrics = {m.name: m for m in message.resource_metrics[0].scope_metrics[0].metrics}
    assert resources[0]["hw.vendor"] == "Intel"
    assert (metrics["hw.power"].unit, metrics["hw.power"].gauge.data_points[0].as_double) == ("W", 712.0)
    assert metrics["hw.gpu.memory.usage"].sum.data_points[0].as_int == 98304 * 1024 * 1024
    links = {attributes(dp.attributes).get("gputally.gpu.link") for dp in metrics["hw.gpu.io"].sum.data_points}
    assert links == {"port0", "port1", "port2"}  # accel0's NIC ports, from the recording's netdev sysfs records
    speed = metrics["gputally.gpu.link.speed"]
    assert (speed.unit, [dp.as_int for dp in speed.gauge.data_points]) == ("bit/s", [200_000_000_000])
    (logs,) = otlp_sink.messages(LOGS)
    assert logs.resource_logs[0].scope_logs[0].log_records[0].event_name == "gputally.gpu.snapshot"

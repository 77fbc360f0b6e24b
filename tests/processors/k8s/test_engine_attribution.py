"""An engine's resource is attributed to its pod exactly as its container's GPU process is:
real processes in a real pod-shaped cgroup, discovered and read by the probe, encoded by the
probe's own OTLP shape, then through the ``k8s`` processor."""

from __future__ import annotations

from pathlib import Path

from gputally.otlp.batch import Batch, Signal
from gputally.probes.core.hints import ProcFs
from gputally.probes.core.otlp_shape import metrics_request
from gputally.probes.engines.collector import EngineCollector, EngineReads
from gputally.probes.engines.discover import Discovery
from gputally.probes.engines.options import parse_engine
from gputally.processors.k8s.model import KeyFilter, pod_from_json
from tests.probes.engines.pods import GPU, GpuCollector, PodCgroup, Reader, exposition, needs_cgroups

from .helpers import k8s_only, make, pod_json, resource_attrs

pytestmark = needs_cgroups


async def test_an_engine_gets_the_pod_of_its_container(pod: PodCgroup, tmp_path: Path) -> None:
    gpu = pod.gpu_process()
    pod.server(exposition=exposition(tmp_path), netns=True)
    procfs = ProcFs(Path("/proc"))
    reads = EngineReads(Reader(), walker=Discovery(processes=procfs), processes=procfs, node_name="node-a")
    collector = EngineCollector(GpuCollector([gpu.pid]), reads, deadline_s=2.0)
    cycle = await collector.collect()
    await collector.close()
    assert [e.kind for e in cycle.entities] == ["gpu", "process", "engine"]

    proc = make()
    no_filter = KeyFilter([])
    proc.runtime.store.upsert(pod_from_json(
        pod_json("vllm-0", namespace="serving", uid=pod.uid, containers={"vllm": pod.container_id}),
        labels=no_filter, annotations=no_filter))
    proc.runtime.store.synced = True
    batch = Batch.decode(Signal.METRICS, metrics_request(cycle.entities, cycle.time_ns).SerializeToString())
    out = await proc.process(batch)
    assert out is not None

    _, process, engine = resource_attrs(out)
    assert k8s_only(engine) == k8s_only(process)
    assert k8s_only(engine)["k8s.pod.uid"] == pod.uid
    assert k8s_only(engine)["k8s.container.name"] == "vllm"
    assert k8s_only(engine)["gputally.k8s.attribution"] == "cgroup"
    assert engine["gputally.inference.engine"] == "vllm" and engine["gputally.inference.gpu.pids"] == [gpu.pid]


async def test_an_explicit_engine_with_only_a_cgroup_gets_its_pod(pod: PodCgroup, tmp_path: Path) -> None:
    """`--engine URL,cgroup=PATH` (no pid: the probe names the container, not a process): the
    engine's resource carries only the cgroup, and k8s names the pod from it."""
    gpu = pod.gpu_process()
    port = pod.server(exposition=exposition(tmp_path), host="127.0.0.1").port
    path = next(line for line in Path(f"/proc/{gpu.pid}/cgroup").read_text().splitlines()
                if ":pids:" in line or line.startswith("0::")).split(":", 2)[2]
    procfs = ProcFs(Path("/proc"))
    reads = EngineReads(Reader(), walker=Discovery(processes=procfs), processes=procfs, node_name="node-a",
                        explicit=[parse_engine(f"http://127.0.0.1:{port}/metrics,engine=vllm,cgroup={path}")],
                        discover=False)
    collector = EngineCollector(GpuCollector([gpu.pid]), reads, deadline_s=2.0)
    cycle = await collector.collect()
    await collector.close()
    [engine_entity] = cycle.engines()
    assert "process.pid" not in engine_entity.attributes

    proc = make()
    no_filter = KeyFilter([])
    proc.runtime.store.upsert(pod_from_json(
        pod_json("vllm-0", namespace="serving", uid=pod.uid, containers={"vllm": pod.container_id}),
        labels=no_filter, annotations=no_filter))
    proc.runtime.store.synced = True
    batch = Batch.decode(Signal.METRICS, metrics_request(cycle.entities, cycle.time_ns).SerializeToString())
    out = await proc.process(batch)
    assert out is not None
    engine = resource_attrs(out)[-1]
    assert engine["gputally.inference.engine"] == "vllm"
    assert k8s_only(engine)["k8s.pod.uid"] == pod.uid and k8s_only(engine)["k8s.pod.name"] == "vllm-0"
    assert k8s_only(engine)["gputally.k8s.attribution"] == "cgroup"
    assert engine["gputally.inference.gpu.ids"] == [GPU]  # its container's GPU process's GPU

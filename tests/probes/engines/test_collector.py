"""The per-cycle engine read on real servers: explicit endpoints, engines discovered from a GPU
process's container (in its own network namespace), hung and non-engine listeners, restarts,
and the GPU part of the cycle, which never waits on or fails for an engine."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from harness.processes import unused_port

from gputally.probes.core.hints import ProcFs
from gputally.probes.engines.collector import EngineCollector, EngineReads, Read
from gputally.probes.engines.discover import Discovery
from gputally.probes.engines.options import parse_engine
from tests.probes.engines.pods import GPU, GpuCollector, PodCgroup, Reader, exposition, needs_cgroups

pytestmark = needs_cgroups


def engines(gpu_pids: list[int], read: Read, *, explicit: tuple[str, ...] = (), discover: bool = True,
            deadline_s: float = 2.0, gpu_delay_s: float = 0.0, warn_every_s: float = 60.0,
            gpu: GpuCollector | None = None) -> EngineCollector:
    procfs = ProcFs(Path("/proc"))
    reads = EngineReads(read, walker=Discovery(processes=procfs), processes=procfs, node_name="node-a",
                        explicit=[parse_engine(spec) for spec in explicit], discover=discover,
                        warn_every_s=warn_every_s)
    return EngineCollector(gpu or GpuCollector(gpu_pids, delay_s=gpu_delay_s), reads, deadline_s=deadline_s)


def values(entity: object, name: str) -> list[float | int]:
    return [p.value for p in entity.points if p.metric.name == name]  # type: ignore[attr-defined]


async def test_an_explicit_endpoint_is_read_each_cycle(pod: PodCgroup, tmp_path: Path) -> None:
    port = pod.server(exposition=exposition(tmp_path, tokens=77)).port
    collector = engines([], Reader(), explicit=(f"http://127.0.0.1:{port}/metrics,engine=vllm,model=tiny",),
                        discover=False)

    cycle = await collector.collect()
    second = await collector.collect()
    await collector.close()

    [engine] = [e for e in cycle.entities if e.kind == "engine"]
    assert engine.attributes == {"host.name": "node-a", "gputally.inference.engine": "vllm",
                                 "server.address": "127.0.0.1", "server.port": port}
    assert values(engine, "gputally.inference.tokens") == [77]
    assert values(engine, "gputally.inference.up") == [1]
    [again] = [e for e in second.entities if e.kind == "engine"]
    tokens = [p for e in (engine, again) for p in e.points if p.metric.name == "gputally.inference.tokens"]
    assert tokens[0].start_ns == tokens[1].start_ns == cycle.time_ns  # one series, started when first seen


async def test_an_explicit_endpoint_with_a_pid_carries_its_process_and_its_container_gpus(
        pod: PodCgroup, tmp_path: Path) -> None:
    gpu = pod.gpu_process()
    server = pod.server(exposition=exposition(tmp_path))
    collector = engines([gpu.pid], Reader(), explicit=(f"http://127.0.0.1:{server.port}/metrics,pid={server.pid}",),
                        discover=False)

    cycle = await collector.collect()
    await collector.close()

    [engine] = [e for e in cycle.entities if e.kind == "engine"]
    assert engine.attributes["process.pid"] == server.pid
    assert f"pod{pod.uid}/{pod.container_id}" in str(engine.attributes["process.linux.cgroup"])
    assert engine.attributes["gputally.inference.gpu.ids"] == (GPU,)
    assert engine.attributes["gputally.inference.gpu.pids"] == (gpu.pid,)


async def test_an_engine_in_a_pod_network_is_found_from_its_gpu_process_and_read_there(
        pod: PodCgroup, tmp_path: Path) -> None:
    gpu = pod.gpu_process()  # the process on the GPU listens on nothing (vLLM's worker)
    server = pod.server(exposition=exposition(tmp_path, tokens=5), netns=True)  # the API server
    port = server.port
    other = pod.server(mode="notfound", netns=True, host="0.0.0.0").port  # no engine, and ranked first: tried first
    reader = Reader()
    collector = engines([gpu.pid], reader)

    cycles = [await collector.collect() for _ in range(3)]
    await collector.close()

    for cycle in cycles:
        assert [e.kind for e in cycle.entities].count("gpu") == 1  # the GPU part, whole
        [engine] = [e for e in cycle.entities if e.kind == "engine"]
        assert engine.attributes["gputally.inference.engine"] == "vllm"
        assert (engine.attributes["server.address"], engine.attributes["server.port"]) == ("127.0.0.1", port)
        assert engine.attributes["process.pid"] == server.pid
        assert f"pod{pod.uid}/{pod.container_id}" in str(engine.attributes["process.linux.cgroup"])
        assert engine.attributes["gputally.inference.gpu.ids"] == (GPU,)
        assert engine.attributes["gputally.inference.gpu.pids"] == (gpu.pid,)
        assert values(engine, "gputally.inference.tokens") == [5]
    assert reader.reads == {("127.0.0.1", port): 3, ("127.0.0.1", other): 1}  # not an engine: tried once


async def test_an_engine_whose_gpu_process_comes_and_goes_is_announced_once(
        pod: PodCgroup, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """NVML lists an engine's process only on some cycles (idle between requests, a replay's
    readings): the container, and its engine, go and come back; one INFO line says so, not one
    a cycle."""
    gpu = pod.gpu_process()
    pod.server(exposition=exposition(tmp_path), host="0.0.0.0")
    gpus = GpuCollector([gpu.pid])
    collector = engines([], Reader(), gpu=gpus)
    seen = []
    with caplog.at_level(logging.INFO, logger="gputally.probes.engines.collector"):
        for cycle in range(6):
            gpus.pids = [gpu.pid] if cycle % 2 == 0 else []
            seen.append(len([e for e in (await collector.collect()).entities if e.kind == "engine"]))
    await collector.close()

    assert seen == [1, 0, 1, 0, 1, 0]  # read whenever its process is on the GPU
    assert len([r for r in caplog.records if r.getMessage().startswith("found ")]) == 1


async def test_a_changed_container_is_tried_afresh(pod: PodCgroup, tmp_path: Path) -> None:
    gpu = pod.gpu_process()
    other = pod.server(mode="notfound").port
    reader = Reader()
    collector = engines([gpu.pid], reader)
    assert [e for e in (await collector.collect()).entities if e.kind == "engine"] == []
    await collector.collect()
    assert reader.reads == {("127.0.0.1", other): 1}

    port = pod.server(exposition=exposition(tmp_path), host="0.0.0.0").port  # a new process: the container changed
    cycle = await collector.collect()
    await collector.close()

    assert [e.attributes["server.port"] for e in cycle.entities if e.kind == "engine"] == [port]
    assert reader.reads == {("127.0.0.1", other): 1, ("127.0.0.1", port): 1}  # found at once, ranked first


async def test_a_hung_engine_costs_one_bounded_wait_and_one_warning(
        pod: PodCgroup, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    silent = pod.server(mode="silent").port
    collector = engines([], Reader(), explicit=(f"http://127.0.0.1:{silent}/metrics,engine=vllm",),
                        discover=False, deadline_s=0.5, gpu_delay_s=0.1)
    caplog.set_level(logging.WARNING, logger="gputally.probes.engines")

    took = []
    cycles = []
    for _ in range(3):
        started = time.monotonic()
        cycles.append(await collector.collect())
        took.append(time.monotonic() - started)
    await collector.close()

    assert max(took) < 3.0  # the deadline (0.5 s) bounds it; without one it would never return
    for cycle in cycles:
        assert [e.kind for e in cycle.entities] == ["gpu", "engine"]
        [engine] = [e for e in cycle.entities if e.kind == "engine"]
        assert [(p.metric.name, p.value) for p in engine.points] == [("gputally.inference.up", 0)]
        assert engine.attributes["gputally.inference.engine"] == "vllm"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f":{silent}/metrics" in warnings[0].getMessage()


async def test_an_engine_that_answers_again_ends_its_episode(
        pod: PodCgroup, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    port = unused_port()  # down, then the engine comes up there
    collector = engines([], Reader(), explicit=(f"http://127.0.0.1:{port}/metrics",), discover=False)
    caplog.set_level(logging.INFO, logger="gputally.probes.engines")
    down = await collector.collect()
    pod.server(port, exposition=exposition(tmp_path))
    up = await collector.collect()
    await collector.close()

    assert values(down.entities[-1], "gputally.inference.up") == [0]
    assert "gputally.inference.engine" not in down.entities[-1].attributes  # not known until it answers
    assert values(up.entities[-1], "gputally.inference.up") == [1]
    assert any("answers again" in r.getMessage() for r in caplog.records)


async def test_an_engine_restart_is_a_new_series(pod: PodCgroup, tmp_path: Path) -> None:
    gpu = pod.gpu_process()
    port = unused_port()  # held while the engine restarts: it comes back on the same port
    first = pod.server(port, exposition=exposition(tmp_path, tokens=500))
    collector = engines([gpu.pid], Reader())
    before = [e for e in (await collector.collect()).entities if e.kind == "engine"]
    pod.stop(first)
    pod.server(port, exposition=exposition(tmp_path, tokens=900, name="after.txt"))  # more than before
    after_cycle = await collector.collect()
    after = [e for e in after_cycle.entities if e.kind == "engine"]
    await collector.close()

    assert before[0].key != after[0].key
    [start] = [p.start_ns for p in after[0].points if p.metric.name == "gputally.inference.tokens"]
    assert start == after_cycle.time_ns


async def test_a_failing_engine_half_leaves_the_gpu_cycle_whole(pod: PodCgroup, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    gpu = pod.gpu_process()
    collector = engines([gpu.pid], Reader())

    def broken(self: Discovery, processes: object) -> object:
        raise RuntimeError("a bug in discovery")

    monkeypatch.setattr(Discovery, "scan", broken)
    cycle = await collector.collect()
    await collector.close()

    assert [e.kind for e in cycle.entities] == ["gpu", "process"]
    assert cycle.problems == ["the engine reads failed (see the log)"]
    assert "a bug in discovery" in caplog.text


async def test_each_failure_episode_is_one_warning(pod: PodCgroup, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    port = unused_port()  # down, up, down again
    collector = engines([], Reader(), explicit=(f"http://127.0.0.1:{port}/metrics",), discover=False,
                        warn_every_s=0.0)  # no throttle: the episodes alone decide
    caplog.set_level(logging.WARNING, logger="gputally.probes.engines")
    for _ in range(3):
        await collector.collect()  # nothing listens: one episode
    server = pod.server(port, exposition=exposition(tmp_path))
    await collector.collect()
    pod.stop(server)
    for _ in range(2):
        await collector.collect()  # a second episode
    await collector.close()
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


async def test_once_a_container_engine_is_found_its_other_ports_are_left_alone(pod: PodCgroup, tmp_path: Path) -> None:
    gpu = pod.gpu_process()
    port = pod.server(exposition=exposition(tmp_path), host="0.0.0.0").port  # the served port: ranked first
    pod.server(mode="silent")  # a worker's internal loopback socket, which must not be poked
    reader = Reader()
    collector = engines([gpu.pid], reader, deadline_s=0.5)

    for _ in range(3):
        cycle = await collector.collect()
        assert [e.attributes["server.port"] for e in cycle.engines()] == [port]
    await collector.close()

    assert reader.reads == {("127.0.0.1", port): 3}

"""The bridge end to end, with the real parts on both sides of the contract:

    the probe's OTLP (the three-workload H200 series) --> otelcol: otlp -> gputally processor
        --bridge API--> gputally serve: bridge -> k8s (gateway mode, real kube-apiserver)
                                               -> slurm (real slurmctld via slurmrestd)
        <-- the batch, attributed --          -> file exporter (the backend)

Every point comes back once and attributed. Then gputally is SIGKILLed while requests keep
flowing, and started again:

* ``on_error: pass``: nothing is lost; the points sent while it is down arrive unattributed
  (the processor counts them in ``otelcol_processor_gputally_passed_items``), and the points
  sent after the restart attributed again.
* ``on_error: fail``: a failed call is UNAVAILABLE, which the Collector treats as retryable.
  The arrangement that keeps the data is the one a fleet has anyway: an agent otelcol in front
  (the test's sender talks to it) whose ``otlp`` exporter has a sending queue and retries; the
  bridge otelcol's ``otlp`` receiver answers the agent with the bridge's UNAVAILABLE, the agent
  retries until gputally is back, and every point arrives once, all of them attributed. The
  agent's exporter timeout (10 s) is longer than the processor's (2 s), so the agent never
  gives up on a call the bridge otelcol is still finishing (that would duplicate it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from harness.kube.cluster import KubeCluster
from harness.otelcol.collector import Otelcol
from harness.processes import Ports
from harness.slurm.cluster import SlurmCluster
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from tests.otelcol.shapes import (
    K8S_ADDED,
    METRICS_EXPORT,
    SLURM_ADDED,
    GputallyProcess,
    Key,
    file_resources,
    metrics_of,
    points_at,
    points_of,
    prometheus_counters,
    quiet,
    request_points,
    resource_times,
    retimed,
    wait_until,
    warm_up,
)
from tests.processors.usage.scenario import Placed, placed
from tests.processors.usage.series import HOLDER_PID, NOTEBOOK_PID, TRAINER_PID, with_attributes

PIPELINE = "metrics/bridge"
SHIFT_NS = 10**12
"""Copy ``k`` of a request is moved ``(k + 1) * SHIFT_NS`` later: 1000 s, far more than the
series spans (18 s), so every point of every copy has a time of its own."""
SEND_INTERVAL = 0.02
"""Seconds between two requests of the stream (about 50 requests, 3,300 points a second)."""
THROUGH = "gputally.k8s.attribution"
"""Set by ``k8s`` on every process, and in gateway mode on every GPU with a holders hint: a
resource that has it went through gputally."""


def gputally_config(scene: Placed, port: int, token: Path) -> dict[str, Any]:
    """A bridge pipeline on ``port`` (0 at first; a restart takes the port it had): k8s in
    gateway mode (the cluster's pods, the probe's holders hint for the GPU), slurm through
    slurmrestd. Nothing is exported: the Collector carries the answer on."""
    return {
        "receivers": {"bridge": {"endpoint": f"127.0.0.1:{port}"}},
        "processors": {
            "k8s": {"mode": "gateway", "kubeconfig": str(scene.kube.limited_kubeconfig),
                    "extract": {"labels": ["team"]}},
            "slurm": {"backend": "slurmrestd", "slurmrestd": {"endpoint": scene.slurm.restd_url, "user": "root",
                                                              "token_file": str(token)}},
        },
        "exporters": {"debug": {}},
        "service": {
            "pipelines": {PIPELINE: {"receivers": ["bridge"], "processors": ["k8s", "slurm"], "exporters": ["debug"]}},
            "telemetry": {"metrics": {"address": "127.0.0.1:0"}},
        },
    }


def bridge_otelcol(bridge: int, out: Path, on_error: str) -> Callable[[Ports], dict[str, Any]]:
    """The bridge otelcol's config, from the ports it is given: its ``otlp`` receiver on port
    0, its own metrics (read by the test) on a picked port, which cannot be 0."""
    return lambda ports: {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
        "processors": {"gputally": {"endpoint": f"127.0.0.1:{bridge}", "tls": {"insecure": True},
                                    "pipeline": PIPELINE, "on_error": on_error, "timeout": "2s"}},
        "exporters": {"file": {"path": str(out), "format": "json", "flush_interval": "100ms"}},
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["gputally"], "exporters": ["file"]}},
            "telemetry": {"metrics": {"level": "detailed", "readers": [
                {"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": ports["telemetry"]}}}}]}},
        },
    }


def agent_otelcol(upstream: int) -> dict[str, Any]:
    """An agent in front: queue and retry, as a node's collector exports to a gateway."""
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
        "exporters": {"otlp": {
            "endpoint": f"127.0.0.1:{upstream}", "tls": {"insecure": True}, "timeout": "10s",
            "sending_queue": {"queue_size": 5000},
            "retry_on_failure": {"initial_interval": "100ms", "max_interval": "500ms", "max_elapsed_time": "60s"},
        }},
        "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["otlp"]}}},
    }


def gpu_holders(scene: Placed) -> list[ExportMetricsServiceRequest]:
    """The scene's requests with what the probe read from PodResources on the node on the GPU
    (gateway mode reads the hint; the pods time-slice the GPU, so both hold it)."""
    ns = scene.namespace
    holders = sorted([f"{ns}/jupyter-bob-0/notebook/nvidia.com/gpu.shared", f"{ns}/trainer-0/train/nvidia.com/gpu.shared"])
    return [with_attributes(r, processes={}, gpu={"gputally.k8s.podresources.holders": holders}) for r in scene.requests]


@dataclass
class Stream:
    """Requests sent one after another, copy ``k`` of the series' request ``k % len`` moved by
    ``(k + 1) * SHIFT_NS``; each counted as sent once it was answered OK."""

    requests: list[ExportMetricsServiceRequest]
    sent: Counter[Key] = field(default_factory=Counter)
    copy_of_time: dict[int, int] = field(default_factory=dict)
    """A sent point's time -> the copy it belongs to."""
    count: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, export: Any) -> None:
        while not self.stop.is_set():
            request = retimed(self.requests[self.count % len(self.requests)], (self.count + 1) * SHIFT_NS)
            await export(request.SerializeToString(), timeout=10)
            points = request_points([request])
            self.sent.update(points)
            self.copy_of_time.update((key[3], self.count) for key in points)
            self.count += 1
            await asyncio.sleep(SEND_INTERVAL)


@dataclass
class Outcome:
    """What reached the backend, by copy: whether each went through gputally."""

    through: dict[int, bool]
    points_through: int
    points_unattributed: int
    named_after_restart: dict[str, str]
    """Of a copy sent after the restart: the trainer's pod and the holder's job user."""


def outcome(out: Path, stream: Stream, restarted_at: int) -> Outcome:
    through: dict[int, set[bool]] = {}
    points = Counter[bool]()
    named: dict[str, str] = {}
    for attributes, rm in file_resources(out):
        times = resource_times(rm) & stream.copy_of_time.keys()
        if not times:
            continue  # the warm-up's copies
        copies = {stream.copy_of_time[t] for t in times}
        went = THROUGH in attributes
        for copy in copies:
            through.setdefault(copy, set()).add(went)
        points[went] += sum(len(points_of(m)) for m in metrics_of(rm))
        if min(copies) > restarted_at and went:
            pid = attributes.get("process.pid")
            if pid == str(TRAINER_PID) and "k8s.pod.name" in attributes:
                named["trainer"] = attributes["k8s.pod.name"]
            if pid == str(HOLDER_PID) and "slurm.job.user" in attributes:
                named["holder"] = attributes["slurm.job.user"]
    assert all(len(seen) == 1 for seen in through.values()), "a request went through gputally in part"
    return Outcome({copy: seen.pop() for copy, seen in through.items()}, points[True], points[False], named)


def gputally_counter(url: str, name: str, label: str = "") -> float:
    """Sum of the bridge otelcol's ``otelcol_processor_gputally_<name>`` series that have ``label``."""
    found = prometheus_counters(url, f"otelcol_processor_gputally_{name}")
    return sum(value for series, value in found.items() if label in series)


@pytest.fixture
async def scene(kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str, slurm_cluster: SlurmCluster,
                tmp_path: Path) -> AsyncIterator[Placed]:
    """Two pods time-slicing the H200 in the real API server and a real Slurm job holding its memory."""
    async with placed(kube_cluster, kube_admin, kube_namespace, slurm_cluster, tmp_path / "node") as placed_scene:
        yield placed_scene


@pytest.mark.parametrize("on_error", ["pass", "fail"])
async def test_bridge_attributes_every_point_once_and_survives_a_killed_gputally(
    otelcol: Callable[..., Otelcol], scene: Placed, tmp_path: Path, on_error: str,
) -> None:
    async with asyncio.timeout(60):
        await _run(otelcol, scene, tmp_path, on_error)


async def _run(otelcol: Callable[..., Otelcol], scene: Placed, tmp_path: Path, on_error: str) -> None:
    token = tmp_path / "slurm-token"
    token.write_text(scene.slurm.token("root"))
    gputally = GputallyProcess(gputally_config(scene, 0, token), tmp_path / "gputally").start()
    bridge_port = gputally.port("grpc", "bridge")
    out = tmp_path / "backend.json"
    collector = otelcol(bridge_otelcol(bridge_port, out, on_error), name="bridge-otelcol")
    agent = None
    send_port = front_port = collector.port("otlp")
    if on_error == "fail":
        agent = otelcol(agent_otelcol(front_port), name="agent")
        send_port = agent.port("otlp")
    counters_url = f"http://127.0.0.1:{collector.ports['telemetry']}/metrics"
    # The restart comes back on the port the collector's processor calls.
    config = gputally_config(scene, bridge_port, token)
    requests = gpu_holders(scene)
    stream = Stream(requests)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{send_port}") as channel:
            export = channel.unary_unary(METRICS_EXPORT)
            # The pod list syncs and the job's metadata is fetched in the background.
            await warm_up(export, requests[0], out, ("k8s.statefulset.name", "gputally.k8s.pods", "slurm.job.user"),
                          gputally.log_tail)
            # Counted from here: the warm-up's calls are not the stream's.
            failed_before = gputally_counter(counters_url, "calls", 'outcome="error"')
            passed_before = gputally_counter(counters_url, "passed_items")
            sender = asyncio.create_task(stream.run(export), name="bridge-test-stream")
            await wait_until(lambda: stream.count >= 40 or sender.done(), "the stream to start")
            assert gputally.proc is not None
            killed_at = stream.count  # every copy before this one was answered by gputally
            os.kill(gputally.proc.pid, signal.SIGKILL)
            await asyncio.to_thread(gputally.proc.wait)
            await asyncio.sleep(1.0)  # requests keep flowing while it is down
            gputally = await asyncio.to_thread(GputallyProcess(config, tmp_path / "gputally", name="restarted").start)
            restarted_at = stream.count
            # On until a copy sent after the restart is back attributed to its pod and its job.
            await _attributed_again(out, stream, restarted_at, sender, gputally)
            stream.stop.set()
            await sender
        await wait_until(lambda: points_at(out, set(stream.copy_of_time)).total() >= stream.sent.total(),
                         "every sent point at the backend", timeout=30)
        await quiet(out, seconds=1.0)
        result = outcome(out, stream, restarted_at)
        calls_failed = gputally_counter(counters_url, "calls", 'outcome="error"') - failed_before
        passed = gputally_counter(counters_url, "passed_items") - passed_before
    finally:
        assert await asyncio.to_thread(gputally.stop) == 0, gputally.log_tail()
    if agent is not None:
        assert await asyncio.to_thread(agent.stop) == 0, agent.log_tail()
    assert await asyncio.to_thread(collector.stop) == 0, collector.log_tail()

    # Every point once, each resource as sent plus what k8s and slurm added.
    assert points_at(out, set(stream.copy_of_time), added=K8S_ADDED + SLURM_ADDED) == stream.sent
    assert set(result.through) == set(range(stream.count))
    assert all(result.through[k] for k in range(killed_at))  # before the kill: all through gputally
    assert result.named_after_restart == {"trainer": "trainer-0", "holder": "root"}
    assert calls_failed > 0  # the kill was felt: calls failed while gputally was down
    down = [k for k, went in result.through.items() if not went]
    print(f"on_error={on_error}: {stream.count} requests, {stream.sent.total()} points sent and received once; "
          f"through gputally {result.points_through}, unattributed {result.points_unattributed} "
          f"(copies {min(down, default=None)}..{max(down, default=None)}); killed after copy {killed_at}, restarted "
          f"at {restarted_at}; failed calls {calls_failed:.0f}, passed items {passed:.0f}")
    if on_error == "pass":
        # While it was down the points went on unattributed, and the processor counted each.
        assert down and result.points_unattributed == passed > 0
        assert min(down) >= killed_at and result.through[stream.count - 1]
    else:
        # Nothing unattributed: what failed was retried by the agent until gputally was back.
        assert not down and result.points_unattributed == 0 and passed == 0
    _attribution_as_expected(out, scene, stream)


def _attribution_as_expected(out: Path, scene: Placed, stream: Stream) -> None:
    """The attributes on what went through: the trainer's and notebook's processes their pods,
    the holder its job, the GPU both pods."""
    ns = scene.namespace
    seen: dict[str, set[tuple[str | None, ...]]] = {}
    for attributes, rm in file_resources(out):
        if THROUGH not in attributes or not resource_times(rm) & stream.copy_of_time.keys():
            continue
        pid = attributes.get("process.pid", "gpu")
        seen.setdefault(pid, set()).add((attributes.get("k8s.pod.name"), attributes.get("k8s.namespace.name"),
                                         attributes.get("slurm.job.id"), attributes.get("gputally.k8s.pods")))
    # Right after the restart the pod list may not have synced yet: the cgroup's identity only.
    assert ("trainer-0", ns, None, None) in seen[str(TRAINER_PID)]
    assert {name for name, *_ in seen[str(TRAINER_PID)]} <= {"trainer-0", None}
    assert ("jupyter-bob-0", ns, None, None) in seen[str(NOTEBOOK_PID)]
    assert seen[str(HOLDER_PID)] == {(None, None, str(scene.job), None)}
    pods = f'["{ns}/jupyter-bob-0", "{ns}/trainer-0"]'
    assert {(name, job, holders) for name, _, job, holders in seen["gpu"]} == {(None, None, pods)}


async def _attributed_again(out: Path, stream: Stream, restarted_at: int, sender: asyncio.Task[None],
                            gputally: GputallyProcess, timeout: float = 30.0) -> None:
    """Until a copy sent after the restart came back with its pod and job names (the file is
    read in a thread: the stream goes on meanwhile)."""
    deadline = time.monotonic() + timeout
    while not sender.done():
        found = await asyncio.to_thread(outcome, out, stream, restarted_at)
        if len(found.named_after_restart) == 2:
            return
        assert time.monotonic() < deadline, f"no attribution after the restart:\n{gputally.log_tail()}"
        await asyncio.sleep(0.5)
    await sender  # it failed: raise its error

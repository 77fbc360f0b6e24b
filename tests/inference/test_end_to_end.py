"""End to end with a real vLLM and a real llama.cpp server (issue 33, "What it must show",
first bullet): each engine in a pod of the real kube-apiserver (its processes in that pod's
real cgroup), found by the probe from the GPU's own processes, read, attributed by ``k8s``,
counted by ``usage`` in a real ``gputally serve``, written to a real Prometheus; the tokens
per owner and served model there equal the sum of the engines' API answers' ``usage``
exactly, across a restart of both engines in the middle of the run; and each served model's
GPU-seconds, joules and cost per 1M tokens (both bases) equal an independent calculation from
the probe's own requests (:mod:`.reference`) within 0.1 %.

The GPU is the recorded H200 of ``../shared/fixtures/nvml/h200-three-workloads-timeseries.json``
(ten readings 2.04 s apart), replayed every 2 s so that its energy is what an H200 draws: its
busy process (recorded pid 448, ~90 % SM) is made the vLLM worker, its notebook (449, ~10 %
SM on half the readings) the llama.cpp server, its memory holder (450) a process of a third pod
(:mod:`.gpu_pids`); everything about those processes is read live. The kubelet's PodResources
(a stand-in on a real unix socket: no kubelet runs here) gives the GPU to the three pods,
time-sliced.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from harness.engines.builds import locate_llamacpp, locate_vllm
from harness.engines.cgroups import PodCgroup
from harness.engines.fixtures import started
from harness.engines.load import Usage, send_requests
from harness.engines.servers import ENTER_CGROUP, LlamaCppServer, VllmServer
from harness.kube.cluster import KubeCluster, create_node, create_pod
from harness.prometheus.server import Binaries, Prometheus

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gputally.cli.main import build_parser
from gputally.otlp.batch import Batch
from gputally.otlp.signals import Signal
from gputally.probes.core.command import probe_interval, run_collector
from gputally.probes.core.hints import ProcFs
from gputally.probes.delivery import exporter as probe_exporter
from gputally.probes.nvml.collector import NvmlCollector
from gputally.probes.nvml.replay import ReplaySource, load_recording
from gputally.report.served import COUNTERS
from tests.inference.gpu_pids import RemappedReplay
from tests.inference.reference import model_accounts, observed_seconds
from tests.otelcol.shapes import GputallyProcess
from tests.processors.k8s.kubelet import Kubelet, kubelet_socket

RECORDING = (Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "nvml"
             / "h200-three-workloads-timeseries.json")
BUSY_PID, NOTEBOOK_PID, HOLDER_PID = 448, 449, 450
PRICE, ENERGY_PRICE = 3.2, 0.12
PROMPT = "Tokens are what an inference engine sells, so count every one of them"
TOKENS = "gputally_usage_tokens_total"
INFERENCE_SERIES = 'count by (__name__, k8s_pod_uid) ({__name__=~"gputally_inference.*|gputally_usage_tokens.*"})'


def gputally_config(node: str, kube: KubeCluster, prometheus: Prometheus, pod_resources: Path) -> dict[str, Any]:
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
        "processors": {
            "k8s": {"mode": "node", "node_name": node, "kubeconfig": str(kube.limited_kubeconfig),
                    "pod_resources": {"socket": str(pod_resources), "refresh_interval": "1s"},
                    "cri": {"enabled": False}},
            "usage": {"settle": "200ms", "emit_interval": "1s", "end_after": "1h",
                      "prices": [{"model": "NVIDIA H200*", "per_gpu_hour": PRICE}],
                      "energy_price_per_kwh": ENERGY_PRICE},
        },
        "exporters": {"otlphttp": {"endpoint": prometheus.otlp_url.removesuffix("/v1/metrics"), "compression": "none"}},
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["k8s", "usage"], "exporters": ["otlphttp"]}},
            "telemetry": {"metrics": {"address": "127.0.0.1:0"}},
        },
    }


def tokens(prometheus: Prometheus) -> dict[tuple[str, str, str], float]:
    """(owner id, served model, token type) -> the usage processor's token counter."""
    found: dict[tuple[str, str, str], float] = {}
    for row in prometheus.query(f"sum by (gputally_usage_owner_id, gen_ai_request_model, gen_ai_token_type) ({TOKENS})"):
        labels = row["metric"]
        key = (labels.get("gputally_usage_owner_id", ""), labels.get("gen_ai_request_model", ""),
               labels.get("gen_ai_token_type", ""))
        found[key] = float(row["value"][1])
    return found


def model_counters(prometheus: Prometheus) -> dict[str, dict[str, float]]:
    """Owner id -> its served model's ``usage`` model counters (allocated, busy, energy, cost,
    busy_cost), summed over GPUs and currencies (one of each here)."""
    found: dict[str, dict[str, float]] = {}
    for name, series in COUNTERS.items():
        for row in prometheus.query(f"sum by (gputally_usage_owner_id) ({series})"):
            found.setdefault(row["metric"].get("gputally_usage_owner_id", ""), {})[name] = float(row["value"][1])
    return found


def refused(prometheus: Prometheus) -> list[dict[str, Any]]:
    return prometheus.query("gputally_usage_refused_time_seconds_total > 0 or gputally_usage_refused_energy_joules_total > 0")


def observed(prometheus: Prometheus) -> float:
    rows = prometheus.query("sum(gputally_usage_observed_time_seconds_total)")
    return float(rows[0]["value"][1]) if rows else 0.0


def expected(sent: dict[str, Usage]) -> dict[tuple[str, str, str], float]:
    want: dict[tuple[str, str, str], float] = {}
    for owner, usage in sent.items():
        want[(owner, "tiny", "input")] = usage.prompt_tokens
        want[(owner, "tiny", "output")] = usage.completion_tokens
    return want


async def wait_until(check: Any, what: str, timeout: float, log: Any) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(check)
        if value or time.monotonic() > deadline:
            if not value:
                raise AssertionError(f"{what} within {timeout:g} s:\n{log()}")
            return value
        await asyncio.sleep(0.5)


class Capture:
    """The probe's metrics requests as its exporter is handed them (wraps the exporter
    `run_collector` builds). Once `close`d, the probe's later cycles are neither kept nor
    sent, so what was kept is what ``serve`` received once the exporter's queue has drained."""

    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.closed = False

    def wrap(self, create: Any) -> Any:
        def create_exporter(**options: Any) -> Any:
            name, exporter = create(**options)
            export = exporter.export

            async def kept(batch: Batch) -> None:
                if self.closed:
                    return
                if batch.signal is Signal.METRICS:
                    self.requests.append(ExportMetricsServiceRequest.FromString(batch.serialize()))
                await export(batch)

            exporter.export = kept
            return name, exporter

        return create_exporter


@contextlib.asynccontextmanager
async def probing(source: RemappedReplay, endpoint: str, node: str, pod_resources: Path,
                  capture: Capture) -> AsyncIterator[None]:
    """The NVIDIA probe, every 2 s (the recording's pace), on the remapped replay with the real
    /proc, engine discovery on (``--replay`` alone turns it off: here the replay only stands
    in for NVML), PodResources read for the GPU's holders. Its requests go to ``capture`` too."""
    args = build_parser().parse_args(["probe", "nvml", "--replay", str(RECORDING), "--endpoint", endpoint,
                                      "--insecure", "--node-name", node, "--metrics-only", "--interval", "2s",
                                      "--pod-resources", str(pod_resources), "--pod-resources-refresh", "1s"])
    interval = probe_interval(args)
    args.replay = None
    collector = NvmlCollector(source, ProcFs(Path("/proc")), node_name=node, budget_s=1.5, events=False)  # type: ignore[arg-type]
    task = asyncio.create_task(run_collector(args, interval, collector, title="e2e", probe="nvml"))
    try:
        yield
    finally:
        capture.closed = True
        await asyncio.sleep(2)  # the exporter's queue drains to serve
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def holding(cgroup: PodCgroup) -> subprocess.Popen[bytes]:
    """A process of the pod that holds GPU memory and computes nothing (the recording's 450)."""
    return subprocess.Popen([str(ENTER_CGROUP), *map(str, cgroup.procs_files), "--", "sleep", "3600"],
                            stdin=subprocess.DEVNULL, start_new_session=True)


async def test_tokens_and_gpu_time_per_owner_and_model_equal_the_answers_across_a_restart(
    kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str, prometheus_binaries: Binaries, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not RECORDING.exists():
        pytest.fail(f"{RECORDING} is not here (the shared fixtures)")
    vllm, hf = locate_vllm()
    llama, gguf = locate_llamacpp()
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    create_node(kube_admin, node)
    pods = {name: create_pod(kube_admin, kube_namespace, name, node_name=node, containers=[container])
            for name, container in (("vllm-0", "vllm"), ("llama-0", "llama"), ("holder-0", "holder"))}
    uids = {name: pod.metadata.uid for name, pod in pods.items()}
    gpu_uuid = str(load_recording(RECORDING)["device"]["uuid"])
    kubelet = Kubelet()  # the device plugin time-slices the H200 among the three pods
    for n, (name, container) in enumerate((("vllm-0", "vllm"), ("llama-0", "llama"), ("holder-0", "holder"))):
        kubelet.allocate(kube_namespace, name, container, "nvidia.com/gpu", f"{gpu_uuid}::{n}")
    capture = Capture()
    monkeypatch.setattr(probe_exporter, "create_exporter", capture.wrap(probe_exporter.create_exporter))
    vllm_server = VllmServer(tmp_path / "vllm", vllm=vllm, model=hf, cgroup=PodCgroup.create(pod_uid=uids["vllm-0"]))
    llama_server = LlamaCppServer(tmp_path / "llama", llama_server=llama, model=gguf,
                                  cgroup=PodCgroup.create(pod_uid=uids["llama-0"]))
    holder_cgroup = PodCgroup.create(pod_uid=uids["holder-0"])
    holder = holding(holder_cgroup)
    prometheus = Prometheus(prometheus_binaries.prometheus, tmp_path / "prometheus")  # promotes the model
    try:
        async with kubelet_socket(tmp_path / "kubelet", kubelet) as pod_resources:
            with started(llama_server), started(vllm_server):
                source = RemappedReplay(ReplaySource.from_file(RECORDING), {BUSY_PID: vllm_server.processes()["worker"],
                                                 NOTEBOOK_PID: llama_server.pid, HOLDER_PID: holder.pid})
                prometheus.start()
                serve = GputallyProcess(gputally_config(node, kube_cluster, prometheus, pod_resources),
                                        tmp_path / "gputally")
                try:
                    serve.start()
                    endpoint = serve.listening.address("grpc")
                    sent = await serving(source, serve, prometheus, endpoint, node, pod_resources,
                                         capture, uids, vllm_server, llama_server)
                    assert tokens(prometheus) == expected(sent)
                    await check_gpu_time_per_million_tokens(prometheus, capture, sent, uids, gpu_uuid, serve)
                finally:
                    serve.stop()
                    prometheus.stop()
    finally:
        holder.kill()
        holder.wait()
        holder_cgroup.remove()


async def serving(source: RemappedReplay, serve: GputallyProcess, prometheus: Prometheus, endpoint: str, node: str,
                  pod_resources: Path, capture: Capture, uids: dict[str, str], vllm_server: VllmServer,
                  llama_server: LlamaCppServer) -> dict[str, Usage]:
    """Requests to both engines, both restarted midway, the probe reading them all along; the
    sum of the answers' usage per owner."""
    async with probing(source, endpoint, node, pod_resources, capture):
        def attributed() -> bool:  # both engines found, read and named by their pods
            rows = prometheus.query('gputally_inference_up_ratio{k8s_pod_uid!=""}')
            return {r["metric"].get("k8s_pod_uid") for r in rows} >= {uids["vllm-0"], uids["llama-0"]}
        await wait_until(attributed, "the probe never showed both engines attributed", 120,
                         lambda: f"{prometheus.query(INFERENCE_SERIES)}\n{serve.log_tail()}")

        sent = {uids["vllm-0"]: Usage(), uids["llama-0"]: Usage()}
        for server, owner in ((vllm_server, uids["vllm-0"]), (llama_server, uids["llama-0"])):
            sent[owner] += await asyncio.to_thread(send_requests, server, 4, prompt=PROMPT, max_tokens=9)
        await wait_until(lambda: tokens(prometheus) == expected(sent), "tokens before the restart", 60,
                         lambda: f"{tokens(prometheus)} != {expected(sent)}\n{serve.log_tail()}")

        # Both engines restart in their containers: new pids (the GPU's processes follow
        # them), counters from zero.
        await asyncio.to_thread(llama_server.restart)
        source.pids[NOTEBOOK_PID] = llama_server.pid
        await asyncio.to_thread(vllm_server.restart)
        source.pids[BUSY_PID] = vllm_server.processes()["worker"]
        for server, owner in ((vllm_server, uids["vllm-0"]), (llama_server, uids["llama-0"])):
            sent[owner] += await asyncio.to_thread(send_requests, server, 3, prompt=PROMPT + " again",
                                                   max_tokens=5)
        await wait_until(lambda: tokens(prometheus) == expected(sent), "tokens after the restart", 60,
                         lambda: f"{tokens(prometheus)} != {expected(sent)}\n{serve.log_tail()}")
        await asyncio.sleep(6)  # a few more cycles: nothing is counted twice later
    return sent


async def check_gpu_time_per_million_tokens(prometheus: Prometheus, capture: Capture, sent: dict[str, Usage],
                                            uids: dict[str, str], gpu_uuid: str, serve: GputallyProcess) -> None:
    """Each served model's GPU-s (both bases), J and cost (both bases) per 1M tokens, from the
    counters in Prometheus, against the same figures computed from the probe's requests."""
    span = observed_seconds(capture.requests)

    def settled() -> bool:  # every request the probe sent is integrated and its counters out
        return math.isclose(observed(prometheus), span, rel_tol=1e-9)
    await wait_until(settled, "the GPU's observed time never reached the probe's readings' span", 30,
                     lambda: f"{observed(prometheus)} != {span}\n{serve.log_tail()}")
    await asyncio.sleep(2)  # one more emit: the model counters of the last interval
    assert refused(prometheus) == []  # every reading is one an H200 can give: nothing left out
    holders = sorted(uids.values())
    want = model_accounts(capture.requests, gpu=gpu_uuid, holders=holders, price=PRICE, energy_price=ENERGY_PRICE)
    got = model_counters(prometheus)
    assert set(want) == {uids["vllm-0"], uids["llama-0"]}, want
    for owner, usage in sent.items():
        million = (usage.prompt_tokens + usage.completion_tokens) / 1e6
        assert want[owner]["busy"] > 0 and want[owner]["energy"] > 0, want[owner]  # both engines computed
        for name in ("allocated", "busy", "energy", "cost", "busy_cost"):
            per_got, per_want = got[owner][name] / million, want[owner][name] / million
            assert math.isclose(per_got, per_want, rel_tol=1e-3), (owner, name, per_got, per_want)

"""End to end with a real vLLM and a real llama.cpp server (issue 33, "What it must show",
first bullet): each engine in a pod of the real kube-apiserver (its processes in that pod's
real cgroup), found by the probe from the GPU's own processes, read, attributed by ``k8s``,
counted by ``usage`` in a real ``gputally serve``, written to a real Prometheus; the tokens
per owner and served model there equal the sum of the engines' API answers' ``usage``
exactly, across a restart of both engines in the middle of the run.

The GPU is the recorded H200 of ``../shared/fixtures/nvml/h200-two-workloads.json``: its busy
process (recorded pid 628) is made the vLLM worker, its memory holder (629) the llama.cpp
server (:mod:`.gpu_pids`); everything about those processes is read live.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from harness.engines.servers import LlamaCppServer, VllmServer
from harness.kube.cluster import KubeCluster, create_node, create_pod
from harness.processes import free_port
from harness.prometheus.server import Binaries, Prometheus

from gputally.cli.main import build_parser
from gputally.probes.core.command import probe_interval, run_collector
from gputally.probes.core.hints import ProcFs
from gputally.probes.nvml.collector import NvmlCollector
from gputally.probes.nvml.replay import ReplaySource
from tests.inference.gpu_pids import RemappedReplay
from tests.otelcol.shapes import GputallyProcess

RECORDING = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "nvml" / "h200-two-workloads.json"
BUSY_PID, HOLDER_PID = 628, 629
PROMPT = "Tokens are what an inference engine sells, so count every one of them"
TOKENS = "gputally_usage_tokens_total"
INFERENCE_SERIES = 'count by (__name__, k8s_pod_uid) ({__name__=~"gputally_inference.*|gputally_usage_tokens.*"})'


def gputally_config(port: int, node: str, kube: KubeCluster, prometheus: Prometheus) -> dict[str, Any]:
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
        "processors": {
            "k8s": {"mode": "node", "node_name": node, "kubeconfig": str(kube.limited_kubeconfig),
                    "pod_resources": {"enabled": False}, "cri": {"enabled": False}},
            "usage": {"settle": "200ms", "emit_interval": "1s", "end_after": "1h"},
        },
        "exporters": {"otlphttp": {"endpoint": prometheus.otlp_url.removesuffix("/v1/metrics"), "compression": "none"}},
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["k8s", "usage"], "exporters": ["otlphttp"]}},
            "telemetry": {"metrics": {"address": f"127.0.0.1:{free_port()}"}},
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


@contextlib.asynccontextmanager
async def probing(source: RemappedReplay, endpoint: str, node: str) -> AsyncIterator[None]:
    """The NVIDIA probe, every second, on the remapped replay with the real /proc, engine
    discovery on (``--replay`` alone turns it off: here the replay only stands in for NVML)."""
    args = build_parser().parse_args(["probe", "nvml", "--replay", str(RECORDING), "--endpoint", endpoint,
                                      "--insecure", "--node-name", node, "--metrics-only", "--interval", "1s"])
    interval = probe_interval(args)
    args.replay = None
    collector = NvmlCollector(source, ProcFs(Path("/proc")), node_name=node, budget_s=0.8, events=False)  # type: ignore[arg-type]
    task = asyncio.create_task(run_collector(args, interval, collector, title="e2e", probe="nvml"))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_tokens_per_owner_and_model_equal_the_answers_across_a_restart(
    kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str, prometheus_binaries: Binaries, tmp_path: Path,
) -> None:
    if not RECORDING.exists():
        pytest.fail(f"{RECORDING} is not here (the shared fixtures)")
    vllm, hf = locate_vllm()
    llama, gguf = locate_llamacpp()
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    create_node(kube_admin, node)
    pods = {name: create_pod(kube_admin, kube_namespace, name, node_name=node, containers=[container])
            for name, container in (("vllm-0", "vllm"), ("llama-0", "llama"))}
    uids = {name: pod.metadata.uid for name, pod in pods.items()}
    vllm_server = VllmServer(tmp_path / "vllm", vllm=vllm, model=hf, cgroup=PodCgroup.create(pod_uid=uids["vllm-0"]))
    llama_server = LlamaCppServer(tmp_path / "llama", llama_server=llama, model=gguf,
                                  cgroup=PodCgroup.create(pod_uid=uids["llama-0"]))
    prometheus = Prometheus(prometheus_binaries.prometheus, tmp_path / "prometheus")  # promotes the model
    with started(llama_server), started(vllm_server):
        source = RemappedReplay(ReplaySource.from_file(RECORDING),
                                {BUSY_PID: vllm_server.processes()["worker"], HOLDER_PID: llama_server.pid})
        prometheus.start()
        port = free_port()
        serve = GputallyProcess(gputally_config(port, node, kube_cluster, prometheus), tmp_path / "gputally")
        try:
            serve.start(port)
            async with probing(source, f"127.0.0.1:{port}", node):
                def attributed() -> bool:  # both engines found, read and named by their pods
                    rows = prometheus.query('gputally_inference_up_ratio{k8s_pod_uid!=""}')
                    return {r["metric"].get("k8s_pod_uid") for r in rows} >= set(uids.values())
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
                source.pids[HOLDER_PID] = llama_server.pid
                await asyncio.to_thread(vllm_server.restart)
                source.pids[BUSY_PID] = vllm_server.processes()["worker"]
                for server, owner in ((vllm_server, uids["vllm-0"]), (llama_server, uids["llama-0"])):
                    sent[owner] += await asyncio.to_thread(send_requests, server, 3, prompt=PROMPT + " again",
                                                           max_tokens=5)
                await wait_until(lambda: tokens(prometheus) == expected(sent), "tokens after the restart", 60,
                                 lambda: f"{tokens(prometheus)} != {expected(sent)}\n{serve.log_tail()}")
                await asyncio.sleep(3)  # a few more cycles: nothing is counted twice later
            assert tokens(prometheus) == expected(sent)
        finally:
            serve.stop()
            prometheus.stop()

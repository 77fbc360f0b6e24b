"""Accounting that stays right when the API server is out of reach (issue 29), with the real parts:

    H200 time series --> the NVIDIA probe (replay), asking PodResources and the container
        runtime (stand-ins on real unix sockets) --> gputally serve: k8s (gateway mode, a real
        kube-apiserver behind a door the test opens or keeps shut) -> usage
        --> a real Prometheus (OTLP) --> gputally report

Run twice: the API server unreachable for the whole run, and reachable only for the second
half. Each pod's busy time, energy and peak memory must equal what its own processes did
(`series.expected`, by uid), its allocated time must come from the holders, no work of a
process whose cgroup names a pod may land in ``unattributed``, no idle event may name the
working trainer (``idle_after`` is 1 s), and ``report`` must show one row per pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from harness.kube.cluster import KubeCluster, create_node, create_pod, create_statefulset
from harness.processes import unused_port

from gputally.probes.core.allocations import PodAllocations
from tests.kubelet.cri import Runtime, runtime_socket
from tests.otelcol.shapes import METRICS_EXPORT, GputallyProcess
from tests.processors.k8s.kubelet import Kubelet, kubelet_socket
from tests.processors.usage.series import (
    GPU,
    HOLDER_PID,
    NOTEBOOK_PID,
    TRAINER_PID,
    expected,
    probe_requests,
    readings,
    recorded_uid,
    recording,
)
from tests.report.support import report

COUNTERS = {"allocated": "gputally_usage_allocated_time_seconds_total",
            "busy": "gputally_usage_busy_time_seconds_total",
            "energy": "gputally_usage_energy_joules_total",
            "peak": "gputally_usage_memory_peak_bytes"}


@contextlib.asynccontextmanager
async def door(target: tuple[str, int], port: int) -> AsyncIterator[asyncio.Event]:
    """A TCP door to ``target`` on ``port`` (`unused_port`'s): shut (nothing listens:
    connection refused) until the yielded event is set, then a plain forwarder (TLS stays end
    to end) bound beside the hold."""
    opened = asyncio.Event()
    servers: list[asyncio.AbstractServer] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*target)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def open_when_told() -> None:
        await opened.wait()
        servers.append(await asyncio.start_server(forward, "127.0.0.1", port, reuse_port=True))

    task = asyncio.create_task(open_when_told())
    try:
        yield opened
    finally:
        task.cancel()
        for server in servers:
            server.close()


def kubeconfig_through(kube: KubeCluster, port: int, path: Path) -> Path:
    """The limited kubeconfig with its server moved to ``127.0.0.1:port``."""
    doc = yaml.safe_load(kube.limited_kubeconfig.read_text())
    doc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(doc))
    return path


def idle_events(log: str) -> dict[str, int]:
    """Owner id -> how many ``gputally.usage.idle`` events the debug exporter wrote for it
    (verbosity ``normal``: a ``resource {...}`` line, then a line per log record)."""
    found: dict[str, int] = {}
    owner = ""
    for line in log.splitlines():
        if line.startswith("resource "):
            match = re.search(r"gputally\.usage\.owner\.id=([^\s,}]+)", line)
            owner = match.group(1).strip("'\"") if match else ""
        elif " gputally.usage.idle " in line:
            found[owner] = found.get(owner, 0) + 1
    return found


def synced(metrics_url: str) -> bool:
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    return any(line.startswith("gputally_k8s_synced") and line.endswith(" 1.0") for line in text.splitlines())


@pytest.mark.parametrize("api", ["unreachable", "second-half"])
async def test_each_pod_is_accounted_by_uid_whatever_the_api_server_does(
    api: str, prometheus: Any, kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str, tmp_path: Path,
) -> None:
    ns = kube_namespace
    node = f"gpu-{ns[-8:]}"
    create_node(kube_admin, node)
    trainer_set = create_statefulset(kube_admin, ns, "trainer")
    trainer = create_pod(kube_admin, ns, "trainer-0", owner=trainer_set, node_name=node, containers=["train"])
    notebook = create_pod(kube_admin, ns, "jupyter-bob-0", node_name=node, containers=["notebook"])
    uids = {TRAINER_PID: trainer.metadata.uid, NOTEBOOK_PID: notebook.metadata.uid}
    data = recording(uids={recorded_uid(pid): uid for pid, uid in uids.items()})

    kubelet = Kubelet()  # the two pods time-slice the one H200
    kubelet.allocate(ns, "trainer-0", "train", "nvidia.com/gpu.shared", f"{GPU}::0")
    kubelet.allocate(ns, "jupyter-bob-0", "notebook", "nvidia.com/gpu.shared", f"{GPU}::1")
    runtime = Runtime()  # what containerd on the node says: the pods' uids
    runtime.run_pod(ns, "trainer-0", trainer.metadata.uid)
    runtime.run_pod(ns, "jupyter-bob-0", notebook.metadata.uid)
    base = time.time_ns() - 60 * 10**9
    async with kubelet_socket(tmp_path, kubelet) as pr_socket, runtime_socket(tmp_path, runtime) as cri_socket:
        allocations = PodAllocations(pr_socket, refresh_s=0.001, cri=cri_socket)
        try:
            requests = await probe_requests(data, base_ns=base, node=node, allocations=allocations)
        finally:
            await allocations.close()

    api_host, api_port = kube_cluster.api_url.removeprefix("https://").rsplit(":", 1)
    door_port = unused_port()
    config = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
        "processors": {
            "k8s": {"mode": "gateway", "kubeconfig": str(kubeconfig_through(kube_cluster, door_port, tmp_path / "kc")),
                    "watch": {"backoff_initial": "100ms", "backoff_max": "300ms", "request_timeout": "3s"}},
            "usage": {"settle": "200ms", "emit_interval": "1s", "end_after": "1h", "idle_after": "1s"},
        },
        "exporters": {"otlphttp": {"endpoint": prometheus.otlp_url.removesuffix("/v1/metrics"), "compression": "none"},
                      "debug": {"verbosity": "normal"}},  # the usage events, into gputally's own log
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["k8s", "usage"], "exporters": ["otlphttp"]},
                          "logs": {"receivers": ["otlp"], "processors": ["usage"], "exporters": ["debug"]}},
            "telemetry": {"metrics": {"address": "127.0.0.1:0"}},
        },
    }
    half = len(requests) // 2
    gateway = GputallyProcess(config, tmp_path / "gputally")
    async with door((api_host, int(api_port)), door_port) as opened:
        gateway.start()
        port, metrics_url = gateway.port("grpc"), f"http://{gateway.listening.admin[0]}/metrics"
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                export = channel.unary_unary(METRICS_EXPORT)
                for request in requests[:half]:
                    await export(request.SerializeToString(), timeout=5)
                if api == "second-half":
                    opened.set()
                    deadline = time.monotonic() + 30
                    while not await asyncio.to_thread(synced, metrics_url):
                        assert time.monotonic() < deadline, gateway.log_tail()
                        await asyncio.sleep(0.2)
                for request in requests[half:]:
                    await export(request.SerializeToString(), timeout=5)
            await asyncio.sleep(1.5)  # the last samples settle and one emit goes out
        finally:
            assert await asyncio.to_thread(gateway.stop) == 0, gateway.log_tail()

    owner_of = {TRAINER_PID: uids[TRAINER_PID], NOTEBOOK_PID: uids[NOTEBOOK_PID], HOLDER_PID: "unattributed"}
    want = expected(readings(requests), owner_of=owner_of.__getitem__,
                    holders=[uids[NOTEBOOK_PID], uids[TRAINER_PID]])

    def got() -> dict[str, dict[str, float]]:
        found: dict[str, dict[str, float]] = {}
        for field, name in COUNTERS.items():
            for sample in prometheus.query(f"max by (gputally_usage_owner_id) ({name})"):
                owner = sample["metric"].get("gputally_usage_owner_id", "")
                found.setdefault(owner, {})[field] = float(sample["value"][1])
        return found

    deadline = time.monotonic() + 30
    while not math.isclose(got().get(uids[TRAINER_PID], {}).get("busy", -1), want[uids[TRAINER_PID]]["busy"],
                           rel_tol=1e-9):
        assert time.monotonic() < deadline, (got(), want)
        await asyncio.sleep(0.3)
    found = got()
    for pid in (TRAINER_PID, NOTEBOOK_PID):
        uid = uids[pid]
        for field in COUNTERS:
            assert math.isclose(found[uid][field], want[uid][field], rel_tol=1e-9, abs_tol=1e-6), (pid, field)
    assert found.get("unattributed", {}).get("busy", 0.0) == 0.0  # the holder (no pod, no Slurm here) computes nothing
    assert not any("/" in owner for owner in found)  # no pod accounted by name beside its uid
    print(f"\n{api}: " + "; ".join(
        f"{name} busy {found[uids[pid]]['busy']:.6f} s (want {want[uids[pid]]['busy']:.6f}), "
        f"energy {found[uids[pid]]['energy']:.3f} J (want {want[uids[pid]]['energy']:.3f}), "
        f"peak {found[uids[pid]]['peak'] / 2**20:.0f} MiB (want {want[uids[pid]]['peak'] / 2**20:.0f})"
        for name, pid in (("trainer", TRAINER_PID), ("notebook", NOTEBOOK_PID))))

    # idle_after is 1 s: the trainer works every sample, so no idle event may name it; the
    # notebook stops computing while it still holds its share, and is called idle.
    idle = idle_events(gateway.log_path.read_text())
    assert uids[TRAINER_PID] not in idle, idle
    assert want[uids[NOTEBOOK_PID]]["idle"] > 1 and uids[NOTEBOOK_PID] in idle, (want[uids[NOTEBOOK_PID]], idle)
    print(f"{api}: idle events: trainer {idle.get(uids[TRAINER_PID], 0)}, notebook {idle.get(uids[NOTEBOOK_PID], 0)} "
          f"(its idle time {want[uids[NOTEBOOK_PID]]['idle']:.3f} s)")

    table = report("--prometheus", prometheus.url, "--since", "1h", "--by", "pod", "--format", "json").json()
    pods = [row for row in table["rows"] if not row.get("special")]
    assert sorted(row["pod"] for row in pods) == ["jupyter-bob-0", "trainer-0"], table["rows"]

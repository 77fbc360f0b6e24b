"""Shape 4, scale-out, as shipped in collector-config/scale-out/, end to end:

    NVML replay of 12 nodes --> otelcol (scale-out/otelcol.yaml: loadbalancing by host.name)
        --> two `gputally serve` replicas (scale-out/gputally.yaml) --> the same otelcol's
        otlp/gputally receiver --> its backend (a file exporter)

One replica is stopped (SIGTERM, by pid) mid-stream. The other keeps its share flowing; what
was routed to the stopped one is retried and, once retry gives up, counted by the collector's
own ``otelcol_exporter_send_failed_metric_points``: every point either arrives once or is
counted as failed.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from harness.kube.cluster import KubeCluster
from harness.otelcol.collector import Otelcol
from harness.processes import start_on_ports

from tests.otelcol.shapes import (
    METRICS_EXPORT,
    GputallyProcess,
    Key,
    added_keys,
    file_points,
    file_resources,
    h200_recording,
    prometheus_counters,
    quiet,
    replay_requests,
    request_points,
    retimed,
    scale_out_start,
    wait_until,
)

NODES = 12  # routed by host.name: with 12 nodes both replicas get some, but for a 1-in-4096 split
ROUNDS = 16
STOP_AFTER = 6  # rounds sent before one replica goes away
ROUND_NS = 10**12


async def test_two_replicas_share_the_load_and_one_can_go_away(
    otelcol: Callable[..., Otelcol], kube_cluster: KubeCluster, tmp_path: Path,
) -> None:
    recording = h200_recording()
    per_node = [await replay_requests(recording, 3, f"gpu-{n:02d}") for n in range(NODES)]
    rounds = [[retimed(cycles[r % 3], r * ROUND_NS) for cycles in per_node] for r in range(ROUNDS)]

    out = tmp_path / "backend.json"
    replicas: list[GputallyProcess] = []

    start = scale_out_start(otelcol, replicas, tmp_path, out, replica=lambda n: {
        "processors.k8s.kubeconfig": str(kube_cluster.limited_kubeconfig),
        "service.shutdown_timeout": "10s",
    }, front=lambda ports: {
        "exporters.loadbalancing.retry_on_failure": {
            "initial_interval": "100ms", "max_interval": "500ms", "max_elapsed_time": "3s",
        },
        "service.telemetry.metrics": {"level": "detailed", "readers": [
            {"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": ports["telemetry"]}}}},
        ]},
    })

    front = start_on_ports(start, what="the scale-out collector and its replicas")
    front_port, telemetry_port = front.port("otlp"), front.ports["telemetry"]
    stopped = replicas[1]
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front_port}") as channel:
            export = channel.unary_unary(METRICS_EXPORT)
            for r, requests in enumerate(rounds):
                if r == STOP_AFTER:
                    assert await asyncio.to_thread(stopped.stop) == 0, stopped.log_tail()
                for request in requests:
                    await export(request.SerializeToString(), timeout=10)
                await asyncio.sleep(0.05)

        sent = request_points(request for requests in rounds for request in requests)
        total = sum(sent.values())

        def failed() -> int:
            counters = prometheus_counters(f"http://127.0.0.1:{telemetry_port}/metrics",
                                           "otelcol_exporter_send_failed_metric_points")
            return int(sum(v for k, v in counters.items() if "loadbalancing" in k or "load_balancing" in k))

        # Everything settles: each point delivered or, after retry gave up, counted as failed.
        try:
            await wait_until(lambda: _delivered(out, sent) + failed() >= total, "delivery or failure of every point",
                             timeout=60)
        except AssertionError as exc:
            counters = prometheus_counters(f"http://127.0.0.1:{telemetry_port}/metrics", "otelcol_")
            counters = {k: v for k, v in counters.items() if "balanc" in k or "receiver" in k or "exporter" in k}
            raise AssertionError(f"{exc}: {_delivered(out, sent)} delivered + {failed()} failed of {total}\n"
                                 + "\n".join(f"{k} {v}" for k, v in counters.items())) from None
        lost = failed()
    finally:
        for replica in replicas:
            assert await asyncio.to_thread(replica.stop) == 0, replica.log_tail()
    await quiet(out)  # the replicas' last usage counters, sent as they stopped
    code = await asyncio.to_thread(front.stop, 30.0)
    assert code == 0, f"the collector exited {code}:\n{front.log_tail()}"

    got = _ours(out, sent)
    assert max(got.values()) == 1, "a point arrived twice"
    delivered = sum(got.values())
    print(f"scale-out: {total} points sent, {delivered} delivered, {lost} counted as failed")
    assert total - delivered <= lost, f"{total - delivered} points missing, only {lost} counted as failed"
    assert lost > 0, "the stopped replica's share after the stop cannot have arrived"
    # Both replicas did work, and the survivor kept its share flowing after the stop.
    late = {key[3] for key in got if key[3] >= min(_round_times(rounds[STOP_AFTER]))}
    assert late, "nothing sent after the stop arrived"
    for replica in replicas:
        assert re.search(r"started \d+ pipeline", replica.log_path.read_text()), replica.log_tail()
    survivors = {a["host.name"] for a, rm in file_resources(out) if "gputally.k8s.attribution" in a}
    assert survivors, "no resource came back attributed"
    processes = [a for a, _ in file_resources(out) if "process.pid" in a]
    assert processes and all(a["gputally.k8s.attribution"] in ("cgroup", "none") for a in processes)
    assert "dropped" not in stopped.log_path.read_text(), stopped.log_tail()


def _ours(out: Path, sent: Counter[Key]) -> Counter[Key]:
    """The output's points that are the test's, keyed without what gputally added."""
    return Counter({k: n for k, n in file_points(out, drop=added_keys(out, sent)).items() if k in sent})


def _delivered(out: Path, sent: Counter[Key]) -> int:
    return _ours(out, sent).total()


def _round_times(requests: list[Any]) -> set[int]:
    return {key[3] for key in request_points(requests)}

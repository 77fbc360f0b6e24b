"""What the ``usage`` processor costs: pipeline throughput with and without it, and its memory.

Throughput: bench/k8s_throughput.py's 8-GPU node request (340 points, 18 resources) on a mixed
node: a real kube-apiserver with 6 pods and a PodResources socket allocating them 6 GPUs, and
a real one-node Slurm cluster (tests/harness/slurm, through bench/slurm_setup.py) running two
jobs, each holding one GRES GPU with two processes on it. Through ``gputally serve`` with
``k8s`` + ``slurm`` (the ``cli`` backend, as on a Slurm node) and with ``k8s`` + ``slurm`` +
``usage``, both servers at once on the same load for ``--rounds`` rounds (the machine's noise
then hits both alike; ``--interleaved``: one after the other, best round each), so on every request ``k8s`` attributes 6 processes
by cgroup and 6 GPUs by PodResources and ``slurm`` 4 processes by cgroup and 2 GPUs by GRES
from its cache (checked on the server's /metrics; the run fails otherwise), and ``usage``
integrates all 8 GPUs for their pod and job owners. Every request carries a new sample time
(the load generator restamps it), so each one is integrated in full, as a node's real cycles
are: the worst case for ``usage``, which then works on every request. Needs root (slurmd).

Memory: a ledger for ``--gpus`` GPUs, each held by one pod with one Slurm job's process on it
(two owners per GPU), filled sample by sample; tracemalloc's figure and the process RSS
growth, and the time one emit of every counter takes. In process: the CPU time the usage
runtime alone takes per node request (no server), and how much of it is reading.

    .venv/bin/python bench/usage_cost.py [--seconds 10] [--rounds 2] [--gpus 10000] [--memory-only] [--interleaved]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import struct
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))

STAMP = 1_795_977_093_000_000_000
"""The sample time gpu_node_request writes into every point; the load generator replaces it."""


USAGE_NAMES = {
    # gpu_node_request's synthetic GPU metrics that become the ones usage reads (a sum for the
    # energy counter, gauges for the rest), so every request is integrated; the point count stays 340.
    "hw.gpu.metric_01": "hw.gpu.utilization", "hw.gpu.metric_03": "hw.energy",
    "hw.gpu.metric_02": "hw.gpu.memory.usage", "hw.gpu.metric_04": "hw.gpu.memory.limit",
    "hw.gpu.process.metric_00": "gputally.gpu.process.memory.usage",
    "hw.gpu.process.metric_01": "gputally.gpu.process.utilization",
}


def with_usage_metrics(payload: bytes) -> bytes:
    """The node request with the metric names usage reads in place of synthetic ones."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    request = ExportMetricsServiceRequest.FromString(payload)
    renamed = 0
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name in USAGE_NAMES:
                    metric.name = USAGE_NAMES[metric.name]
                    renamed += 1
    assert renamed == 8 * 4 + 10 * 2, renamed
    return request.SerializeToString()


def restamped(payload: bytes) -> Callable[[], bytes]:
    """Each call: ``payload`` with its sample time 10 s later than the call before (a node's cycles)."""
    payload = with_usage_metrics(payload)
    old = struct.pack("<Q", STAMP)
    assert payload.count(old) > 0, "the request carries no sample time to replace"
    times = itertools.count(STAMP + 10**10, 10**10)
    return lambda: payload.replace(old, struct.pack("<Q", next(times)))


def throughput(args: argparse.Namespace) -> None:
    from k8s_throughput import attribution_line, interleaved

    scenarios = ["k8s + slurm", "k8s + slurm + usage"]
    best = interleaved(scenarios, args, restamped, ", a new sample time on every request", paired=args.paired)
    print(f"{'scenario':28} {'accepted/s':>10} {'pts/CPU-s':>10} {'p50 ms':>7} {'p99 ms':>7} {'RSS MiB':>8} {'lost':>5}")
    for name in scenarios:
        r = best[name]
        print(f"{name:28} {r['points_per_s']:>10,.0f} {r['points_per_cpu_s']:>10,.0f} {r['p50_ms']:>7.2f} "
              f"{r['p99_ms']:>7.2f} {r['rss_mib']:>8.1f} {r['lost']:>5}")
    for name in scenarios:
        print(f"{name}: resources attributed per request: {attribution_line(best[name])}")
    if args.paired:
        ratios = sorted(best[scenarios[1]]["ratios"])
        print("per round, usage costs: " + ", ".join(f"{1 - r:.1%}" for r in best[scenarios[1]]["ratios"]))
        ratio = ratios[len(ratios) // 2]
        how = "median of rounds with both servers loaded at once"
    else:
        ratio = best[scenarios[1]]["points_per_cpu_s"] / best[scenarios[0]]["points_per_cpu_s"]
        how = "best round of each"
    print(f"usage costs {1 - ratio:.1%} of the points per CPU-second against {scenarios[0]} ({how}; "
          "target: at most 10%)")


def in_process(rounds: int = 7, requests: int = 1500) -> None:
    """CPU microseconds per node request in the usage runtime alone (no server, no gRPC), the
    least of ``rounds``: the whole observe, the reading part, and the skeleton check in it."""
    from gpu_node_request import gpu_node_request

    from gputally.processors.usage.config import UsageConfig
    from gputally.processors.usage.processor import UsageRuntime

    def timed(work: Callable[[bytes], object], batch: list[bytes], then: Callable[[], object] = lambda: None) -> float:
        started = time.process_time()
        for raw in batch:
            work(raw)
        then()
        return (time.process_time() - started) / len(batch) * 1e6

    node = restamped(gpu_node_request().SerializeToString())
    best = {"observe": float("inf"), "read": float("inf"), "skeleton check": float("inf")}
    for _ in range(rounds):
        runtime = UsageRuntime(UsageConfig(settle=0), name="usage")
        batch = [node() for _ in range(requests)]
        for raw in batch[:3]:  # its layout is built on the second sighting
            runtime.observe(raw)
            runtime.account()
        layout = runtime.observer.layouts.lookup(batch[3])
        assert layout is not None, "the node request is not read through a layout"
        fresh = [node() for _ in range(requests)]  # bytes not yet in the CPU's caches, as a new request's
        best["observe"] = min(best["observe"], timed(runtime.observe, batch[4:], runtime.account))
        best["read"] = min(best["read"], timed(lambda raw: list(runtime.observer.observe(raw)), fresh))
        best["skeleton check"] = min(best["skeleton check"], timed(layout.matches, [node() for _ in range(requests)]))
    print("in process, per node request (CPU us, least of "
          f"{rounds} rounds): " + ", ".join(f"{name} {us:.1f}" for name, us in best.items()))


def memory(gpus: int) -> None:
    from gputally.processors.usage.config import UsageConfig
    from gputally.processors.usage.emit import MetricsEmitter
    from gputally.processors.usage.ledger import Ledger
    from gputally.processors.usage.observe import DeviceReading, ProcessReading
    from gputally.processors.usage.owners import Owner

    def fill(cycles: int) -> tuple[Ledger, float]:
        book = Ledger(UsageConfig(settle=0, end_after=10**6), start_ns=0)
        pod_attributes = (("k8s.namespace.name", "ml"), ("gputally.k8s.owner.kind", "StatefulSet"))
        samples = []
        for g in range(gpus):  # what the observer hands over, built before the clock starts
            hw_id = f"GPU-{g:08d}-0000-0000-0000-000000000000"
            pod = (Owner("k8s.pod", f"ml/trainer-{g}"), (*pod_attributes, ("k8s.pod.name", f"trainer-{g}")))
            job = (Owner("slurm.job", str(100000 + g)), (("slurm.job.id", 100000 + g), ("slurm.job.user", "alice")))
            attributes = (("hw.id", hw_id), ("hw.model", "NVIDIA H100 80GB HBM3"), ("host.name", f"node-{g // 8}"))
            samples.append((hw_id, pod, job, attributes))
        started = time.perf_counter()
        for t in range(cycles):  # every account exists and has integrated cycles - 1 times
            time_ns = (t + 1) * 10**10
            for hw_id, pod, job, attributes in samples:
                book.add(hw_id, time_ns, DeviceReading(utilization=0.5, energy_j=1000.0 * t, memory=2**33,
                                                       limit=2**37, allocation=(pod,), attributes=attributes),
                         "", None, arrived=0.0)
                book.add(hw_id, time_ns, None, "1@", ProcessReading(owner=job, utilization=0.4, memory=2**32),
                         arrived=0.0)
            book.settle(0.0, everything=True)
        return book, (time.perf_counter() - started) / (cycles * gpus)

    process = psutil.Process()
    gc.collect()
    rss0 = process.memory_info().rss
    book, per_sample = fill(3)
    gc.collect()
    rss = process.memory_info().rss - rss0
    del book
    gc.collect()
    tracemalloc.start()
    book, _ = fill(3)
    gc.collect()
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    accounts = sum(len(d.accounts) for d in book.devices.values())
    # One request's worth at a time, as `serve` hands them over: add, then settle what is due.
    # With 10,000 GPUs known, only the GPU with a waiting sample is looked at.
    hw_id = next(iter(book.devices))
    reading = DeviceReading(utilization=0.5, energy_j=1.0, allocation=(), attributes=(("hw.id", hw_id),))
    started = time.perf_counter()
    for t in range(4, 1004):
        book.add(hw_id, t * 10**10, reading, "", None, arrived=0.0)
        book.settle(1.0)
    per_request = (time.perf_counter() - started) / 1000
    emitter = MetricsEmitter()
    started = time.perf_counter()
    requests = emitter.requests(book, 10**18)
    cold = time.perf_counter() - started
    started = time.perf_counter()
    requests = emitter.requests(book, 2 * 10**18)
    warm = time.perf_counter() - started
    size = sum(r.ByteSize() for r in requests)
    resources = sum(len(r.resource_metrics) for r in requests)
    print(f"ledger: {gpus:,} GPUs, {len(book.owners):,} owners, {accounts:,} (owner, GPU) accounts")
    print(f"memory: {traced / 2**20:.1f} MiB allocated (tracemalloc), RSS grew {rss / 2**20:.1f} MiB "
          f"(target: at most 50 MB); {per_sample * 1e6:.1f} us per GPU sample (GPU + one process) to integrate")
    print(f"one GPU sample added and settled beside {gpus:,} others: {per_request * 1e6:.1f} us")
    print(f"one emit of every counter: {cold:.2f} s the first time, {warm:.2f} s after (resources cached); "
          f"{size / 2**20:.1f} MiB of OTLP, {resources:,} resources in {len(requests)} requests")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pin", action="store_true", help="server on the last CPU; load and sink on the rest")
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--memory-only", action="store_true", help="skip the throughput part (no API server, no Slurm cluster)")
    parser.add_argument("--interleaved", dest="paired", action="store_false",
                        help="run the two servers one after the other (best round each) instead of both at once, "
                             "loaded together (the default: a busy machine's noise then hits both alike)")
    args = parser.parse_args()
    memory(args.gpus)
    in_process()
    if not args.memory_only:
        throughput(args)


if __name__ == "__main__":
    main()

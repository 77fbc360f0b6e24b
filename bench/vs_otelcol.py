"""gputally next to the OpenTelemetry Collector on the same work, in one run (issue 17).

The load of bench/pipeline_throughput.py (bench/gpu_node_request.py's 340-point request of an
8-GPU node, 8 requests in flight, one OTLP/gRPC sink) sent to `gputally serve` and to the
otelcol that tests/harness/otelcol/build.sh builds from collector-config/builder.yaml (v0.161.0 with the contrib resource, attributes and transform
processors), one fresh server process per run, the two servers alternating, every scenario
``--rounds`` times; the best round (points per CPU-second) of each server is kept.

Scenarios, gputally / otelcol:

  forward (no processor)     no processor / no processor
  resource attribute insert  attributes (context: resource, insert) / resource (insert)
  attribute on every point   attributes (context: point, insert) / attributes (insert)
  k8s (node mode)            k8s, node mode, against a real kube-apiserver and PodResources socket
                             (bench/k8s_throughput.py's attributed node) / resource inserting, on
                             every resource, as many attributes as k8s added per resource on
                             average (counted from what gputally's k8s run delivered to the sink)
  k8s + slurm + usage        k8s, slurm (cli backend) and usage on a mixed node: a real one-node
                             Slurm cluster (bench/slurm_setup.py) runs two jobs on GPUs 0 and 1
                             with two processes each, pods hold the other 6 GPUs and 6 processes
                             (bench/k8s_throughput.py's mixed node), every request a new sample
                             time that usage integrates (bench/usage_cost.py's load) / resource
                             inserting as many attributes as k8s and slurm added per resource
  forward over OTLP/HTTP     the forward scenario with the load sent as OTLP/HTTP protobuf

The attributed scenarios are measured once attribution has settled (the k8s cache synced; slurm
attributing every job's processes and GPUs from its cache, per the server's counters), and each
measured run checks on the server's /metrics that every request was attributed as it should be.
What otelcol's ``resource`` inserts is learned from the last request gputally delivered once
settled (the sink otelcol also writes what it receives to a file).

The sink is the same otelcol binary (a Go backend that keeps up; ``--python-sink`` for
bench/sink.py, which, pinned beside the load generator, falls behind otelcol and lets its
queue fill until it refuses). "pts/CPU-s" is points per second of server CPU (user + system,
all threads and reaped children, such as the slurm ``cli`` backend's scontrol/squeue; psutil for
both processes): the per-core figure. With ``--pin`` the server is started on the last CPU (so
the Go runtime sizes GOMAXPROCS to 1) and the load generator and sink run on the others. The
table has each server's best round and, in brackets, the ratio of the medians of the rounds,
and each server's context switches per request (all its threads, from /proc).

By default each of the ``--in-flight`` calls is sent again as soon as it is answered, so the
slowest part sets the pace. That part can be the sink, which shares a core with the load
generator: then the server's queue fills (otelcol refuses, its memory grows) and gputally
sends its backlog in fewer, larger calls, and the ratio says more about the sink than about
the servers. ``--rate N`` offers N requests a second on a fixed schedule instead, below what
any part takes: both servers do the same work, and points per CPU-second compare their cost.

    .venv/bin/python bench/vs_otelcol.py [--seconds 8] [--rounds 2] [--pin] [--rate 1000] [--only k8s]
                                         [--no-k8s] [--no-slurm] [--profile DIR]   (gputally under cProfile)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

sys.path.insert(0, str(Path(__file__).parent))
from gpu_node_request import gpu_node_request  # noqa: E402
from pipeline_throughput import METHOD, free_port, wait_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SINK = Path(__file__).parent / "sink.py"
BUILD = ROOT / "tests" / "harness" / "otelcol" / "build.sh"
SERVERS = ("gputally", "otelcol")
FORWARD, RESOURCE, POINT, K8S, SLURM, HTTP = (
    "forward (no processor)", "resource attribute insert", "attribute on every point", "k8s (node mode)",
    "k8s + slurm + usage", "forward over OTLP/HTTP")
SCENARIOS = [FORWARD, RESOURCE, POINT, K8S, SLURM, HTTP]
ATTRIBUTED = (K8S, SLURM)
CLUSTER = ("k8s.cluster.name", "bench")
Payload = bytes | Callable[[], bytes]
"""The same request every time, or a new one per call (a new sample time, for usage)."""


@dataclass
class Node:
    """An attributed node of the k8s scenarios: where its k8s processor looks, its slurm
    processor's config, the request, and what each request must get (resources per request by
    ``"<processor> <source>"`` on the server's /metrics)."""

    name: str
    socket: Path
    allocations: int
    """GPUs the PodResources socket allocates to pods."""
    payload: Payload
    slurm: dict[str, Any] | None = None
    expected: dict[str, float] = field(default_factory=dict)


class Context:
    """What the scenarios share: payloads, the attributed nodes, what their processors were seen to add."""

    def __init__(self) -> None:
        from gputally.otlp.census import census_metrics

        self.payload = gpu_node_request().SerializeToString()
        self.points = census_metrics(self.payload).items
        self.plane: Any = None
        """The API server of the attributed scenarios."""
        self.kubeconfig: Path | None = None
        self.nodes: dict[str, Node] = {}
        self.added: dict[str, list[tuple[str, Any]]] = {}
        """Per attributed scenario: what otelcol's resource inserts on every resource."""
        self.notes: dict[str, str] = {}
        self.grpc_implementation = "native"
        """gputally's receiver and exporter ``implementation`` (``--grpc-implementation``)."""

    def payload_of(self, scenario: str) -> Payload:
        return self.nodes[scenario].payload if scenario in self.nodes else self.payload


def processors(server: str, scenario: str, ctx: Context) -> dict[str, Any]:
    key, value = CLUSTER
    if scenario == RESOURCE:
        if server == "gputally":
            return {"attributes/bench": {"actions": [
                {"key": key, "value": value, "action": "insert", "context": "resource"}]}}
        return {"resource/bench": {"attributes": [{"key": key, "value": value, "action": "insert"}]}}
    if scenario == POINT:
        if server == "gputally":
            return {"attributes/bench": {"actions": [
                {"key": key, "value": value, "action": "insert", "context": "point"}]}}
        return {"attributes/bench": {"actions": [{"key": key, "value": value, "action": "insert"}]}}
    if scenario in ATTRIBUTED:
        if server == "gputally":
            node = ctx.nodes[scenario]
            procs: dict[str, Any] = {"k8s": {
                "mode": "node", "node_name": node.name, "kubeconfig": str(ctx.kubeconfig),
                "pod_resources": {"socket": str(node.socket)}, "extract": {"labels": ["app"]}}}
            if node.slurm is not None:
                procs["slurm"] = node.slurm
                procs["usage"] = {"settle": 0, "emit_interval": "10s"}  # as bench/usage_cost.py
            return procs
        assert scenario in ctx.added, "run(learn=True) says what gputally adds"
        return {"resource/attributed": {"attributes": [
            {"key": k, "value": v, "action": "insert"} for k, v in ctx.added[scenario]]}}
    return {}


def config(server: str, scenario: str, ports: dict[str, int], ctx: Context) -> dict[str, Any]:
    procs = processors(server, scenario, ctx)
    receiver: dict[str, Any] = {"grpc": {"endpoint": f"127.0.0.1:{ports['grpc']}"}}
    if scenario == HTTP:
        receiver = {"http": {"endpoint": f"127.0.0.1:{ports['http']}"}}
    exporter: dict[str, Any] = {"endpoint": f"127.0.0.1:{ports['sink']}", "tls": {"insecure": True},
                                "compression": "none", "sending_queue": {"num_consumers": 8, "queue_size": 5000}}
    if server == "gputally":
        telemetry: dict[str, Any] = {
            "metrics": {"address": f"127.0.0.1:{ports['admin']}" if scenario in ATTRIBUTED else None}}
        if "grpc" in receiver:
            receiver["grpc"]["implementation"] = ctx.grpc_implementation
        exporter["implementation"] = ctx.grpc_implementation
    else:
        telemetry = {"metrics": {"level": "none"}, "logs": {"level": "warn"}}
    return {
        "receivers": {"otlp": {"protocols": receiver}},
        "processors": procs,
        "exporters": {"otlp": exporter},
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": list(procs), "exporters": ["otlp"]}},
            "telemetry": telemetry,
        },
    }


REFUSAL_PAUSE = 0.005
"""Seconds a sender waits after a refusal (429 / RESOURCE_EXHAUSTED, or 503 / UNAVAILABLE, as
otelcol answers when its sending queue is full: the server's queue is full, try again)."""


class Load:
    """Send ``payload`` for ``seconds`` with ``in_flight`` calls outstanding over OTLP/gRPC or
    OTLP/HTTP (protobuf). A refusal is counted, paused for and sent again, as a sender would:
    ``sent`` counts accepted requests only, ``latencies`` are theirs. ``rate``: requests per second
    offered on a fixed schedule (0: each call sent as soon as one answers, so the slowest of
    server, sink and load generator sets the pace)."""

    def __init__(self, rate: float = 0.0) -> None:
        self.rate = rate
        self.sent = 0
        self.refused = 0
        self.latencies: list[float] = []

    async def grpc(self, port: int, payload: Payload, seconds: float, in_flight: int) -> Load:
        import grpc

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(METHOD)

            async def one() -> bool:
                try:
                    await call(payload() if callable(payload) else payload, timeout=10)
                except grpc.aio.AioRpcError as error:
                    if error.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                        raise
                    return False
                return True

            await self._workers(one, seconds, in_flight)
        return self

    async def native(self, port: int, payload: Payload, seconds: float, in_flight: int) -> Load:
        """As :meth:`grpc`, on gputally's own gRPC client (``gputally.h2.Channel``): the same
        calls for less CPU than grpc.aio's, which a small machine gives to the servers."""
        import grpc

        from gputally.h2 import GrpcError
        from gputally.h2.client import Channel

        channel = Channel(f"127.0.0.1:{port}")
        try:

            async def one() -> bool:
                try:
                    await channel.unary(METHOD, payload() if callable(payload) else payload, timeout=10)
                except GrpcError as error:
                    if error.code not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                        raise
                    return False
                return True

            await self._workers(one, seconds, in_flight)
        finally:
            await channel.close()
        return self

    async def http(self, port: int, payload: Payload, seconds: float, in_flight: int) -> Load:
        import aiohttp

        url = f"http://127.0.0.1:{port}/v1/metrics"
        headers = {"Content-Type": "application/x-protobuf"}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=in_flight)) as session:

            async def one() -> bool:
                body = payload() if callable(payload) else payload
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    if response.status not in (200, 429, 503):
                        raise RuntimeError(f"HTTP {response.status} from {url}")
                    return response.status == 200

            await self._workers(one, seconds, in_flight)
        return self

    async def _workers(self, one: Callable[[], Awaitable[bool]], seconds: float, in_flight: int) -> None:
        deadline = time.perf_counter() + seconds
        interval = 1.0 / self.rate if self.rate else 0.0
        schedule = [time.perf_counter()]  # the next send's time, shared by the workers

        async def worker() -> None:
            while time.perf_counter() < deadline:
                if interval:
                    at, schedule[0] = schedule[0], schedule[0] + interval
                    if (delay := at - time.perf_counter()) > 0:
                        await asyncio.sleep(delay)
                started = time.perf_counter()
                if await one():
                    self.latencies.append(time.perf_counter() - started)
                    self.sent += 1
                else:
                    self.refused += 1
                    await asyncio.sleep(REFUSAL_PAUSE)

        await asyncio.gather(*(worker() for _ in range(in_flight)))


def spawn(command: list[str], cpus: list[int], **kwargs: Any) -> subprocess.Popen[bytes]:
    """Popen with the child on ``cpus`` from its first instruction: the affinity is inherited from
    this thread, set around the spawn (a preexec_fn would fork with gRPC threads running)."""
    me = psutil.Process()
    saved = me.cpu_affinity()
    me.cpu_affinity(cpus)
    try:
        return subprocess.Popen(command, **kwargs)
    finally:
        me.cpu_affinity(saved)


class Sink:
    """The backend both servers export to. By default the built otelcol itself (OTLP/gRPC in, the
    debug exporter with its log lines below the log level), counted by its own
    otelcol_receiver_accepted_metric_points: pinned, bench/sink.py (Python) shares its core with
    the load generator and falls behind otelcol-under-test, whose queue then fills and refuses.
    ``keep``: the otelcol sink also writes every request it receives to this file (OTLP/JSON, a
    line each), for :meth:`last_request`."""

    def __init__(self, args: argparse.Namespace, port: int, cpus: list[int], tmp: Path,
                 keep: Path | None = None) -> None:
        self.report = tmp / "sink.json"
        self.keep = keep
        if args.python_sink and not keep:
            self.url = ""
            self.proc = spawn([sys.executable, str(SINK), "--port", str(port), "--report", str(self.report)], cpus,
                              stdout=subprocess.PIPE)
            assert self.proc.stdout is not None
            self.proc.stdout.readline()
            return
        metrics_port = free_port()
        self.url = f"http://127.0.0.1:{metrics_port}/metrics"
        path = tmp / "sink.yaml"
        exporters: dict[str, Any] = {"debug": {"verbosity": "basic"}}
        if keep:
            exporters["file"] = {"path": str(keep), "format": "json", "flush_interval": "100ms"}
        path.write_text(json.dumps({
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}",
                                                          "max_recv_msg_size_mib": 64}}}},
            "exporters": exporters,
            "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "exporters": list(exporters)}},
                        "telemetry": {"logs": {"level": "warn"}, "metrics": {"level": "normal", "readers": [
                            {"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": metrics_port}}}}]}}},
        }))
        self.proc = spawn([str(args.otelcol), "--config", str(path)], cpus, stderr=subprocess.DEVNULL)
        wait_port(port, 30)
        wait_port(metrics_port, 30)

    def points(self) -> int:
        if not self.url:
            try:
                return int(json.loads(self.report.read_text())["points"])
            except (OSError, ValueError):
                return 0
        with urllib.request.urlopen(self.url, timeout=5) as response:
            text = response.read().decode()
        return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("otelcol_receiver_accepted_metric_points")))

    def wait(self, points: int, timeout: float = 60.0) -> None:
        """Until the sink has ``points`` (or give up: ``lost`` says so)."""
        deadline = time.monotonic() + timeout
        while self.points() < points and time.monotonic() < deadline:
            time.sleep(0.05)

    def delivered(self, timeout: float = 10.0) -> list[bytes]:
        """The requests written to ``keep`` so far (the file exporter flushes every 100 ms),
        encoded, last first; one written in part is left out."""
        from gputally.errors import InvalidRequest
        from gputally.otlp.json import decode

        assert self.keep is not None
        deadline = time.monotonic() + timeout
        while True:
            found = []
            for line in reversed(self.keep.read_bytes().splitlines() if self.keep.exists() else []):
                with contextlib.suppress(InvalidRequest):
                    found.append(decode(line, ExportMetricsServiceRequest()).SerializeToString())
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.1)

    def stop(self) -> int:
        received = self.points()
        self.proc.terminate()
        self.proc.wait(30)
        return self.points() if not self.url else received


def run(server: str, scenario: str, args: argparse.Namespace, ctx: Context, *, learn: bool = False) -> dict[str, Any]:
    """One fresh server and sink, warmed for 1 s (and until attribution settled), then
    ``args.seconds`` of load; ``learn``: gputally only, then what it added to the last request
    delivered (see :func:`learn_added`)."""
    ports = {name: free_port() for name in ("grpc", "http", "sink", "admin")}
    payload = ctx.payload_of(scenario)
    points = ctx.points
    node = ctx.nodes.get(scenario) if server == "gputally" else None
    cpus = list(range(os.cpu_count() or 1))
    server_cpus, other_cpus = (cpus[-1:], cpus[:-1] or cpus) if args.pin else (cpus, cpus)
    with tempfile.TemporaryDirectory() as tmp:
        path, kept = Path(tmp) / "config.yaml", Path(tmp) / "delivered.jsonl"
        path.write_text(json.dumps(config(server, scenario, ports, ctx)))  # JSON is YAML
        sink = Sink(args, ports["sink"], other_cpus, Path(tmp), keep=kept if learn else None)
        command = ([str(Path(sys.executable).parent / "gputally"), "serve", "--config", str(path)]
                   if server == "gputally" else [str(args.otelcol), "--config", str(path)])
        if args.profile and server == "gputally" and not learn:  # cProfile of the main thread (the event loop)
            args.profile.mkdir(parents=True, exist_ok=True)
            out = args.profile / (scenario.split(" (")[0].replace(" + ", "-").replace(" ", "-").replace("/", "") + ".prof")
            command = [sys.executable, "-m", "cProfile", "-o", str(out), *command]
        # Pinned from the start, so Go's runtime sees one CPU (GOMAXPROCS=1), as Python's one core.
        proc = spawn(command, server_cpus, stderr=None if args.verbose else subprocess.DEVNULL)
        if args.pin:
            psutil.Process().cpu_affinity(other_cpus)

        def send(seconds: float) -> Load:
            if scenario == HTTP:
                return asyncio.run(Load(args.rate).http(ports["http"], payload, seconds, args.in_flight))
            return asyncio.run(Load(args.rate).grpc(ports["grpc"], payload, seconds, args.in_flight))

        try:
            wait_port(ports["http" if scenario == HTTP else "grpc"], 30)
            if node is not None:
                from k8s_setup import wait_metric

                wait_metric(ports["admin"], "gputally_k8s_synced", lambda v: v == 1, 60)
                wait_metric(ports["admin"], "gputally_k8s_device_allocations", lambda v: v >= node.allocations, 60)
            ps = psutil.Process(proc.pid)
            warm = send(1.0).sent
            if node is not None:
                warm += settle(ports["admin"], node, send)
            sink.wait(warm * points)
            if learn:
                time.sleep(0.3)  # the sink's file exporter flushes every 100 ms
                sample = payload() if callable(payload) else payload
                learn_added(ctx, scenario, sample, sink.delivered())
                return {}
            before = attribution(ports["admin"]) if node is not None else {}
            cpu0, switches0 = server_cpu(ps), context_switches(ps)
            t0 = time.perf_counter()
            measured = send(args.seconds)
            sent, latencies = measured.sent, measured.latencies
            wall = time.perf_counter() - t0
            rss = ps.memory_info().rss
            sink.wait((warm + sent) * points)
            delivered_wall = time.perf_counter() - t0
            cpu = server_cpu(ps) - cpu0
            switches = context_switches(ps) - switches0
            after = attribution(ports["admin"]) if node is not None else {}
            # A request the server refused (its exporter queue full) was attributed before it was
            # refused and is sent again: it counts once for each time it went through.
            attributed = per_request(before, after, sent + measured.refused) if node is not None else {}
        finally:
            proc.terminate()
            proc.wait(30)
            received = sink.stop()
    if node is not None and attributed != node.expected:
        raise RuntimeError(f"{scenario}: attributed per request {attributed}, want {node.expected}")
    latencies.sort()
    return {
        "points_per_s": sent * points / wall,
        "delivered_per_s": sent * points / delivered_wall,
        "points_per_cpu_s": sent * points / cpu if cpu else float("nan"),
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[max(int(len(latencies) * 0.99) - 1, 0)] * 1e3,
        "rss_mib": rss / 2**20,
        "lost": (warm + sent) * points - received,
        "switches_per_request": switches / max(sent, 1),
        "refused": measured.refused,
    }


def context_switches(ps: psutil.Process) -> int:
    """Context switches of all the server's threads so far (psutil's count is the main thread's)."""
    total = 0
    for task in Path(f"/proc/{ps.pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:  # voluntary and nonvoluntary
                    total += int(line.split()[1])
    return total


def server_cpu(ps: psutil.Process) -> float:
    """CPU seconds of the server and of its reaped children (the slurm ``cli`` backend's commands)."""
    times = ps.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


ATTRIBUTION = {"gputally_k8s_attribution_total": "k8s", "gputally_slurm_resources_total": "slurm"}
SOURCES = {"k8s": ("cgroup", "podresources", "none", "pending"), "slurm": ("cgroup", "environ", "gres", "none")}


def attribution(admin_port: int) -> dict[str, float]:
    """The attribution counters on the server's /metrics by ``"<processor> <source>"``."""
    from k8s_setup import metric

    counts = {}
    for name, processor in ATTRIBUTION.items():
        for source in SOURCES[processor]:
            value = metric(admin_port, name, {"source": source})
            if value is not None:
                counts[f"{processor} {source}"] = value
    return counts


def per_request(before: dict[str, float], after: dict[str, float], requests: int) -> dict[str, float]:
    """Growth per request of the counters that grew."""
    grown = {key: (value - before.get(key, 0.0)) / max(requests, 1) for key, value in after.items()}
    return {key: value for key, value in grown.items() if value}


SETTLE_TIMEOUT = 60.0
"""Longest wait for the processors to attribute every request as they should."""


def settle(admin_port: int, node: Node, send: Callable[[float], Load]) -> int:
    """Send in 0.5 s bursts until a burst's requests were all attributed as ``node.expected``
    says (slurm: once the jobs' metadata and GRES GPUs are cached); the requests sent."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    sent = 0
    while True:
        before = attribution(admin_port)
        burst = send(0.5).sent
        sent += burst
        got = per_request(before, attribution(admin_port), burst)
        if got == node.expected:
            return sent
        if time.monotonic() > deadline:
            raise RuntimeError(f"attribution did not settle in {SETTLE_TIMEOUT:.0f} s: per request {got}, "
                               f"want {node.expected}")


def _value(kv: Any) -> Any:
    kind = kv.value.WhichOneof("value")
    return getattr(kv.value, kind) if kind in ("string_value", "int_value", "double_value", "bool_value") else str(kv.value)


def learn_added(ctx: Context, scenario: str, sent: bytes, delivered: list[bytes]) -> None:
    """Count the resource attributes gputally's processors added to the last delivered request
    of ``sent``'s resources (delivered minus sent, per resource); otelcol's ``resource`` then
    inserts the rounded mean number of them on every resource, the keys and values of the most
    attributed resource (the same total number of attributes). A delivered request may hold
    several (the exporter sends a backlog as one); usage's own requests are passed over."""
    before = ExportMetricsServiceRequest.FromString(sent)

    def identity(rm: Any) -> tuple[Any, ...]:
        return tuple(sorted((kv.key, _value(kv)) for kv in rm.resource.attributes if kv.key in ("hw.id", "process.pid")))

    keys = {identity(rm): {kv.key for kv in rm.resource.attributes} for rm in before.resource_metrics}
    added: list[list[tuple[str, Any]]] = []
    for raw in delivered:
        after = ExportMetricsServiceRequest.FromString(raw)
        added = [[(kv.key, _value(kv)) for kv in rm.resource.attributes if kv.key not in keys[identity(rm)]]
                 for rm in after.resource_metrics if identity(rm) in keys]
        if added:
            break
    if not added:
        raise RuntimeError(f"{scenario}: none of the {len(delivered)} requests the sink kept holds the load's resources")
    counts = [len(a) for a in added]
    mean = statistics.mean(counts)
    richest = max(added, key=len)
    n = round(mean)
    ctx.added[scenario] = richest[:n] + [(f"k8s.bench.pad_{i}", "x" * 16) for i in range(n - len(richest))]
    ctx.notes[scenario] = (
        f"{scenario}: gputally added {sum(counts)} attributes to {len(counts)} resources ({mean:.1f} per resource "
        f"on average, {min(counts)}-{max(counts)}); otelcol's resource processor inserts {n} on every resource: "
        f"{', '.join(k for k, _ in ctx.added[scenario])}")


def setup_k8s(ctx: Context, stack: contextlib.ExitStack, tmp: Path) -> None:
    """The attributed node of bench/k8s_throughput.py: 10 pods in a real API server, 8 GPUs in PodResources."""
    from gpu_node_request import GPUS, PROCESSES
    from k8s_setup import FakeKubelet
    from k8s_throughput import NODE, gpu_uuid, node_request, setup_pods

    ns, pods = setup_pods(control_plane(ctx, stack).admin_client(), PROCESSES)
    socket = tmp / "kubelet.sock"
    kubelet = FakeKubelet(socket, [(ns, pods[g]["name"], "main", gpu_uuid(g)) for g in range(GPUS)])
    stack.callback(kubelet.stop)
    payload = node_request([(p["uid"], p["cid"]) for p in pods]).SerializeToString()
    ctx.nodes[K8S] = Node(NODE, socket, GPUS, payload, expected={"k8s cgroup": PROCESSES, "k8s podresources": GPUS})


def setup_slurm(ctx: Context, stack: contextlib.ExitStack, tmp: Path) -> None:
    """bench/k8s_throughput.py's mixed node: a real one-node Slurm cluster (bench/slurm_setup.py)
    whose two jobs hold GPUs 0 and 1 and run processes 0, 1, 8, 9 (their real pids and cgroups),
    pods holding the other GPUs and processes; the request renamed and restamped on every call
    as bench/usage_cost.py does, so usage integrates each one."""
    from k8s_throughput import attributed_node
    from usage_cost import restamped

    node, payload = attributed_node(stack, tmp / "kubelet-slurm.sock", control_plane(ctx, stack), with_slurm=True)
    ctx.nodes[SLURM] = Node(node.name, node.socket, node.allocations, restamped(payload), node.slurm, node.expected)


def control_plane(ctx: Context, stack: contextlib.ExitStack) -> Any:
    """The harness's etcd + kube-apiserver, started once for every attributed scenario."""
    from k8s_setup import cluster

    if ctx.plane is None:
        ctx.plane = cluster()
        stack.callback(ctx.plane.stop)
        ctx.kubeconfig = ctx.plane.limited_kubeconfig
    return ctx.plane


def find_otelcol() -> Path:
    done = subprocess.run([str(BUILD), "--check"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"no up-to-date otelcol build: run {BUILD.relative_to(ROOT)} first (or pass --otelcol PATH)")
    return Path(done.stdout.strip().removeprefix("OTELCOL="))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--rate", type=float, default=0.0, metavar="REQ_PER_S",
                        help="offer this many requests per second on a fixed schedule, at most --in-flight "
                             "outstanding (default: as fast as answered, the slowest part setting the pace)")
    parser.add_argument("--grpc-implementation", choices=("native", "grpcio"), default="native",
                        help="gputally's gRPC receiver and exporter (default: native, as gputally's own default)")
    parser.add_argument("--pin", action="store_true",
                        help="server on the last CPU (from its start); load generator and sink on the others")
    parser.add_argument("--only", help="run only scenarios whose name contains this")
    parser.add_argument("--no-k8s", action="store_true",
                        help="skip the k8s scenarios (they start etcd + kube-apiserver, and Slurm)")
    parser.add_argument("--no-slurm", action="store_true",
                        help="skip k8s + slurm + usage (it starts a Slurm cluster: root, tests/harness/slurm/setup.sh)")
    parser.add_argument("--otelcol", type=Path, help="the otelcol binary (default: tests/harness/otelcol/build.sh's)")
    parser.add_argument("--python-sink", action="store_true", help="bench/sink.py as the backend (default: otelcol)")
    parser.add_argument("--verbose", action="store_true", help="let the servers' stderr through")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="run gputally under cProfile (figures then not comparable), one DIR/SCENARIO.prof each, "
                             "and print each profile's top functions")
    parser.add_argument("--profile-top", type=int, default=15, help="functions printed per profile")
    args = parser.parse_args()
    args.otelcol = args.otelcol or find_otelcol()
    skipped = {*(ATTRIBUTED if args.no_k8s else ()), *((SLURM,) if args.no_slurm else ())}
    scenarios = [s for s in SCENARIOS if (not args.only or args.only in s) and s not in skipped]
    version = subprocess.run([str(args.otelcol), "--version"], capture_output=True, text=True).stdout.strip()

    ctx = Context()
    ctx.grpc_implementation = args.grpc_implementation
    print(f"request: {ctx.points} points, {len(ctx.payload)} bytes; {args.in_flight} in flight; {os.cpu_count()} CPUs; "
          f"{args.seconds:.0f} s per run; {args.rounds} round(s), servers alternating; {version}"
          + (f"; offered {args.rate:,.0f} requests/s" if args.rate else "; closed loop (as fast as answered)")
          + ("; server pinned to its own CPU" if args.pin else ""))
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        for scenario, setup in ((K8S, setup_k8s), (SLURM, setup_slurm)):
            if scenario in scenarios:
                setup(ctx, stack, Path(tmp))
                check_points(ctx, scenario)
                run("gputally", scenario, args, ctx, learn=True)
                print(ctx.notes[scenario], flush=True)
        for round_ in range(args.rounds):
            for scenario in scenarios:
                # gputally first in even rounds, otelcol first in odd ones
                order = SERVERS if round_ % 2 == 0 else SERVERS[::-1]
                for server in order:
                    r = run(server, scenario, args, ctx)
                    print(f"  round {round_ + 1} {server:8} {scenario:28} {r['points_per_cpu_s']:>9,.0f} pts/CPU-s "
                          f"{r['points_per_s'] / ctx.points:6,.0f} req/s {r['switches_per_request']:5.1f} cs/req "
                          f"p50 {r['p50_ms']:6.2f} p99 {r['p99_ms']:6.2f} ms RSS {r['rss_mib']:6.1f} MiB "
                          f"lost {r['lost']} refused {r['refused']}", flush=True)
                    results.setdefault((server, scenario), []).append(r)
    report(scenarios, results, args, ctx)


def check_points(ctx: Context, scenario: str) -> None:
    """An attributed scenario's request has the same points as the others'."""
    from gputally.otlp.census import census_metrics

    payload = ctx.payload_of(scenario)
    sample = payload() if callable(payload) else payload
    assert census_metrics(sample).items == ctx.points, scenario


def report(scenarios: list[str], results: dict[tuple[str, str], list[dict[str, Any]]], args: argparse.Namespace,
           ctx: Context) -> None:
    """The table: each server's best round (and the median of its rounds' pts/CPU-s)."""
    print("best round per server; pts/CPU-s: points per second of server CPU (user+sys, all threads, reaped "
          "children); ratio = gputally / otelcol, best vs best (median vs median in brackets); p50, p99: the "
          "medians of the rounds' (one slow round does not stand for the server); refused: requests "
          "answered 429 / RESOURCE_EXHAUSTED or 503 / UNAVAILABLE (queue full), sent again; cs/req: context "
          "switches of all the server's threads per request")
    print(f"{'scenario':28} {'gputally':>9} {'otelcol':>9} {'ratio':>6} {'(median)':>8} {'p50 ms g/o':>13} "
          f"{'p99 ms g/o':>13} {'RSS MiB g/o':>13} {'lost g/o':>9} {'refused g/o':>11} {'cs/req g/o':>11}")
    for scenario in scenarios:
        runs = {server: results[(server, scenario)] for server in SERVERS}
        g, o = (max(runs[server], key=lambda r: r["points_per_cpu_s"]) for server in SERVERS)
        gm, om = (statistics.median(r["points_per_cpu_s"] for r in runs[server]) for server in SERVERS)
        p50 = {server: statistics.median(r["p50_ms"] for r in runs[server]) for server in SERVERS}
        p99 = {server: statistics.median(r["p99_ms"] for r in runs[server]) for server in SERVERS}
        print(f"{scenario:28} {g['points_per_cpu_s']:>9,.0f} {o['points_per_cpu_s']:>9,.0f} "
              f"{g['points_per_cpu_s'] / o['points_per_cpu_s']:>5.2f}x {f'({gm / om:.2f}x)':>8} "
              f"{p50['gputally']:>6.2f}/{p50['otelcol']:<6.2f} {p99['gputally']:>6.2f}/{p99['otelcol']:<6.2f} "
              f"{g['rss_mib']:>6.1f}/{o['rss_mib']:<6.1f} {g['lost']:>4}/{o['lost']:<4} {g['refused']:>5}/{o['refused']:<5} "
              f"{g['switches_per_request']:>5.1f}/{o['switches_per_request']:<5.1f}")
    for scenario in scenarios:
        if scenario in ctx.notes:
            print(ctx.notes[scenario])
    print("sink: " + ("bench/sink.py" if args.python_sink else "the same otelcol binary (OTLP/gRPC in, debug exporter), "
                      "sharing a CPU with the load generator"))
    if args.profile:
        import pstats

        for prof in sorted(args.profile.glob("*.prof")):
            print(f"--- {prof}: gputally's main thread, by own time")
            pstats.Stats(str(prof)).sort_stats("tottime").print_stats(args.profile_top)


if __name__ == "__main__":
    main()

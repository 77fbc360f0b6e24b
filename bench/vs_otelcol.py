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
  forward over OTLP/HTTP     the forward scenario with the load sent as OTLP/HTTP protobuf

The sink is the same otelcol binary (a Go backend that keeps up; ``--python-sink`` for
bench/sink.py, which, pinned beside the load generator, falls behind otelcol and lets its
queue fill until it refuses). "pts/CPU-s" is points per second of server CPU (user + system,
all threads, psutil for both processes): the per-core figure. With ``--pin`` the server is started on the last CPU (so
the Go runtime sizes GOMAXPROCS to 1) and the load generator and sink run on the others.

    .venv/bin/python bench/vs_otelcol.py [--seconds 8] [--rounds 2] [--pin] [--only k8s] [--no-k8s]
                                         [--profile DIR]   (gputally under cProfile: where the time goes)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
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
FORWARD, RESOURCE, POINT, K8S, HTTP = (
    "forward (no processor)", "resource attribute insert", "attribute on every point", "k8s (node mode)",
    "forward over OTLP/HTTP")
SCENARIOS = [FORWARD, RESOURCE, POINT, K8S, HTTP]
CLUSTER = ("k8s.cluster.name", "bench")


class Context:
    """What the scenarios share: payloads, the k8s fixtures, what k8s was seen to add."""

    def __init__(self) -> None:
        from gputally.otlp.census import census_metrics

        self.payload = gpu_node_request().SerializeToString()
        self.points = census_metrics(self.payload).items
        self.k8s_payload: bytes | None = None
        self.kubeconfig: Path | None = None
        self.socket: Path | None = None
        self.k8s_added: list[tuple[str, Any]] | None = None  # what otelcol's resource inserts in the k8s scenario
        self.k8s_note = ""


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
    if scenario == K8S:
        if server == "gputally":
            from k8s_throughput import NODE

            return {"k8s": {"mode": "node", "node_name": NODE, "kubeconfig": str(ctx.kubeconfig),
                            "pod_resources": {"socket": str(ctx.socket)}, "extract": {"labels": ["app"]}}}
        assert ctx.k8s_added is not None, "run(learn=True) says what k8s adds"
        return {"resource/k8s": {"attributes": [
            {"key": k, "value": v, "action": "insert"} for k, v in ctx.k8s_added]}}
    return {}


def config(server: str, scenario: str, ports: dict[str, int], ctx: Context) -> dict[str, Any]:
    procs = processors(server, scenario, ctx)
    receiver: dict[str, Any] = {"grpc": {"endpoint": f"127.0.0.1:{ports['grpc']}"}}
    if scenario == HTTP:
        receiver = {"http": {"endpoint": f"127.0.0.1:{ports['http']}"}}
    if server == "gputally":
        telemetry: dict[str, Any] = {"metrics": {"address": f"127.0.0.1:{ports['admin']}" if scenario == K8S else None}}
    else:
        telemetry = {"metrics": {"level": "none"}, "logs": {"level": "warn"}}
    return {
        "receivers": {"otlp": {"protocols": receiver}},
        "processors": procs,
        "exporters": {"otlp": {"endpoint": f"127.0.0.1:{ports['sink']}", "tls": {"insecure": True},
                               "compression": "none", "sending_queue": {"num_consumers": 8, "queue_size": 5000}}},
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": list(procs), "exporters": ["otlp"]}},
            "telemetry": telemetry,
        },
    }


REFUSAL_PAUSE = 0.005
"""Seconds a sender waits after a refusal (429 / RESOURCE_EXHAUSTED: the server's queue is full)."""


class Load:
    """Send ``payload`` for ``seconds`` with ``in_flight`` calls outstanding over OTLP/gRPC or
    OTLP/HTTP (protobuf). A refusal is counted, paused for and sent again, as a sender would:
    ``sent`` counts accepted requests only, ``latencies`` are theirs."""

    def __init__(self) -> None:
        self.sent = 0
        self.refused = 0
        self.latencies: list[float] = []

    async def grpc(self, port: int, payload: bytes, seconds: float, in_flight: int) -> Load:
        import grpc

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(METHOD)

            async def one() -> bool:
                try:
                    await call(payload, timeout=10)
                except grpc.aio.AioRpcError as error:
                    if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        raise
                    return False
                return True

            await self._workers(one, seconds, in_flight)
        return self

    async def http(self, port: int, payload: bytes, seconds: float, in_flight: int) -> Load:
        import aiohttp

        url = f"http://127.0.0.1:{port}/v1/metrics"
        headers = {"Content-Type": "application/x-protobuf"}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=in_flight)) as session:

            async def one() -> bool:
                async with session.post(url, data=payload, headers=headers) as response:
                    await response.read()
                    if response.status not in (200, 429, 503):
                        raise RuntimeError(f"HTTP {response.status} from {url}")
                    return response.status == 200

            await self._workers(one, seconds, in_flight)
        return self

    async def _workers(self, one: Callable[[], Awaitable[bool]], seconds: float, in_flight: int) -> None:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
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
    ``keep_first``: bench/sink.py instead, keeping the first request's bytes there."""

    def __init__(self, args: argparse.Namespace, port: int, cpus: list[int], tmp: Path,
                 keep_first: Path | None = None) -> None:
        self.report = tmp / "sink.json"
        if keep_first or args.python_sink:
            self.url = ""
            self.proc = spawn([sys.executable, str(SINK), "--port", str(port), "--report", str(self.report),
                               *(["--keep-first", str(keep_first)] if keep_first else [])], cpus,
                              stdout=subprocess.PIPE)
            assert self.proc.stdout is not None
            self.proc.stdout.readline()
            return
        metrics_port = free_port()
        self.url = f"http://127.0.0.1:{metrics_port}/metrics"
        path = tmp / "sink.yaml"
        path.write_text(json.dumps({
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}",
                                                          "max_recv_msg_size_mib": 64}}}},
            "exporters": {"debug": {"verbosity": "basic"}},
            "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["debug"]}},
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

    def stop(self) -> int:
        received = self.points()
        self.proc.terminate()
        self.proc.wait(30)
        return self.points() if not self.url else received


def run(server: str, scenario: str, args: argparse.Namespace, ctx: Context, *, learn: bool = False) -> dict[str, Any]:
    """One fresh server and sink, warmed for 1 s, then ``args.seconds`` of load; ``learn``: gputally's k8s
    with bench/sink.py keeping its first request, from which learn_k8s counts what k8s adds."""
    ports = {name: free_port() for name in ("grpc", "http", "sink", "admin")}
    payload = ctx.k8s_payload if scenario == K8S else ctx.payload
    assert payload is not None
    points = ctx.points
    cpus = list(range(os.cpu_count() or 1))
    server_cpus, other_cpus = (cpus[-1:], cpus[:-1] or cpus) if args.pin else (cpus, cpus)
    with tempfile.TemporaryDirectory() as tmp:
        path, first = Path(tmp) / "config.yaml", Path(tmp) / "first.bin"
        path.write_text(json.dumps(config(server, scenario, ports, ctx)))  # JSON is YAML
        sink = Sink(args, ports["sink"], other_cpus, Path(tmp), keep_first=first if learn else None)
        command = ([str(Path(sys.executable).parent / "gputally"), "serve", "--config", str(path)]
                   if server == "gputally" else [str(args.otelcol), "--config", str(path)])
        if args.profile and server == "gputally" and not learn:  # cProfile of the main thread (the event loop)
            args.profile.mkdir(parents=True, exist_ok=True)
            out = args.profile / (scenario.split(" (")[0].replace(" ", "-").replace("/", "") + ".prof")
            command = [sys.executable, "-m", "cProfile", "-o", str(out), *command]
        # Pinned from the start, so Go's runtime sees one CPU (GOMAXPROCS=1), as Python's one core.
        proc = spawn(command, server_cpus, stderr=None if args.verbose else subprocess.DEVNULL)
        if args.pin:
            psutil.Process().cpu_affinity(other_cpus)

        def send(seconds: float) -> Load:
            if scenario == HTTP:
                return asyncio.run(Load().http(ports["http"], payload, seconds, args.in_flight))
            return asyncio.run(Load().grpc(ports["grpc"], payload, seconds, args.in_flight))

        try:
            wait_port(ports["http" if scenario == HTTP else "grpc"], 30)
            if scenario == K8S and server == "gputally":
                from gpu_node_request import GPUS
                from k8s_setup import wait_metric

                wait_metric(ports["admin"], "gputally_k8s_synced", lambda v: v == 1, 60)
                wait_metric(ports["admin"], "gputally_k8s_device_allocations", lambda v: v >= GPUS, 60)
            ps = psutil.Process(proc.pid)
            warm = send(0.2 if learn else 1.0).sent
            sink.wait(warm * points)
            if learn:
                learn_k8s(ctx, payload, first.read_bytes())
                return {}
            cpu0 = sum(ps.cpu_times()[:2])
            t0 = time.perf_counter()
            measured = send(args.seconds)
            sent, latencies = measured.sent, measured.latencies
            wall = time.perf_counter() - t0
            rss = ps.memory_info().rss
            sink.wait((warm + sent) * points)
            delivered_wall = time.perf_counter() - t0
            cpu = sum(ps.cpu_times()[:2]) - cpu0
        finally:
            proc.terminate()
            proc.wait(30)
            received = sink.stop()
    latencies.sort()
    return {
        "points_per_s": sent * points / wall,
        "delivered_per_s": sent * points / delivered_wall,
        "points_per_cpu_s": sent * points / cpu if cpu else float("nan"),
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[max(int(len(latencies) * 0.99) - 1, 0)] * 1e3,
        "rss_mib": rss / 2**20,
        "lost": (warm + sent) * points - received,
        "refused": measured.refused,
    }


def _value(kv: Any) -> Any:
    kind = kv.value.WhichOneof("value")
    return getattr(kv.value, kind) if kind in ("string_value", "int_value", "double_value", "bool_value") else str(kv.value)


def learn_k8s(ctx: Context, sent: bytes, delivered: bytes) -> None:
    """Count the resource attributes gputally's k8s processor added (delivered minus sent), per
    resource; otelcol's ``resource`` then inserts the rounded mean number of them on every resource,
    the keys and values of the most attributed resource (the same total number of attributes)."""
    before = ExportMetricsServiceRequest.FromString(sent)
    after = ExportMetricsServiceRequest.FromString(delivered)

    def identity(rm: Any) -> tuple[Any, ...]:
        return tuple(sorted((kv.key, _value(kv)) for kv in rm.resource.attributes if kv.key in ("hw.id", "process.pid")))

    keys = {identity(rm): {kv.key for kv in rm.resource.attributes} for rm in before.resource_metrics}
    added = [[(kv.key, _value(kv)) for kv in rm.resource.attributes if kv.key not in keys[identity(rm)]]
             for rm in after.resource_metrics]
    counts = [len(a) for a in added]
    mean = statistics.mean(counts)
    richest = max(added, key=len)
    n = round(mean)
    ctx.k8s_added = richest[:n] + [(f"k8s.bench.pad_{i}", "x" * 16) for i in range(n - len(richest))]
    ctx.k8s_note = (f"k8s added {sum(counts)} attributes to {len(counts)} resources per request ({mean:.1f} per "
                    f"resource on average, {min(counts)}-{max(counts)}); otelcol's resource processor inserts "
                    f"{n} on every resource: {', '.join(k for k, _ in ctx.k8s_added)}")


def setup_k8s(ctx: Context, stack: list[Callable[[], None]], tmp: Path) -> None:
    """The attributed node of bench/k8s_throughput.py: 10 pods in a real API server, 8 GPUs in PodResources."""
    from gpu_node_request import GPUS
    from k8s_setup import FakeKubelet, cluster
    from k8s_throughput import node_request, setup_pods

    control_plane = cluster()
    stack.append(control_plane.stop)
    ns, pods = setup_pods(control_plane.admin_client(), 10)
    ctx.socket = tmp / "kubelet.sock"
    kubelet = FakeKubelet(ctx.socket, [
        (ns, pods[g]["name"], "main", f"GPU-1e061ec2-3930-fe87-1e34-cb91101c1b{g:02d}") for g in range(GPUS)])
    stack.append(kubelet.stop)
    ctx.kubeconfig = control_plane.limited_kubeconfig
    ctx.k8s_payload = node_request([(p["uid"], p["cid"]) for p in pods]).SerializeToString()


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
    parser.add_argument("--pin", action="store_true",
                        help="server on the last CPU (from its start); load generator and sink on the others")
    parser.add_argument("--only", help="run only scenarios whose name contains this")
    parser.add_argument("--no-k8s", action="store_true", help="skip the k8s scenario (it starts etcd + kube-apiserver)")
    parser.add_argument("--otelcol", type=Path, help="the otelcol binary (default: tests/harness/otelcol/build.sh's)")
    parser.add_argument("--python-sink", action="store_true", help="bench/sink.py as the backend (default: otelcol)")
    parser.add_argument("--verbose", action="store_true", help="let the servers' stderr through")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="run gputally under cProfile (figures then not comparable), one DIR/SCENARIO.prof each, "
                             "and print each profile's top functions")
    parser.add_argument("--profile-top", type=int, default=15, help="functions printed per profile")
    args = parser.parse_args()
    args.otelcol = args.otelcol or find_otelcol()
    scenarios = [s for s in SCENARIOS if (not args.only or args.only in s) and not (args.no_k8s and s == K8S)]
    version = subprocess.run([str(args.otelcol), "--version"], capture_output=True, text=True).stdout.strip()

    from gputally.otlp.census import census_metrics

    ctx = Context()
    print(f"request: {ctx.points} points, {len(ctx.payload)} bytes; {args.in_flight} in flight; {os.cpu_count()} CPUs; "
          f"{args.seconds:.0f} s per run; best of {args.rounds} round(s), servers alternating; {version}"
          + ("; server pinned to its own CPU" if args.pin else ""))
    best: dict[tuple[str, str], dict[str, Any]] = {}
    stack: list[Callable[[], None]] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if K8S in scenarios:
                setup_k8s(ctx, stack, Path(tmp))
                assert census_metrics(ctx.k8s_payload).items == ctx.points  # type: ignore[arg-type]
                run("gputally", K8S, args, ctx, learn=True)
                print(ctx.k8s_note, flush=True)
            for round_ in range(args.rounds):
                for scenario in scenarios:
                    # gputally first in even rounds, otelcol first in odd ones
                    order = SERVERS if round_ % 2 == 0 else SERVERS[::-1]
                    for server in order:
                        r = run(server, scenario, args, ctx)
                        print(f"  round {round_ + 1} {server:8} {scenario:28} {r['points_per_cpu_s']:>9,.0f} pts/CPU-s "
                              f"p50 {r['p50_ms']:6.2f} p99 {r['p99_ms']:6.2f} ms RSS {r['rss_mib']:6.1f} MiB "
                              f"lost {r['lost']} refused {r['refused']}", flush=True)
                        key = (server, scenario)
                        if key not in best or r["points_per_cpu_s"] > best[key]["points_per_cpu_s"]:
                            best[key] = r
        finally:
            for stop in reversed(stack):
                stop()
    print("best round per server; pts/CPU-s: points per second of server CPU (user+sys, all threads); "
          "ratio = gputally / otelcol; refused: requests answered 429 / RESOURCE_EXHAUSTED (queue full), sent again")
    print(f"{'scenario':28} {'gputally':>9} {'otelcol':>9} {'ratio':>6} {'p50 ms g/o':>13} {'p99 ms g/o':>13} "
          f"{'RSS MiB g/o':>13} {'lost g/o':>9} {'refused g/o':>11}")
    for scenario in scenarios:
        g, o = best[("gputally", scenario)], best[("otelcol", scenario)]
        print(f"{scenario:28} {g['points_per_cpu_s']:>9,.0f} {o['points_per_cpu_s']:>9,.0f} "
              f"{g['points_per_cpu_s'] / o['points_per_cpu_s']:>5.2f}x "
              f"{g['p50_ms']:>6.2f}/{o['p50_ms']:<6.2f} {g['p99_ms']:>6.2f}/{o['p99_ms']:<6.2f} "
              f"{g['rss_mib']:>6.1f}/{o['rss_mib']:<6.1f} {g['lost']:>4}/{o['lost']:<4} {g['refused']:>5}/{o['refused']:<5}")
    if ctx.k8s_note:
        print(ctx.k8s_note)
    print("sink: " + ("bench/sink.py" if args.python_sink else "the same otelcol binary (OTLP/gRPC in, debug exporter), "
                      "sharing a CPU with the load generator"))
    if args.profile:
        import pstats

        for prof in sorted(args.profile.glob("*.prof")):
            print(f"--- {prof}: gputally's main thread, by own time")
            pstats.Stats(str(prof)).sort_stats("tottime").print_stats(args.profile_top)


if __name__ == "__main__":
    main()
